"""Lane-parallel static rANS of cluster IDs (spec/FORMAT.md 4.6, section ``IDSL``, format 1.2).

IDSA (format 1.1, :mod:`mucsc.codec.rans`) has at most 64 interleaved lanes: one core decodes it.
IDSL cuts the symbols into blocks of :data:`BLOCK` and codes each block by up to :data:`LANES`
interleaved lanes of its own, so a message of m symbols has about m / 2048 independent lanes: a GPU
runs one lane per thread (a block per warp), a CPU a run of blocks per core.  The layout is a function
of m only, so every backend writes the same bytes; the coder itself (state width, renormalisation,
byte order, frequency normalisation) is IDSA's.

Symbols: for k <= 256 IDs, the bytes of the LSB-first ``IDS_`` packing at ``w`` = 1, 2, 4 or 8 bits per
ID (8 / w IDs per byte symbol: two IDs per symbol for Z = 16, exactly as good as order-0 over IDs and
half the symbols); for more IDs, ``w`` = 16 and one symbol per ID.

Layout of the section payload::

    u8  S                  scale bits, 1..22: frequencies sum to M = 2^S
    u8  w                  1, 2, 4, 8: byte symbols (alphabet 256); 16: one symbol per ID (alphabet k)
    A   LEB128 varints     f_0 .. f_{A-1}, sum M, f_s <= M
    L   u16 LE             byte length of each lane's stream (blocks in order, lanes in order)
    ... lane streams, concatenated in the same order

The numpy code here is the reference (vectorised across all lanes of a run of blocks); ``_kernels.c``
has a compiled twin writing identical bytes; runs of :data:`RUN_BLOCKS` blocks go to
``parallel.current()`` threads (encode and decode alike).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from mucsc.codec import kernels, parallel
from mucsc.codec.wire import rans
from mucsc.errors import FormatError

__all__ = ["BLOCK", "LANES", "LANE_SYMBOLS", "Layout", "layout", "symbol_bits", "symbol_count", "symbols",
           "encode", "encode_symbols", "payload", "decode_symbols", "decode_values", "table", "header_size",
           "size_floor", "size_estimate", "estimate_slack", "entropy_floor"]

BLOCK = 1 << 16  # symbols per block
LANES = 32  # lanes of a full block (a GPU warp)
LANE_SYMBOLS = BLOCK // LANES  # a block has one lane per this many symbols (rounded up): lanes of <= 2048
BYTE_WIDTHS = (1, 2, 4, 8)
WIDE = 16  # symbol width value for one symbol per ID
RUN_BLOCKS = 8  # blocks per thread task (2^19 symbols)
# The numpy coders step all lanes of a task together, one symbol position per step (~20 numpy calls):
# their cost is mostly per step, so they take many blocks at once (4096 lanes, 25 MB of lane buffers;
# measured at d = 1e7, Z = 16: 8 blocks 27 MB/s encode, 64 blocks 65 MB/s, 128 blocks ~100 MB/s).
NUMPY_RUN_BLOCKS = 128
RANS_L = rans.RANS_L


def symbol_bits(k: int) -> int:
    """The reference encoder's ``w`` for k IDs: the narrowest of 1, 2, 4, 8 bits that holds every ID,
    16 (one symbol per ID) beyond 256."""
    if k <= 256:  # a table lookup (asked in every small encode)
        return _SYMBOL_BITS[k] if k >= 0 else BYTE_WIDTHS[0]
    return WIDE


# symbol_bits(k) for k = 0 .. 256: the narrowest byte width holding every ID
_SYMBOL_BITS = tuple(next(w for w in BYTE_WIDTHS if k <= 1 << w) for k in range(257))


def symbol_count(n: int, w: int) -> int:
    """Symbols of n IDs: ceil(n w / 8) byte symbols, or n."""
    return n if w == WIDE else (n * w + 7) // 8


def alphabet(k: int, w: int) -> int:
    return k if w == WIDE else 256


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where every lane of m symbols sits: block b holds symbols [b BLOCK, min((b+1) BLOCK, m)) and
    ``lanes[b]`` lanes; lane j of a block of s symbols starting at o codes symbols o + j, o + j + W, ...
    (``count`` of them).  Per-lane arrays in lane order (blocks in order, lanes in order)."""

    m: int
    lanes: np.ndarray  # per block
    first_lane: np.ndarray  # per block, and one past the last block: the lane index of its first lane
    base: np.ndarray  # per lane: its first symbol
    stride: np.ndarray  # per lane: its block's lane count W
    count: np.ndarray  # per lane: its symbols, ceil((s - j) / W) >= 1

    @property
    def blocks(self) -> int:
        return int(self.lanes.size)

    @property
    def total_lanes(self) -> int:
        return int(self.base.size)


def lanes_of(size: int) -> int:
    """Lanes of a block of ``size`` symbols: one per LANE_SYMBOLS (rounded up), at most LANES."""
    return min(LANES, -(-size // LANE_SYMBOLS))


def lane_total(m: int) -> int:
    """Lanes of m symbols in all (what :func:`layout` lays out, without its arrays)."""
    nb = -(-m // BLOCK)
    return 0 if nb == 0 else (nb - 1) * LANES + lanes_of(m - (nb - 1) * BLOCK)


@functools.lru_cache(maxsize=16)
def layout(m: int) -> Layout:
    """The lane layout of m symbols (FORMAT.md 4.6): a function of m only."""
    nb = -(-m // BLOCK)
    sizes = np.full(nb, BLOCK, np.int64)
    if nb:
        sizes[-1] = m - (nb - 1) * BLOCK
    lanes = np.minimum(LANES, -(-sizes // LANE_SYMBOLS))
    first = np.concatenate(([0], np.cumsum(lanes))).astype(np.int64)
    blk = np.repeat(np.arange(nb, dtype=np.int64), lanes)
    j = np.arange(first[-1], dtype=np.int64) - first[blk]
    W = lanes[blk]
    count = -(-(sizes[blk] - j) // W)
    out = Layout(m, lanes, first, blk * BLOCK + j, W, count)
    for a in (out.lanes, out.first_lane, out.base, out.stride, out.count):
        a.setflags(write=False)
    return out


def header_size(k: int, w: int, f: np.ndarray, m: int) -> int:
    """Bytes of the section before the lane streams."""
    return 2 + len(rans._varints(f)) + 2 * layout(m).total_lanes


def size_floor(counts: np.ndarray, m: int, tab: tuple[int, np.ndarray] | None = None) -> int:
    """A lower bound on the length of :func:`payload` for m symbols with histogram ``counts``, from
    the table alone (no coding): lets a caller that only wants the payload when it is short enough
    skip coding it.

    The header is exact; each lane's stream is bounded by the coder's information balance.  With
    Phi = 8 (bytes out) + log2(x): Phi starts at log2(RANS_L) = 23 and ends below 8 (bytes) - 1
    (the 4-byte flush holds x < 2^31); coding s raises it by at least log2(M / f_s) - delta
    (x' >= floor(x / f_s) M and x / f_s >= 2^(23 - S) after renormalisation) and each byte out lowers
    it by at most eps (a byte leaves only while x >= 2^(31 - S) f_s).  So a lane of n symbols writes
    at least (24 + sum log2(M / f_s) - n delta) / (8 + eps) bytes.  ``tab``: :func:`table` of these
    counts when the caller has it (it codes the payload with the same table when the floor allows)."""
    S, f = table(counts, m) if tab is None else tab
    ce = _table_bits(counts, S, f)
    if ce is None:
        return 0  # a used symbol without frequency: the coder refuses it; no bound
    delta = -math.log2(1.0 - 2.0 ** (S - 23))
    eps = -math.log2(1.0 - 255.0 * 2.0 ** (S - 31))
    lanes = layout(m).total_lanes
    streams = (24.0 * lanes + ce - m * delta) / (8.0 + eps)
    return header_size(0, 0, f, m) + max(0, math.floor(streams * (1.0 - 1e-9)) - 1)


def size_estimate(counts: np.ndarray, m: int, tab: tuple[int, np.ndarray]) -> float:
    """:func:`size_floor`'s information balance without its worst-case rounding terms: the header,
    and per lane (24 + sum log2(M / f_s)) / 8 bytes, i.e. 3 bytes of the 4-byte flush beyond the
    symbols' table bits.  Not a proven bound (the coder's per-symbol rounding could in principle
    gain up to delta bits each), but a tight one in practice: a lane's bytes beyond its table bits
    were 3.0-4.0 in every trial (the final state's top byte is never empty), and in 1,500 random
    histograms of 200-262,144 symbols the payload never fell below it (smallest excess 0.003 bytes).
    The encoder skips coding lanes that this, less :func:`estimate_slack`, already puts above zstd's
    frame: for Gaussian IDs at d = 1e5, Z = 16 the proven floor is ~150 bytes under the payload,
    below the frame, so the lanes were coded (~0.25 ms of a ~1.4 ms encode) only to lose by ~45
    bytes.  ``tab``: :func:`table` of ``counts``."""
    S, f = tab
    ce = _table_bits(counts, S, f)
    if ce is None:
        return 0.0
    return header_size(0, 0, f, m) + (24.0 * layout(m).total_lanes + ce) / 8.0


def estimate_slack(m: int) -> float:
    """How far below :func:`size_estimate` a payload of m symbols is allowed to be before skipping
    on it could change a byte: 2 bytes plus a quarter byte per lane (the estimate's excess over the
    real payload was never positive in the trials; this is the margin for what they did not see)."""
    return 2.0 + 0.25 * lane_total(m)


def _table_bits(counts: np.ndarray, S: int, f: np.ndarray) -> float | None:
    """sum over the used symbols of n_s log2(M / f_s) (M = 2^S), or None when a used symbol has no
    frequency.  These bounds only decide whether to code, never which bytes (with their margins):
    any libm will do, and numpy's pairwise sum (relative error ~1e-16 log2 A, far inside the
    margins; math.fsum over a list was ~8 us of 256 symbols)."""
    used = counts > 0
    fu = f[used]
    if fu.size and int(fu.min()) < 1:
        return None
    return float((counts[used] * (S - np.log2(fu.astype(np.float64)))).sum())


def entropy_floor(counts: np.ndarray, m: int, above: int | None = None, xlog: float | None = None) -> int:
    """A lower bound on :func:`size_floor` without the table (no normalisation, no varints): each
    lane's bound with the symbols' order-0 entropy m H in place of sum n_s log2(M / f_s) (which is
    never less: Gibbs' inequality, the f_s / M of used symbols summing to 1), and one byte per
    varint of the header.  ``counts``: the histogram of the m symbols.  A caller that only wants to
    know whether the payload could be short enough asks this first.  ``above``: only whether the
    bound exceeds it matters; the header's bytes alone are returned when they do (a small group's
    IDs: no pass over the histogram).  ``xlog``: sum c log2 c over ``counts`` when the caller has it
    (:func:`symbols_counted`), the same value :func:`_sum_xlog2x` gives.

    Every numpy call on the 256-entry histogram costs ~2-7 us inside an encode (measured at
    d = 1e4: its caches are cold after the rounding and zstd), so m H = m log2 m - sum c log2 c
    takes sum c log2 c from a table of c log2 c (:func:`_sum_xlog2x`: a lookup and a sum instead of
    a selection, a logarithm, a product and a sum)."""
    lanes = lane_total(m)
    header = 2 + counts.size + 2 * lanes
    if above is not None and header > above:
        return header
    if m == 0:
        return 0
    ce = m * math.log2(m) - (_sum_xlog2x(counts, m) if xlog is None else xlog)  # m H in bits, up to rounding
    # the scale bits of the alphabet's size: at least those of the symbols used (delta and eps grow
    # with S), counted only where that size would raise S (one symbol per ID, a wide alphabet)
    S = rans.scale_bits_for(counts.size)
    if S > 16:
        S = rans.scale_bits_for(int(np.count_nonzero(counts)))
    delta = -math.log2(1.0 - 2.0 ** (S - 23))
    eps = -math.log2(1.0 - 255.0 * 2.0 ** (S - 31))
    streams = (24.0 * lanes + ce * (1.0 - 1e-9) - m * delta) / (8.0 + eps)
    return header + max(0, math.floor(streams * (1.0 - 1e-9)) - 1)


def _sum_xlog2x(counts: np.ndarray, m: int) -> float:
    """sum c log2 c over the histogram ``counts`` of m symbols (every count <= m): from the table
    of :func:`_xlog2x` up to XLOG2X_MAX symbols, else computed over the used entries."""
    if m < XLOG2X_MAX:  # added in order (accumulate), as the compiled pack_counts adds them
        return float(np.add.accumulate(_xlog2x(m).take(counts))[-1])
    c = counts[counts > 0]
    return float((c * np.log2(c)).sum())


# The table's reach: 64 KiB, which stays in cache (a histogram of more symbols, ~2 us of numpy
# against a pass over the data, reads a few hundred entries of a larger table: cache misses)
XLOG2X_MAX = 1 << 13
_XLOG2X = np.zeros(1)


def _xlog2x(top: int) -> np.ndarray:
    """A table t[c] = c log2 c (t[0] = 0) covering 0..top (< XLOG2X_MAX): the one kept, grown to a
    power of two when a count exceeds it."""
    global _XLOG2X
    t = _XLOG2X
    if t.size <= top:
        c = np.arange(1 << max(12, top.bit_length()), dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            t = c * np.log2(c)
        t[0] = 0.0
        t.setflags(write=False)
        _XLOG2X = t
    return t


def symbols(ids: np.ndarray, k: int, w: int | None = None) -> np.ndarray:
    """The symbols of ``ids`` (host): the IDS_ packing's bytes at width w (1, 2, 4, 8), or the IDs as
    uint16 (w = 16)."""
    w = symbol_bits(k) if w is None else w
    if w == WIDE:
        return np.ascontiguousarray(ids, np.uint16)
    return parallel.pack_array(np.ascontiguousarray(ids), w)


def symbols_counted(ids: np.ndarray, k: int, w: int, xlog: bool = False) -> tuple:
    """(:func:`symbols`, :func:`counts_of` of them): byte symbols of uint8 IDs packed and counted in
    one pass by the compiled kernel where built (over the fixed chunks on ``parallel.current()``
    threads; every chunk but the last holds whole bytes), else the two steps.  ``xlog``: a third
    value, sum c log2 c over the counts (:func:`entropy_floor`'s ``xlog``), which the kernel of one
    chunk adds up as it counts (two numpy calls fewer, ~3-6 us of a 1e4-element encode)."""
    kernel = kernels.compiled("pack_counts")
    if not (kernel is not None and w in BYTE_WIDTHS and ids.dtype == np.uint8 and ids.ndim == 1):
        sym = symbols(ids, k, w)
        counts = counts_of(sym, alphabet(k, w))
        return (sym, counts, _sum_xlog2x(counts, sym.size)) if xlog else (sym, counts)
    ids = np.ascontiguousarray(ids)
    sym = np.empty(symbol_count(ids.size, w), np.uint8)
    if ids.size <= parallel.CHUNK:  # one chunk (every small group): the kernel called as it is
        counts = np.zeros(256, np.int64)
        if not xlog:
            kernel(ids, w, sym, counts)
            return sym, counts
        s = kernel(ids, w, sym, counts, _xlog2x(sym.size) if sym.size < XLOG2X_MAX else None)
        return sym, counts, (s if s is not None else _sum_xlog2x(counts, sym.size))

    def one(s: int, e: int) -> np.ndarray:
        c = np.zeros(256, np.int64)
        kernel(ids[s:e], w, sym[s * w // 8: (e * w + 7) // 8], c)
        return c
    parts = parallel.run_spans(one, ids.size)
    counts = parts[0] if len(parts) == 1 else np.sum(parts, axis=0)
    return (sym, counts, _sum_xlog2x(counts, sym.size)) if xlog else (sym, counts)


def table(counts: np.ndarray, m: int) -> tuple[int, np.ndarray]:
    """(S, frequencies) of the reference encoder for symbol ``counts``: IDSA's normalisation
    (``rans.normalize``) at IDSA's scale bits."""
    S = rans.scale_bits_for(int((counts > 0).sum()))
    return S, rans.normalize(counts, S)


def encode(ids: np.ndarray, k: int) -> bytes:
    """The IDSL payload of ``ids`` (values < k) with the reference encoder's choices."""
    w = symbol_bits(k)
    return encode_symbols(symbols(ids, k, w), w, alphabet(k, w))


def counts_of(sym: np.ndarray, size: int) -> np.ndarray:
    """The symbol histogram, over the fixed chunks on ``parallel.current()`` threads (the compiled
    counter where built: ``np.bincount`` converts every symbol to intp first)."""
    kernel = kernels.compiled("symbol_counts")

    def count(s: int, e: int) -> np.ndarray:
        if kernel is not None and sym.dtype in (np.uint8, np.uint16):
            c = np.zeros(256 if sym.dtype == np.uint8 else 65536, np.int64)
            kernel(sym[s:e], c)
            return c
        return np.bincount(sym[s:e], minlength=size)
    parts = parallel.run_spans(count, sym.size)
    c = parts[0] if len(parts) == 1 else np.sum(parts, axis=0)
    return c.astype(np.int64)[:size] if c.size >= size else np.pad(c, (0, size - c.size)).astype(np.int64)


def encode_symbols(sym: np.ndarray, w: int, size: int, counts: np.ndarray | None = None) -> bytes:
    """The IDSL payload of the symbols ``sym`` (uint8 for byte symbols, uint16 for w = 16, values <
    ``size``): histogram, table, then every run of blocks on its own thread."""
    return payload(sym, w, size, counts).tobytes()


def payload(sym: np.ndarray, w: int, size: int, counts: np.ndarray | None = None,
            tab: tuple[int, np.ndarray] | None = None) -> np.ndarray:
    """:func:`encode_symbols`' bytes as a uint8 array written in place: the header, then each run's
    lane streams coded straight behind it (runs after the first moved down over the unused room).
    ``tab``: :func:`table` of ``counts`` when the caller made it already (for :func:`size_floor`)."""
    m = sym.size
    if counts is None:
        counts = counts_of(sym, size)
    if counts.size > size:
        raise ValueError("a symbol is out of range")
    S, f = table(counts, m) if tab is None else tab
    cum = np.concatenate(([0], np.cumsum(f)[:-1])).astype(np.int64)
    lay = layout(m)
    top = bytes([S, w]) + rans._varints(f)
    start = len(top) + 2 * lay.total_lanes
    buf, lens, end = _code_into(sym, f, cum, S, lay, start)
    buf[: len(top)] = np.frombuffer(top, np.uint8)
    buf[len(top): start] = lens.astype("<u2").view(np.uint8)
    return buf[:end]


def runs_of(lay: Layout, compiled: bool) -> list[tuple[int, int]]:
    """The thread tasks: runs of RUN_BLOCKS blocks (NUMPY_RUN_BLOCKS without the compiled kernel:
    ``compiled`` False)."""
    per = RUN_BLOCKS if compiled else NUMPY_RUN_BLOCKS
    return [(b, min(b + per, lay.blocks)) for b in range(0, lay.blocks, per)]


def code_lanes(sym: np.ndarray, f: np.ndarray, cum: np.ndarray, S: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """(every lane's length, the lanes' streams joined, as one uint8 array in a list) of the symbols
    with table (f, cum, S)."""
    buf, lens, end = _code_into(sym, f, cum, S, layout(sym.size), 0)
    return lens, [buf[:end]]


def _code_into(sym, f, cum, S, lay: Layout, start: int) -> tuple[np.ndarray, np.ndarray, int]:
    """(buffer, every lane's length, end): the lanes' streams written to buffer[start:end], each run
    of blocks on its own thread into its own room, then the rooms closed up."""
    kernel = kernels.compiled("lanes_encode")
    runs = runs_of(lay, kernel is not None)
    room = (4 + 3 * lay.count).cumsum()  # a lane's bytes are at most 4 + 3 T
    caps = [int(room[lay.first_lane[b1] - 1] - (room[lay.first_lane[b0] - 1] if b0 else 0)) for b0, b1 in runs]
    at = start + np.concatenate(([0], np.cumsum(caps, dtype=np.int64))).astype(np.int64)
    buf = np.empty(int(at[-1]), np.uint8)
    parts = parallel.run(lambda i: _encode_run(kernel, sym, f, cum, S, lay, *runs[i], buf[at[i]: at[i + 1]]),
                         range(len(runs)))
    end = start
    for i, (_, used) in enumerate(parts):
        if at[i] != end:
            buf[end: end + used] = buf[at[i]: at[i] + used]  # numpy copies overlapping ranges correctly
        end += used
    lens = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, np.int64)
    return buf, lens, end


def _encode_run(kernel, sym, f, cum, S, lay: Layout, b0: int, b1: int, out: np.ndarray) -> tuple[np.ndarray, int]:
    """(lane lengths, bytes written to ``out``) of blocks [b0, b1), their lane streams one after the
    other (``kernel``: ``kernels.compiled("lanes_encode")``; None: numpy)."""
    l0, l1 = int(lay.first_lane[b0]), int(lay.first_lane[b1])
    if kernel is not None:
        lens = np.zeros(l1 - l0, np.int64)
        used = kernel(sym, f.astype(np.uint32), cum.astype(np.uint32), S, lay.m, b0, b1, out, lens)
        if used < 0:
            raise ValueError("lanes_encode: a symbol has no frequency" if used == -2 else "lanes_encode failed")
        return lens, int(used)
    streams = encode_lane_set(sym, f, cum, S, lay.base[l0:l1], lay.stride[l0:l1], lay.count[l0:l1])
    joined = b"".join(streams)
    out[: len(joined)] = np.frombuffer(joined, np.uint8)
    return np.array([len(s) for s in streams], np.int64), len(joined)


def encode_lane_set(sym, f, cum, S, base, stride, count) -> list[bytes]:
    """Each lane's stream (IDSA's coder, FORMAT.md 4.4) for lanes coding symbols base + t stride,
    t < count: all lanes at once, one step per symbol position from the last, numpy only."""
    nl = base.size
    T = int(count.max(initial=0))
    x = np.full(nl, RANS_L, np.uint64)
    cap = 4 + 3 * T
    out = np.zeros((nl, cap), np.uint8)
    ptr = np.zeros(nl, np.int64)
    lane = np.arange(nl)
    f64, c64 = np.asarray(f).astype(np.uint64), np.asarray(cum).astype(np.uint64)
    for t in range(T - 1, -1, -1):
        act = t < count
        s = sym[np.where(act, base + t * stride, 0)].astype(np.int64)
        fs = np.where(act, f64[s], np.uint64(1))
        if np.any(act & (fs == 0)):
            raise ValueError("a symbol has no frequency")
        x = rans.encode_row(x, fs, c64[s], act, S, out, ptr)
    for sh in (24, 16, 8, 0):  # the state last, so that it comes first once reversed
        out[lane, ptr] = ((x >> np.uint64(sh)) & np.uint64(0xFF)).astype(np.uint8)
        ptr += 1
    return [out[j, : ptr[j]][::-1].tobytes() for j in range(nl)]


@dataclasses.dataclass(frozen=True)
class Parsed:
    """A validated IDSL header: scale bits, symbol width, frequencies, and each lane's stream."""

    S: int
    w: int
    f: np.ndarray
    cum: np.ndarray
    starts: np.ndarray  # per lane, offset in the payload
    lengths: np.ndarray
    layout: Layout


def parse(b: np.ndarray, n: int, k: int) -> Parsed:
    """Validate an IDSL payload's header against n IDs < k (FORMAT.md 4.6's rejections)."""
    if b.size < 2:
        raise FormatError("IDSL: section shorter than its 2-byte header")
    S, w = int(b[0]), int(b[1])
    if not 1 <= S <= rans.MAX_SCALE_BITS:
        raise FormatError(f"IDSL: scale bits {S} out of range 1..{rans.MAX_SCALE_BITS}")
    if w not in (*BYTE_WIDTHS, WIDE) or (w != WIDE and k > 1 << w):
        raise FormatError(f"IDSL: symbol width {w} cannot carry IDs of {k} centroids")
    M = 1 << S
    f, pos = rans._read_varints(b, 2, alphabet(k, w), M, "IDSL")
    if int(f.sum()) != M:
        raise FormatError(f"IDSL: frequencies sum to {int(f.sum())}, expected {M}")
    m = symbol_count(n, w)
    L = lane_total(m)
    if 6 * L > b.size:  # every lane has a 2-byte length and a stream of >= 4 bytes: checked before
        raise FormatError(f"IDSL: {b.size} bytes cannot hold the {L} lanes of {m} symbols")  # any allocation
    lay = layout(m)
    if pos + 2 * L > b.size:
        raise FormatError("IDSL: lane lengths run past the end of the section")
    lengths = b[pos: pos + 2 * L].copy().view("<u2").astype(np.int64)
    pos += 2 * L
    if int(lengths.sum()) != b.size - pos:
        raise FormatError(f"IDSL: lane streams take {int(lengths.sum())} bytes, the section has {b.size - pos}")
    if np.any(lengths < 4) or np.any(lengths > 4 + 3 * lay.count):
        raise FormatError("IDSL: a lane stream has an impossible length")
    starts = pos + np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    cum = np.concatenate(([0], np.cumsum(f)[:-1])).astype(np.int64)
    return Parsed(S, w, f, cum, starts, lengths, lay)


def decode_symbols(buf, n: int, k: int) -> tuple[np.ndarray, int]:
    """(symbols, w) of an IDSL payload for n IDs < k: every run of blocks on its own thread, each lane
    checked (it ends in state 2^23 with every byte read).  Byte symbols still need IDS_'s checks
    (IDs < k, zero padding bits): the caller unpacks them."""
    b = np.frombuffer(buf, np.uint8)
    p = parse(b, n, k)
    lay = p.layout
    out = np.empty(lay.m, np.uint8 if p.w != WIDE else np.uint16)
    if decode_lanes(b, p, out):
        raise FormatError(CORRUPT)
    return out, p.w


CORRUPT = "IDSL: corrupt rANS stream (a lane ends early, or not in its initial state)"


def decode_values(buf, n: int, k: int, table: np.ndarray) -> np.ndarray | None:
    """``table[ids]`` for the n IDs < k = ``len(table)`` of an IDSL payload of byte symbols, each symbol
    looked up as it is decoded (its 8 / w IDs' values as one row of a 256-row table): the IDs never get
    an array.  The blocks in one run per ``parallel.current()`` thread; a corrupt lane raises
    :func:`decode_symbols`' error.  None where this does not apply and the caller decodes the symbols and
    unpacks them (which then raises IDS_'s errors): the numpy backend, w = 16, rows over 64 bytes, a
    symbol with a frequency that holds an ID >= k, or the last symbol's padding bits not zero."""
    kernel = kernels.compiled("lanes_decode")
    if kernel is None or n == 0:
        return None
    b = np.frombuffer(buf, np.uint8)
    p = parse(b, n, k)
    if p.w == WIDE:
        return None
    rows = parallel.byte_table(table, p.w)
    V = rows.bytes.size // 256
    if V > 64 or (rows.bad is not None and bool(np.any(rows.bad & (p.f > 0)))):
        return None
    out = kernels.output_array(n, table.dtype)  # huge pages, faulted in by the kernel run by run
    lay = p.layout
    f, cum, ob = p.f.astype(np.uint32), p.cum.astype(np.uint32), out.view(np.uint8)

    def run(r: tuple[int, int]) -> int:
        l0, l1 = int(lay.first_lane[r[0]]), int(lay.first_lane[r[1]])
        return kernel(b, f, cum, p.S, lay.m, r[0], r[1], p.starts[l0:l1], p.lengths[l0:l1], ob, rows.bytes)
    # one run of blocks per thread (at least RUN_BLOCKS): each call builds its slot tables once
    per = max(RUN_BLOCKS, -(-lay.blocks // parallel.current()))
    got = parallel.run(run, [(b0, min(b0 + per, lay.blocks)) for b0 in range(0, lay.blocks, per)])
    if min(got) < 0:
        raise FormatError(CORRUPT)
    return None if got[-1] >> (n * p.w - 8 * (lay.m - 1)) else out  # the last symbol's padding bits


def decode_lanes(b: np.ndarray, p: Parsed, out: np.ndarray) -> bool:
    """Decode every lane of the parsed section ``b`` into ``out``, runs of blocks on the threads;
    True when a lane is corrupt."""
    kernel = kernels.compiled("lanes_decode")
    return any(parallel.run(lambda r: _decode_run(kernel, b, p, out, *r), runs_of(p.layout, kernel is not None)))


def _decode_run(kernel, b, p: Parsed, out, b0: int, b1: int) -> bool:
    """Decode blocks [b0, b1) into ``out`` (``kernel``: ``kernels.compiled("lanes_decode")``; None:
    numpy); True when a lane is corrupt."""
    lay = p.layout
    l0, l1 = int(lay.first_lane[b0]), int(lay.first_lane[b1])
    if kernel is not None:
        return bool(kernel(b, p.f.astype(np.uint32), p.cum.astype(np.uint32), p.S, lay.m,
                           b0, b1, p.starts[l0:l1], p.lengths[l0:l1], out))
    return decode_lane_set(b, p.f, p.cum, p.S, p.starts[l0:l1], p.lengths[l0:l1], lay.base[l0:l1],
                           lay.stride[l0:l1], lay.count[l0:l1], out)


def decode_lane_set(b, f, cum, S, starts, lengths, base, stride, count, out) -> bool:
    """Decode the lanes (streams at ``starts``, symbols base + t stride, t < count) into ``out``, all
    lanes at once, numpy only; True when a lane is corrupt."""
    M = 1 << S
    sym = np.repeat(np.arange(f.size), f).astype(np.int64)  # slot -> symbol
    nl = base.size
    ends = starts + lengths
    ptr = starts.copy()
    x = np.zeros(nl, np.uint64)
    for sh in (0, 8, 16, 24):
        x |= b[ptr].astype(np.uint64) << np.uint64(sh)
        ptr += 1
    if np.any(x >> np.uint64(31)):  # a coder's state is below 2^31: every step then stays below it
        return True
    f64, c64 = np.asarray(f).astype(np.uint64), np.asarray(cum).astype(np.uint64)
    mask, L = np.uint64(M - 1), np.uint64(RANS_L)
    T = int(count.max(initial=0))
    for t in range(T):
        act = t < count
        slot = (x & mask).astype(np.int64)
        s = sym[slot]
        nx = f64[s] * (x >> np.uint64(S)) + slot.astype(np.uint64) - c64[s]
        x = np.where(act, nx, x)
        out[base[act] + t * stride[act]] = s[act]
        for _ in range(3):
            m = act & (x < L)
            if not m.any():
                break
            if np.any(ptr[m] >= ends[m]):
                return True
            x[m] = (x[m] << np.uint64(8)) | b[ptr[m]].astype(np.uint64)
            ptr[m] += 1
    return bool(np.any(x != L) or np.any(ptr != ends))
