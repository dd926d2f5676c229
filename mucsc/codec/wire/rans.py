"""Static rANS coding of cluster IDs (spec/FORMAT.md 4.4, section ``IDSA``, format 1.1).

IDs are coded with one frequency table (normalised to 2^S, stored in the section) by W interleaved
rANS streams: lane j codes the IDs j, j + W, j + 2W, ...  The coder is the byte-wise rANS of Duda
(2013) as in F. Giesen's ``rans_byte.h``: 32-bit state in [2^23, 2^31), one byte out per
renormalisation step, the encoder runs backwards and flushes its final state first, so the decoder
reads each lane forward.  Near the order-0 entropy at every rate (zstd on packed IDs is not, below
~1.5 bits per ID).

Layout of the section payload::

    u8  S                 scale bits, 1..22: frequencies sum to M = 2^S
    u8  W                 lanes, 1..64
    k   LEB128 varints    f_0 .. f_{k-1} (k = header "centroids"), sum M, f_s <= M
    W   u32 LE            byte length of each lane's stream
    ... lane streams, concatenated in lane order

The numpy code here is the reference (vectorised across lanes); ``_kernels.c`` has a compiled twin
producing identical bytes.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from mucsc.codec import kernels
from mucsc.errors import FormatError

__all__ = ["encode", "decode", "Lanes", "min_code_bits", "normalize", "lanes_for", "coded_size_bits", "estimated_size",
           "expected_size"]

RANS_L = 1 << 23  # lower bound of the normalised state
MAX_SCALE_BITS = 22
MAX_LANES = 64
SHORT_TABLE = 32  # frequency tables up to this many entries are read by a Python loop
LANE_ELEMENTS = 1 << 14  # the reference encoder uses one lane per this many IDs (at most MAX_LANES)


def lanes_for(n: int) -> int:
    """Lanes the reference encoder uses for n IDs: more lanes vectorise better, each costs 8 bytes."""
    return int(min(MAX_LANES, max(1, n // LANE_ELEMENTS)))


def lanes_for_each(n: np.ndarray) -> np.ndarray:
    """:func:`lanes_for` of each of ``n`` (whole numbers as float64; a size model sizing many
    tables at once), as float64."""
    return np.clip(np.floor_divide(n, LANE_ELEMENTS), 1, MAX_LANES)


SMALL_ALPHABET, SMALL_SCALE_BITS = 1 << 12, 16  # up to this many used symbols, this many scale bits


def scale_bits_for(used: int) -> int:
    """Scale bits of the reference encoder: 16 unless more than 2^12 symbols are used."""
    return SMALL_SCALE_BITS if used <= SMALL_ALPHABET else MAX_SCALE_BITS


def scale_bits_for_each(used: np.ndarray) -> np.ndarray:
    """:func:`scale_bits_for` of each of ``used``, as float64."""
    return np.where(used <= SMALL_ALPHABET, float(SMALL_SCALE_BITS), float(MAX_SCALE_BITS))


def normalize(counts: np.ndarray, scale_bits: int) -> np.ndarray:
    """Frequencies summing to 2^scale_bits, >= 1 for every used symbol, close to counts * M / n.

    Deterministic: proportional rounding, then the difference taken from / given to the largest
    frequencies (ties by symbol index)."""
    counts = np.asarray(counts, np.int64)
    M = 1 << scale_bits
    normalize = kernels.compiled("normalize")
    if normalize is not None and counts.ndim == 1 and 0 <= scale_bits <= 30:  # the same table, compiled
        f = np.empty(counts.size, np.int64)
        got = normalize(np.ascontiguousarray(counts), scale_bits, f)
        if got == 0:
            return f
        if got == -1:
            raise ValueError(f"{int(np.count_nonzero(counts > 0))} symbols do not fit a table of {M}")
    n = int(counts.sum())
    used = counts > 0
    if int(np.count_nonzero(used)) > M:
        raise ValueError(f"{int(np.count_nonzero(used))} symbols do not fit a table of {M}")
    if n:  # an unused symbol's (0 M + n // 2) // n is 0; a used one's at least 1
        f = np.maximum((counts * M + n // 2) // n, used)
    else:
        f = np.zeros(counts.size, np.int64)
    diff = M - int(f.sum())
    if diff == 0:
        return f
    # on Python ints (a table of ~256 entries: numpy's per-element cost would dominate)
    order = np.argsort(-f, kind="stable").tolist()  # largest first, then lower index
    fl = f.tolist()
    i = 0
    while diff != 0:
        s = order[i % len(order)]
        if diff > 0:
            step = diff if i < len(order) else 1
            fl[s] += step
            diff -= step
        elif fl[s] > 1:
            take = min(-diff, fl[s] - 1)
            fl[s] -= take
            diff += take
        i += 1
    return np.array(fl, np.int64)


def coded_size_bits(counts: np.ndarray) -> float:
    """sum -n_s log2(n_s / n): what the IDs cost at their order-0 entropy (a lower bound)."""
    c = np.asarray(counts, np.float64)
    c = c[c > 0]
    n = c.sum()
    return float(-(c * np.log2(c / n)).sum()) if n else 0.0


def estimated_size(ids: np.ndarray, k: int) -> int:
    """The IDSA payload size :func:`encode` would give, without coding: the exact table and lane
    headers plus the ideal code length of the normalised frequencies, sum n_s (S - log2 f_s) bits,
    and one byte per lane (what byte-wise renormalisation typically adds).  Rate control chooses with
    it (the same on every backend) and then checks the exact size of what it chose."""
    ids = np.asarray(ids).reshape(-1)
    n = ids.size
    counts = np.bincount(ids, minlength=k) if n else np.zeros(k, np.int64)
    S = scale_bits_for(int((counts > 0).sum()))
    W = lanes_for(n)
    f = normalize(counts, S) if n else np.zeros(k, np.int64)
    if not n:
        f[0] = 1 << S
    used = counts > 0
    bits = kernels.dot(counts[used], S - np.log2(f[used]))
    return 2 + len(_varints(f)) + 8 * W + int(np.ceil(bits / 8)) + W


def expected_size(counts: np.ndarray, n: int) -> int:
    """:func:`estimated_size` of ``n`` IDs from their *expected* counts (floats, summing to about
    ``n``), vectorised: the table from the proportional frequencies before :func:`normalize`'s last
    adjustment (within a few bytes of it).  Rate control's model of an rANS-coded level set."""
    c = np.asarray(counts, np.float64)
    c = c[c > 0]
    S = scale_bits_for(c.size)
    W = lanes_for(n)
    total = float(c.sum())
    if total <= 0:
        return 2 + 1 + 9 * W
    f = np.maximum(1.0, np.rint(c * ((1 << S) / total)))
    bits = kernels.dot(c, S - np.log2(f))
    table = int(np.sum(1 + (f >= 1 << 7) + (f >= 1 << 14) + (f >= 1 << 21)))  # LEB128 bytes of each f
    return 2 + table + (counts.size - c.size) + 8 * W + int(np.ceil(bits / 8)) + W


def _varints(values: np.ndarray) -> bytes:
    """LEB128 varints of non-negative integers (the frequency tables of IDSA and IDSL): one compiled
    call where built (the loop below costs ~60 us per 256-entry table, a fixed cost of every encode)."""
    varints = kernels.compiled("varints")
    if varints is not None:
        v = np.ascontiguousarray(values).astype(np.uint64, copy=False).reshape(-1)
        out = np.empty(10 * v.size, np.uint8)
        return out[: varints(v, out)].tobytes()
    out = bytearray()
    for v in values.tolist():
        while True:
            b = v & 0x7F
            v >>= 7
            if v:
                out.append(b | 0x80)
            else:
                out.append(b)
                break
    return bytes(out)


def _read_varints(buf: np.ndarray, pos: int, k: int, limit: int, tag: str = "IDSA") -> tuple[np.ndarray, int]:
    """k LEB128 varints from buf[pos:], each at most ``limit`` -> (values, the position after them).
    Short tables (a dithered context's few symbols) by the loop: its ~0.3 us per entry beat the
    vectorised read's ~10 us of numpy calls up to a few dozen entries."""
    fast = _short_varints(buf, pos, k, limit) if k > SHORT_TABLE else None
    if fast is not None:
        return fast
    # a valid entry (<= 2^22) has at most 4 bytes: read a window of 5 per entry, all of it only for a
    # table that runs past the window (padded entries: the loop then reads or rejects them as before)
    data = buf[pos: pos + 5 * k].tobytes()
    got = _varint_loop(data, k, limit, tag, pos + len(data) < buf.size)
    if got is None:
        got = _varint_loop(buf[pos:].tobytes(), k, limit, tag, False)
    vals, used = got
    return np.array(vals, np.int64), pos + used


def _varint_loop(data: bytes, k: int, limit: int, tag: str, more: bool) -> tuple[list[int], int] | None:
    """:func:`_read_varints`' loop over ``data`` -> (values, bytes read); None where it runs past
    ``data`` and ``more`` says the section goes on (the caller reads again from a longer window)."""
    vals = [0] * k
    pos = 0
    for i in range(k):
        v, shift = 0, 0
        while True:
            if pos >= len(data):
                if more:
                    return None
                raise FormatError(f"{tag}: frequency table runs past the end of the section")
            b = data[pos]  # indexed as Python ints: ~5x faster than numpy scalars
            pos += 1
            v |= (b & 0x7F) << shift
            if v > limit:
                raise FormatError(f"{tag}: frequency {v} exceeds the table size {limit}")
            if not b & 0x80:
                break
            shift += 7
        vals[i] = v
    return vals, pos


VALUES_CHUNK = 1 << 18  # IDs decoded per pass when take_values gathers them in numpy

def encode(ids: np.ndarray, k: int, lanes: int | None = None, scale_bits: int | None = None,
           counts: np.ndarray | None = None) -> bytes:
    """The IDSA payload for ``ids`` (values < k).  ``counts``: the occurrences of each id 0 .. k - 1
    where the caller has counted them already (trusted: they fix the table)."""
    ids = np.ascontiguousarray(ids).reshape(-1)
    n = ids.size
    if counts is None:
        counts = _counts(ids, k)
    elif len(counts) != k or int(np.sum(counts)) != n:
        raise ValueError(f"{len(counts)} counts adding up to {int(np.sum(counts))}, for {k} ids and {n} symbols")
    counts = np.asarray(counts, np.int64)
    if counts.size > k:
        raise ValueError("an id is out of range")
    S = scale_bits_for(int((counts > 0).sum())) if scale_bits is None else scale_bits
    W = lanes_for(n) if lanes is None else lanes
    f = normalize(counts, S) if n else np.zeros(k, np.int64)
    if not n:  # empty: a valid table is still required; put all mass on symbol 0
        f[0] = 1 << S
    cum = np.concatenate(([0], np.cumsum(f)[:-1]))
    rans_encode = kernels.compiled("rans_encode")
    if rans_encode is not None:
        T = -(-n // W) if n else 0
        cap = 4 + 3 * T
        out = np.empty(W * cap, np.uint8)
        lens = np.zeros(W, np.int64)
        narrow = ids if ids.dtype in (np.uint8, np.uint16, np.uint32) else ids.astype(np.uint32)
        if rans_encode(narrow, f.astype(np.uint32), cum.astype(np.uint32), S, W, out, lens) != 0:
            raise RuntimeError("rans_encode: a lane overflowed its buffer")  # cannot happen (cap bound)
        streams = [out[(j + 1) * cap - int(lens[j]): (j + 1) * cap].tobytes() for j in range(W)]
    else:
        streams = _encode_lanes(ids, f, cum, S, W)
    lengths = np.array([len(s) for s in streams], "<u4")
    return bytes([S, W]) + _varints(f) + lengths.tobytes() + b"".join(streams)


def _counts(ids: np.ndarray, k: int) -> np.ndarray:
    """Occurrences of each id (at least k entries; more when an id is >= k): the compiled histogram
    for 1- and 2-byte ids (np.bincount first copies them to 8-byte integers: 8 bytes an element)."""
    symbol_counts = kernels.compiled("symbol_counts")
    if ids.dtype in (np.uint8, np.uint16) and symbol_counts is not None and ids.size:
        counts = np.zeros(256 if ids.dtype == np.uint8 else 65536, np.int64)
        symbol_counts(ids, counts)
        top = int(np.flatnonzero(counts)[-1]) + 1
        return counts[: max(k, top)]
    return np.bincount(ids, minlength=k) if ids.size else np.zeros(k, np.int64)


def encode_row(x: np.ndarray, fs: np.ndarray, cs: np.ndarray, act: np.ndarray, S: int, out: np.ndarray,
               ptr: np.ndarray) -> np.ndarray:
    """One symbol of each active lane (``act``), all lanes at once (numpy): the renormalisation bytes
    (while x >= xmax: x mod 256 to ``out[lane, ptr]``, x >>= 8), then the new states.  ``fs``, ``cs``:
    each lane's symbol frequency (non-zero: 1 for an idle lane) and cumulative frequency."""
    lane = np.arange(x.size)
    xmax = np.uint64((RANS_L >> S) << 8) * fs
    for _ in range(3):
        m = act & (x >= xmax)
        if not m.any():
            break
        out[lane[m], ptr[m]] = (x[m] & np.uint64(0xFF)).astype(np.uint8)
        ptr[m] += 1
        x[m] >>= np.uint64(8)
    nx = ((x // fs) << np.uint64(S)) + (x % fs) + cs
    return np.where(act, nx, x)


def _encode_lanes(ids, f, cum, S, W) -> list[bytes]:
    n = ids.size
    T = -(-n // W) if n else 0
    pad = np.zeros(T * W, np.int64)
    pad[:n] = ids
    rows = pad.reshape(T, W)
    x = np.full(W, RANS_L, np.uint64)
    cap = 4 + T * 3
    out = np.zeros((W, cap), np.uint8)
    ptr = np.zeros(W, np.int64)
    lane = np.arange(W)
    f64, c64 = f.astype(np.uint64), cum.astype(np.uint64)
    for t in range(T - 1, -1, -1):
        act = lane < n - t * W  # lanes holding an element in row t
        s = rows[t]
        x = encode_row(x, np.where(act, f64[s], np.uint64(1)), c64[s], act, S, out, ptr)
    for sh in (24, 16, 8, 0):  # flush: the decoder reads the state little-endian first
        out[lane, ptr] = ((x >> np.uint64(sh)) & np.uint64(0xFF)).astype(np.uint8)
        ptr += 1
    return [out[j, : ptr[j]][::-1].tobytes() for j in range(W)]


def _short_varints(buf: np.ndarray, pos: int, k: int, limit: int) -> tuple[np.ndarray, int] | None:
    """:func:`_read_varints` without a Python loop where every entry has at most 3 bytes, lies inside
    ``buf`` and is at most ``limit`` (a valid table: the loop would raise nothing and read the same
    values); None otherwise (the loop then reads it, raising what it raises).  ~1 us per entry less."""
    if k == 0:
        return np.zeros(0, np.int64), pos
    w = buf[pos: pos + 3 * k].astype(np.int64)
    last = np.flatnonzero(w < 0x80)[:k]  # the final byte of each entry
    if last.size < k:
        return None
    starts = np.concatenate(([0], last[:-1] + 1))
    if np.any(last - starts > 2):
        return None
    idx = np.arange(int(last[-1]) + 1)
    shift = 7 * (idx - np.repeat(starts, last - starts + 1))
    vals = np.add.reduceat((w[idx] & 0x7F) << shift, starts)
    if np.any(vals > limit):
        return None
    return vals, pos + int(last[-1]) + 1


def min_code_bits(f: np.ndarray, S: int) -> float:
    """A lower bound on the bits per ID of any IDSA lane with table ``f`` (sum 2^S), renormalisation
    slack included: log2(M / max f) - log2(1 + 2^(S - 23)), rounded down (FORMAT.md 4.4: a lane of
    T IDs needs 8 len > T b + 23).  At most 0 when one symbol holds (almost) all of M: then nothing
    bounds n by the stream's length (a constant vector)."""
    return _code_bits(int(np.max(f)) if f.size else 0, S)


def _code_bits(top: int, S: int) -> float:
    """:func:`min_code_bits` from the table's largest frequency ``top`` (0: an empty table)."""
    top = top or 1 << S
    return math.log2((1 << S) / top) - math.log2(1.0 + 2.0 ** (S - 23)) - 1e-9


def _table_sums(f: np.ndarray) -> tuple[int, int, np.ndarray]:
    """(sum, largest entry, exclusive prefix sums as int64) of a frequency table: a short one's as
    Python ints (each numpy call on it costs more than the loop)."""
    if f.size <= SHORT_TABLE:
        fl = f.tolist()
        return sum(fl), max(fl, default=0), np.array(list(itertools.accumulate(fl[:-1], initial=0)), np.int64)
    c = np.cumsum(f)
    return int(c[-1]), int(f.max()), np.concatenate(([0], c[:-1])).astype(np.int64)


def lane_ids(n: int, W: int) -> np.ndarray:
    """T_j = ceil((n - j) / W), the IDs lane j holds (int64, W of them)."""
    return np.maximum(0, (n - np.arange(W, dtype=np.int64) + W - 1) // W)


class Lanes:
    """An IDSA payload decoded a part at a time (:meth:`take`), in constant memory besides what each
    part returns: the header and table parsed and every length checked against n before any ID is
    decoded (:func:`decode` takes all n at once).  Validation as FORMAT.md 4.4; :meth:`finish`
    checks the final states once all n IDs have been taken."""

    def __init__(self, buf: bytes | memoryview, n: int | None, k: int, tag: str = "IDSA"):
        """Parse the header, the table and the lane lengths; with ``n``, check them against it
        (:meth:`expect`; a caller that learns n later calls it then, after :meth:`capacity`).
        The lanes' lengths and states are read as Python ints (a dithered group parses up to 64 of
        these payloads: numpy calls on W-entry arrays were most of its decode's time outside the
        kernel)."""
        b = np.frombuffer(buf, np.uint8)
        mv = memoryview(buf).cast("B")
        self.tag = tag
        if b.size < 2:
            raise FormatError(f"{tag}: section shorter than its 2-byte header")
        S, W = mv[0], mv[1]
        if not 1 <= S <= MAX_SCALE_BITS or not 1 <= W <= MAX_LANES:
            raise FormatError(f"{tag}: scale bits {S} or lanes {W} out of range")
        M = 1 << S
        f, pos = _read_varints(b, 2, k, M, tag)
        total, top, cum = _table_sums(f)
        if total != M:
            raise FormatError(f"{tag}: frequencies sum to {total}, expected {M}")
        if pos + 4 * W > b.size:
            raise FormatError(f"{tag}: lane lengths run past the end of the section")
        lengths = [int.from_bytes(mv[a: a + 4], "little") for a in range(pos, pos + 4 * W, 4)]
        pos += 4 * W
        if sum(lengths) != b.size - pos:
            raise FormatError(f"{tag}: lane streams take {sum(lengths)} bytes, the section has {b.size - pos}")
        if min(lengths) < 4:
            raise FormatError(f"{tag}: a lane stream has an impossible length")
        starts = list(itertools.accumulate(lengths[:-1], initial=pos))
        self.b, self.n, self.S, self.W = b, None, S, W
        self._lengths = lengths  # Python ints for the checks (expect, capacity)
        self.lengths = np.array(lengths, np.int64)
        self.f, self.cum = f, cum
        self.bits = _code_bits(top, S)
        self.ends = np.array([a + ln for a, ln in zip(starts, lengths)], np.int64)
        self.p = np.array([a + 4 for a in starts], np.int64)
        self.x = np.array([int.from_bytes(mv[a: a + 4], "little") for a in starts], np.uint32)
        self.done = 0
        self.keep_table = True  # keep the slot -> ID table between parts (2^(S+1) bytes; see table_bytes)
        self._tab: np.ndarray | None = None
        if n is not None:
            self.expect(n)

    def capacity(self) -> int | None:
        """The most IDs these lanes can code at this table's probabilities (FORMAT.md 4.4's lower
        length bound, summed over the lanes); None when the table bounds nothing (b <= 0)."""
        if self.bits <= 0:
            return None
        return sum(math.floor((8 * ln - 22) / self.bits) for ln in self._lengths)

    def expect(self, n: int) -> None:
        """Check the lanes against their count n (both length bounds of FORMAT.md 4.4)."""
        W = self.W
        T = [max(0, (n - j + W - 1) // W) for j in range(W)]  # lane_ids(n, W)
        if max(self._lengths) > 4 + 3 * T[0]:  # T[0]: the most any lane holds
            raise FormatError(f"{self.tag}: a lane stream has an impossible length")
        if self.bits > 0 and any(t * self.bits >= 8 * ln - 22 for t, ln in zip(T, self._lengths)):
            raise FormatError(f"{self.tag}: {n} IDs cannot be coded in {sum(self._lengths)} lane bytes with this "
                              f"table (at least {self.bits:.4f} bits each)")
        self.n = n

    def table_bytes(self) -> int:
        """Bytes of the slot -> ID table kept between parts (a caller holding many decoders at once
        may keep only some: ``keep_table = False`` builds it for each part instead)."""
        return 2 << self.S

    def _table(self) -> np.ndarray:
        """The slot -> ID table (uint16, 2^S entries), built once when kept."""
        if self._tab is not None:
            return self._tab
        tab = np.repeat(np.arange(self.f.size, dtype=np.uint16), self.f)
        if self.keep_table:
            self._tab = tab
        return tab

    def decoder(self) -> tuple:
        """(buf, f, cum, S, W, x, p, ends): this payload's decoder as the compiled kernels take it
        (``rans_decode_part``'s arguments but the slot table), with copies of the lanes' states and
        read positions for the kernel to advance; :meth:`resume` adopts them."""
        return (self.b, self.f.astype(np.uint32), self.cum.astype(np.uint32), self.S, self.W, self.x.copy(),
                self.p.copy(), self.ends)

    def resume(self, state: tuple, taken: int) -> None:
        """Adopt the states and positions of ``state`` (from :meth:`decoder`) after a kernel took
        ``taken`` more IDs (then :meth:`finish` checks them as after :meth:`take`)."""
        if self.n is None or taken < 0 or self.done + taken > self.n:
            raise ValueError(f"{self.tag}: {taken} more IDs taken of {self.n - self.done} left")
        self.x[:], self.p[:] = state[5], state[6]
        self.done += taken

    def take(self, m: int) -> np.ndarray:
        """The next ``m`` IDs (uint32)."""
        if self.n is None or m < 0 or self.done + m > self.n:
            raise ValueError(f"{self.tag}: {m} more IDs asked of {self.n - self.done} left")
        out = np.empty(m, np.uint32)
        if m == 0:
            return out
        decode_part = kernels.compiled("rans_decode_part")
        if decode_part is not None:
            err = decode_part(self.b, self.f.astype(np.uint32), self.cum.astype(np.uint32), self.S, self.W, self.x,
                              self.p, self.ends, self.done, out, self._table() if self.keep_table else None)
        else:
            err = self._take_numpy(out)
        if err:
            raise FormatError(f"{self.tag}: a lane stream ends early")
        self.done += m
        return out

    def take_values(self, table: np.ndarray, out: np.ndarray) -> None:
        """The next ``out.size`` IDs looked up in ``table`` (one entry per symbol) into ``out`` (of
        ``table``'s dtype): the compiled decoder writes each value as it decodes its ID, so there is
        no ID array and no second pass; else :meth:`take` a chunk at a time and a gather."""
        m = out.size
        decode_part = kernels.compiled("rans_decode_part")
        if (decode_part is not None and table.size == self.f.size
                and table.dtype.itemsize in (2, 4, 8) and out.dtype == table.dtype and out.flags.c_contiguous):
            if self.n is None or self.done + m > self.n:
                raise ValueError(f"{self.tag}: {m} more IDs asked of {(self.n or 0) - self.done} left")
            if m and decode_part(
                    self.b, self.f.astype(np.uint32), self.cum.astype(np.uint32), self.S, self.W, self.x, self.p,
                    self.ends, self.done, out, self._table() if self.keep_table else None,
                    np.ascontiguousarray(table)):
                raise FormatError(f"{self.tag}: a lane stream ends early")
            self.done += m
            return
        for a in range(0, m, VALUES_CHUNK):
            b = min(a + VALUES_CHUNK, m)
            np.take(table, self.take(b - a), out=out[a:b])

    def _take_numpy(self, out: np.ndarray) -> int:
        """:meth:`take` vectorised across the lanes, a row of W IDs at a time (the reference)."""
        S, W, m = self.S, self.W, out.size
        tab = self._table()
        f64, c64 = self.f.astype(np.uint64), self.cum.astype(np.uint64)
        mask, L = np.uint64((1 << S) - 1), np.uint64(RANS_L)
        x, p, b, ends = self.x.astype(np.uint64), self.p, self.b, self.ends
        first = self.done
        lane = np.arange(W)
        err = 0
        everyone = np.ones(W, bool)
        for r in range(first // W, (first + m - 1) // W + 1):
            at = r * W - first  # where lane 0's ID of this row goes in out
            act = everyone if 0 <= at and at + W <= m else (lane + at >= 0) & (lane + at < m)
            slot = (x & mask).astype(np.int64)
            s = tab[slot]
            nx = f64[s] * (x >> np.uint64(S)) + slot.astype(np.uint64) - c64[s]
            x = nx if act is everyone else np.where(act, nx, x)
            while True:  # renormalise while x < L (FORMAT.md 4.4), a byte at a time
                need = act & (x < L)
                if not need.any():
                    break
                if np.any(p[need] >= ends[need]):
                    err = 1
                    break
                x[need] = (x[need] << np.uint64(8)) | b[p[need]].astype(np.uint64)
                p[need] += 1
            if err:
                break
            if act is everyone:
                out[at: at + W] = s
            else:
                out[lane[act] + at] = s[act]
        self.x[:] = x.astype(np.uint32)
        return err

    def finish(self) -> None:
        """Check that every ID was taken and every lane ends in state L with no byte unread."""
        if (self.done != self.n or any(v != RANS_L for v in self.x.tolist())
                or self.p.tolist() != self.ends.tolist()):  # W <= 64 entries: Python beats numpy calls
            raise FormatError(f"{self.tag}: corrupt rANS stream (a lane does not end in its initial state)")


def decode(buf: bytes | memoryview, n: int, k: int) -> np.ndarray:
    """IDs from an IDSA payload (validated: table sums, lane lengths against n, final states, every
    byte used)."""
    lanes = Lanes(buf, n, k)
    out = lanes.take(n)
    lanes.finish()
    return out
