"""Bit-level reading and writing, LSB-first, shared by every codec.

Every bit stream of the format has one order: stream bit k is bit (k % 8) of byte k // 8, and the last
byte is zero-padded.  This module holds

- fixed-width packing of small unsigned integers (cluster IDs, widths 0..16): element i occupies
  stream bits [i*w, (i+1)*w), the order of FORMAT.md section "IDS_"; it equals little-endian packing
  of whole words, which is what makes the widths 1, 2, 4, 8 and 16 pure reshapes;
- bit streams of wider fields (up to 57 bits) and unary codes, which the position codes of
  :mod:`mucsc.codec.wire.sparse` are built from;
- Elias-gamma codes of positive integers (QSGD's gaps and levels);
- the padding check every decoder of such a stream makes.

Readers never expand a stream to a byte per bit as a whole: their memory is bounded by the number of
values the caller declared, not by what a hostile buffer could expand to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from mucsc.errors import FormatError, ParameterError

MAX_WIDTH = 16


def ceil_log2(x: int) -> int:
    """ceil(log2 x) for an integer x >= 1 (0 for x = 1), exactly (no float rounding): the bits that
    address x distinct values."""
    return max(0, int(x - 1).bit_length())


def packed_size(n: int, width: int) -> int:
    """Bytes needed for ``n`` values of ``width`` bits."""
    return (n * width + 7) // 8


def pack(values: np.ndarray, width: int) -> bytes:
    """Pack non-negative integers < 2**width (width 0..16) into bytes; width 0 gives b''."""
    return pack_array(values, width).tobytes()


def pack_array(values: np.ndarray, width: int) -> np.ndarray:
    """:func:`pack`'s bytes as a 1-D uint8 array (for a caller that copies them on anyway: no
    bytes object of their own; for widths 8 and 16 it may be a view of ``values``)."""
    if not 0 <= width <= MAX_WIDTH:
        raise ValueError(f"bit width must be in 0..{MAX_WIDTH}, got {width}")
    v = np.ascontiguousarray(values).reshape(-1)
    n = v.size
    if width == 0 or n == 0:
        return np.zeros(0, np.uint8)
    if width in (8, 16):
        return v.astype(np.uint8 if width == 8 else "<u2", copy=False).view(np.uint8)
    if width in (1, 2, 4):
        per = 8 // width
        v = v.astype(np.uint8, copy=False)
        pad = (-n) % per
        if pad:
            v = np.concatenate([v, np.zeros(pad, np.uint8)])
        g = v.reshape(-1, per)
        out = g[:, 0].copy()
        for j in range(1, per):
            out |= g[:, j] << np.uint8(j * width)
        return out
    return np.frombuffer(_pack_generic(v, width), np.uint8)


def _pack_generic(v: np.ndarray, width: int) -> bytes:
    """Widths 3, 5-7, 9-15: groups of 8 values fill exactly ``width`` bytes."""
    n = v.size
    pad = (-n) % 8
    v64 = v.astype(np.uint64)
    if pad:
        v64 = np.concatenate([v64, np.zeros(pad, np.uint64)])
    g = v64.reshape(-1, 8)
    if width <= 8:  # 8 values * width bits <= 64 bits: one uint64 per group
        word = np.zeros(g.shape[0], np.uint64)
        for j in range(8):
            word |= g[:, j] << np.uint64(j * width)
        out = word.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :width]
    else:  # up to 128 bits per group: low and high uint64 words
        lo = np.zeros(g.shape[0], np.uint64)
        hi = np.zeros(g.shape[0], np.uint64)
        for j in range(8):
            s = j * width
            if s + width <= 64:
                lo |= g[:, j] << np.uint64(s)
            elif s >= 64:
                hi |= g[:, j] << np.uint64(s - 64)
            else:  # straddles the word boundary
                lo |= g[:, j] << np.uint64(s)
                hi |= g[:, j] >> np.uint64(64 - s)
        both = np.stack([lo.astype("<u8"), hi.astype("<u8")], axis=1).view(np.uint8).reshape(-1, 16)
        out = both[:, :width]
    return np.ascontiguousarray(out).tobytes()[: packed_size(n, width)]


def check_packed(buf: bytes | memoryview, width: int, n: int) -> None:
    """The checks :func:`unpack` makes before unpacking (width, exact length, zero padding bits), for
    decoders that unpack elsewhere (the torch backend on a device)."""
    if not 0 <= width <= MAX_WIDTH:
        raise FormatError(f"bit width must be in 0..{MAX_WIDTH}, got {width}")
    need = packed_size(n, width)
    if len(buf) != need:
        raise FormatError(f"packed ids: {len(buf)} bytes for {n} values of {width} bits, expected {need}")
    if need:
        check_padding(np.frombuffer(buf, np.uint8), n * width, "packed ids")


def unpack(buf: bytes | memoryview, width: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack`: ``n`` values as uint8 (width <= 8) or uint16.

    The buffer length must be exactly ``packed_size(n, width)`` and padding bits must be zero.
    """
    if not 0 <= width <= MAX_WIDTH:
        raise FormatError(f"bit width must be in 0..{MAX_WIDTH}, got {width}")
    out_dtype = np.uint8 if width <= 8 else np.uint16
    need = packed_size(n, width)
    if len(buf) != need:
        raise FormatError(f"packed ids: {len(buf)} bytes for {n} values of {width} bits, expected {need}")
    if width == 0 or n == 0:
        return np.zeros(n, out_dtype)
    b = np.frombuffer(buf, np.uint8)
    check_padding(b, n * width, "packed ids")
    if width == 8:
        return b.copy()
    if width == 16:
        return b.view("<u2").astype(np.uint16)
    if width in (1, 2, 4):
        per = 8 // width
        mask = np.uint8((1 << width) - 1)
        out = np.empty((b.size, per), np.uint8)
        for j in range(per):
            np.bitwise_and(b >> np.uint8(j * width), mask, out=out[:, j])
        return out.reshape(-1)[:n]
    return _unpack_generic(b, width, n, out_dtype)


def _unpack_generic(b: np.ndarray, width: int, n: int, out_dtype: type) -> np.ndarray:
    groups = (n + 7) // 8
    padded = np.zeros(groups * width, np.uint8)
    padded[: b.size] = b
    g = padded.reshape(groups, width)
    mask = np.uint64((1 << width) - 1)
    out = np.empty((groups, 8), out_dtype)
    if width <= 8:
        w8 = np.zeros((groups, 8), np.uint8)
        w8[:, :width] = g
        word = w8.view("<u8").reshape(-1)
        for j in range(8):
            out[:, j] = (word >> np.uint64(j * width)) & mask
    else:
        w16 = np.zeros((groups, 16), np.uint8)
        w16[:, :width] = g
        words = w16.view("<u8").reshape(groups, 2)
        lo, hi = words[:, 0], words[:, 1]
        for j in range(8):
            s = j * width
            if s + width <= 64:
                val = lo >> np.uint64(s)
            elif s >= 64:
                val = hi >> np.uint64(s - 64)
            else:
                val = (lo >> np.uint64(s)) | (hi << np.uint64(64 - s))
            out[:, j] = val & mask
    return out.reshape(-1)[:n]


def check_padding(buf: np.ndarray, used_bits: int, what: str = "bit stream") -> None:
    """FormatError unless the ``used_bits`` bits of the stream ``buf`` end in its last byte and the
    spare bits after them are zero: the canonical encoding has neither stray bytes nor stray bits."""
    spare = buf.size * 8 - used_bits
    if spare >= 8:
        raise FormatError(f"{what}: a whole unused byte at its end")
    if spare and int(buf[-1]) >> (8 - spare):
        raise FormatError(f"{what}: padding bits in the last byte are not zero")


# ---- bit streams of wider fields and unary codes ---------------------------------------------------

SCAN_BYTES = 1 << 16  # bytes of a bit stream expanded at a time when scanning for set bits
FIELD_CHUNK = 1 << 20  # fields gathered at a time
MAX_FIELD_BITS = 57  # a field plus its offset within its first byte fits one 64-bit word


def bits_to_bytes(bits: np.ndarray) -> bytes:
    """A 0/1 array (one element per stream bit) as the LSB-first bytes of the stream."""
    return np.packbits(bits.astype(np.uint8, copy=False), bitorder="little").tobytes()


def set_bits(buf: np.ndarray, start: int, stop: int, limit: int) -> tuple[np.ndarray, bool]:
    """Stream positions (int64) of the first ``limit`` set bits in bits [start, stop) of ``buf``, and
    whether further set bits follow in that range.  Scans SCAN_BYTES at a time and stops at ``limit``:
    memory O(limit + SCAN_BYTES), whatever the stream's length or content."""
    found: list[np.ndarray] = []
    got = 0
    first, end = start >> 3, min((stop + 7) >> 3, buf.size)
    for cb in range(first, end, SCAN_BYTES):
        chunk = buf[cb: min(cb + SCAN_BYTES, end)]
        if not chunk.any():
            continue
        bits = np.unpackbits(chunk, bitorder="little")
        lo, hi = max(start - 8 * cb, 0), min(stop - 8 * cb, bits.size)
        pos = np.flatnonzero(bits[lo:hi]).astype(np.int64) + (8 * cb + lo)
        if got + pos.size > limit:
            found.append(pos[: limit - got])
            return np.concatenate(found), True
        found.append(pos)
        got += pos.size
    return (np.concatenate(found) if found else np.zeros(0, np.int64)), False


def read_fields(buf: np.ndarray, start: np.ndarray, widths: np.ndarray | int) -> np.ndarray:
    """Field i: ``widths[i]`` (<= 57) bits at stream bit ``start[i]``, LSB first, as int64.

    Gathered from the bytes (the 8 bytes from the field's first byte form one little-endian word),
    FIELD_CHUNK fields at a time; the caller has checked that every field lies inside ``buf``."""
    start = np.asarray(start, np.int64)
    k = start.size
    out = np.empty(k, np.int64)
    w = np.broadcast_to(np.asarray(widths, np.int64), (k,))
    wmax = int(w.max(initial=0))
    if k == 0 or wmax == 0:
        out[:] = 0
        return out
    if wmax > MAX_FIELD_BITS:
        raise FormatError(f"bit field of {wmax} bits is wider than {MAX_FIELD_BITS}")
    span = (wmax + 7 + 7) // 8  # bytes a field can touch
    padded = np.zeros(buf.size + span, np.uint8)
    padded[: buf.size] = buf
    for s in range(0, k, FIELD_CHUNK):
        st, ww = start[s: s + FIELD_CHUNK], w[s: s + FIELD_CHUNK]
        byte = st >> 3
        word = np.zeros(st.size, np.uint64)
        for j in range(span):
            word |= padded[byte + j].astype(np.uint64) << np.uint64(8 * j)
        word >>= (st & 7).astype(np.uint64)
        word &= (np.uint64(1) << ww.astype(np.uint64)) - np.uint64(1)
        out[s: s + st.size] = word.astype(np.int64)
    return out


def write_fields(bits: np.ndarray, start: np.ndarray, values: np.ndarray, widths: np.ndarray) -> None:
    """bits[start_i + j] = bit j of values_i for j < widths_i (vectorised over i, loop over j)."""
    if values.size == 0:
        return
    v = values.astype(np.uint64)
    for j in range(int(widths.max(initial=0))):
        m = widths > j
        bits[start[m] + j] = ((v[m] >> np.uint64(j)) & np.uint64(1)).astype(np.uint8)


def pack_fields(values: np.ndarray, width: int) -> bytes:
    """``values`` as consecutive ``width``-bit fields (any width up to 57; :func:`pack` is the fast
    path for IDs of at most 16 bits), zero-padded to a whole byte."""
    k = values.size
    bits = np.zeros(k * width, np.uint8)
    write_fields(bits, np.arange(k, dtype=np.int64) * width, values, np.full(k, width))
    return bits_to_bytes(bits)


def unpack_fields(buf: np.ndarray, offset: int, k: int, width: int) -> np.ndarray:
    """``k`` consecutive ``width``-bit fields from stream bit ``offset`` (inverse of :func:`pack_fields`
    at offset 0), as int64."""
    return read_fields(buf, offset + np.arange(k, dtype=np.int64) * width, width)


def write_unary(bits: np.ndarray, offset: int, q: np.ndarray) -> int:
    """Write q_i zeros then a one for each i starting at ``offset``; returns the end offset."""
    ones = offset + np.cumsum(q + 1) - 1
    bits[ones] = 1
    return int(ones[-1]) + 1 if q.size else offset


def read_unary(buf: np.ndarray, offset: int, k: int) -> tuple[np.ndarray, int]:
    """Read k unary codes from stream bit ``offset`` of the bytes ``buf``: (q, end offset).
    FormatError when fewer than k ones follow.  Memory O(k), see :func:`set_bits`."""
    ones, _ = set_bits(buf, offset, 8 * buf.size, k)
    if ones.size < k:
        raise FormatError(f"unary stream holds {ones.size} codes, expected {k}")
    q = np.diff(ones, prepend=offset - 1) - 1
    return q, (int(ones[-1]) + 1 if k else offset)


# ---- Elias-gamma codes of positive integers (QSGD's gaps and levels) ------------------------------

def gamma_encode(values: np.ndarray) -> bytes:
    """Elias-gamma code of integers >= 1 as two streams in one section: for each v, N = floor(log2 v)
    zeros then a one (all k unary codes first), then the N low bits of each v (LSB first).  The bit
    count equals interleaved Elias gamma (2N + 1 per value); separating the streams vectorises decoding."""
    v = np.ascontiguousarray(values, dtype=np.int64)
    parts = [v[a: a + GAMMA_CHUNK] for a in range(0, v.size, GAMMA_CHUNK)]
    out = GammaWriter(*gamma_totals(parts))
    for p in parts:
        out.put(p)
    return out.close()


GAMMA_CHUNK = 1 << 16  # values coded at a time: ~1-3 MB of one-byte-per-bit temporaries


def gamma_totals(parts: Iterable[np.ndarray]) -> tuple[int, int]:
    """(values, sum of N = floor(log2 v)) of the int64 arrays ``parts``: what :class:`GammaWriter`
    needs first.  ParameterError for a value below 1."""
    count = ones = 0
    for v in parts:
        if v.size and int(v.min()) < 1:
            raise ParameterError("Elias-gamma codes positive integers")
        count += v.size
        ones += int(bit_length(v).sum()) - v.size
    return count, ones


class GammaWriter:
    """:func:`gamma_encode`'s bytes for ``count`` values whose N sum to ``ones``, the values put a
    chunk at a time (in order): the unary codes from bit 0, the low bits from bit ``count + ones``,
    each stream packed as it goes.  A caller that can produce its values twice (once for
    :func:`gamma_totals`) never holds them all, nor the stream as one byte a bit (8x the section)."""

    def __init__(self, count: int, ones: int) -> None:
        self.buf = np.zeros((2 * ones + count + 7) // 8, np.uint8)
        self.unary, self.low = BitStream(self.buf, 0), BitStream(self.buf, count + ones)

    def put(self, v: np.ndarray) -> None:
        n_bits = bit_length(v) - 1
        bits = np.zeros(int(n_bits.sum()) + v.size, np.uint8)
        write_unary(bits, 0, n_bits)  # N zeros then a one
        self.unary.put(bits)
        bits = np.zeros(int(n_bits.sum()), np.uint8)
        write_fields(bits, np.cumsum(n_bits) - n_bits, v, n_bits)  # the N low bits, LSB first
        self.low.put(bits)

    def close(self) -> bytes:
        self.unary.close()
        self.low.close()
        return self.buf.tobytes()


class BitStream:
    """A bit stream written LSB first into the zeroed bytes ``buf`` from stream bit ``bit``, a piece
    (0/1 uint8 array) at a time: whole bytes OR-ed in as they fill (a stream may share its first
    byte with the one before it), fewer than 8 bits carried to the next piece."""

    def __init__(self, buf: np.ndarray, bit: int = 0) -> None:
        self.buf = buf
        self.at = bit // 8
        self.carry = np.zeros(bit % 8, np.uint8)  # the bits before the start: zeros, OR-ed in

    def put(self, bits: np.ndarray) -> None:
        if self.carry.size:
            bits = np.concatenate((self.carry, bits))
        whole = bits.size // 8 * 8
        packed = np.packbits(bits[:whole], bitorder="little")
        self.buf[self.at: self.at + packed.size] |= packed
        self.at += packed.size
        self.carry = bits[whole:].copy()

    def close(self) -> None:
        if self.carry.size:
            self.buf[self.at] |= np.packbits(self.carry, bitorder="little")[0]


GAMMA_BLOCK = 1 << 12  # bytes of a unary part scanned at a time (at most 2^15 codes, 256 KiB of positions)
GAMMA_READ = 1 << 14  # values checked at a time


@dataclasses.dataclass(frozen=True, eq=False)
class GammaCodes:
    """k checked Elias-gamma codes (layout of :func:`gamma_encode`) in ``buf``, their unary part ending
    at stream bit ``end``; ``total``: the sum of the values.  Read them with :class:`GammaReader`."""
    buf: np.ndarray
    k: int
    end: int
    total: int


def gamma_codes(data: bytes | memoryview, k: int, max_value: int) -> GammaCodes:
    """Check k Elias-gamma codes, each <= max_value, in a fixed scratch whatever k: a counting pass
    over the unary part (its end and longest code), the length and padding checks, then a pass
    decoding the values GAMMA_BLOCK bytes of codes at a time (their bound and their sum)."""
    buf = np.frombuffer(data, np.uint8)
    if k == 0:
        if buf.size:
            raise FormatError("empty Elias-gamma stream with bytes present")
        return GammaCodes(buf, 0, 0, 0)
    if buf.size * 8 < k:
        raise FormatError(f"Elias-gamma stream: {buf.size} bytes cannot hold {k} codes")
    end, widest = _unary_end(buf, k)
    if widest > max(0, int(max_value).bit_length() - 1):
        raise FormatError("Elias-gamma value exceeds its bound")
    total_bits = 2 * end - k  # the unary part holds k ones and sum(N) zeros; the mantissas sum(N) bits
    if total_bits > 8 * buf.size:
        raise FormatError("Elias-gamma stream: mantissas run past the end of the section")
    check_padding(buf, total_bits, "Elias-gamma stream")
    if widest > MAX_FIELD_BITS:
        raise FormatError(f"bit field of {widest} bits is wider than {MAX_FIELD_BITS}")
    reader, total = GammaReader(GammaCodes(buf, k, end, 0)), 0
    while reader.left:
        v = reader.read(GAMMA_READ)
        if int(v.max()) > max_value:
            raise FormatError("Elias-gamma value exceeds its bound")
        total += (int((v >> 32).sum()) << 32) + int((v & 0xFFFFFFFF).sum())  # exact (v < 2^58, <= 2^15 values a block)
    return GammaCodes(buf, k, end, total)


def gamma_decode(data: bytes | memoryview, k: int, max_value: int) -> np.ndarray:
    """Decode k Elias-gamma codes (layout of :func:`gamma_encode`), each checked to be <= max_value
    (memory O(k); :class:`GammaReader` reads them a chunk at a time)."""
    return GammaReader(gamma_codes(data, k, max_value)).read(k)


def _unary_end(buf: np.ndarray, k: int) -> tuple[int, int]:
    """(the stream bit after the k-th one, the most zeros before a one among the first k), scanning
    GAMMA_BLOCK bytes at a time; FormatError when the stream holds fewer than k ones."""
    count, code_start, widest = 0, 0, 0
    for a in range(0, buf.size, GAMMA_BLOCK):
        ones = np.flatnonzero(np.unpackbits(buf[a: a + GAMMA_BLOCK], bitorder="little")) + 8 * a
        ones = ones[: k - count]
        if ones.size:
            widest = max(widest, int(ones[0]) - code_start, int(np.diff(ones).max(initial=1)) - 1)
            code_start = int(ones[-1]) + 1
            count += ones.size
            if count == k:
                return code_start, widest
    raise FormatError(f"unary stream holds {count} codes, expected {k}")


class GammaReader:
    """The values of checked Elias-gamma codes (:func:`gamma_codes`), front to back: ``read(m)`` gives
    the next m, decoding GAMMA_BLOCK bytes of the unary part (and their mantissas) at a time, so
    its memory is O(m + one block) whatever k."""

    def __init__(self, codes: GammaCodes) -> None:
        self._buf, self._end = codes.buf, codes.end
        self._scan = 0  # next unary bit to scan
        self._code = 0  # stream bit where the next code's unary part starts
        self._mant = codes.end  # stream bit of the next code's mantissa
        self._held = np.zeros(0, np.int64)  # decoded values not yet read
        self.left = codes.k  # values not yet read

    def read(self, m: int) -> np.ndarray:
        m = min(m, self.left)
        parts, got = [self._held], self._held.size
        while got < m:
            v = self._block()
            parts.append(v)
            got += v.size
        held = np.concatenate(parts) if len(parts) > 1 else self._held
        self._held = held[m:]
        self.left -= m
        return held[:m]

    def _block(self) -> np.ndarray:
        """The values of the codes whose ones lie in the next GAMMA_BLOCK bytes of the unary part."""
        a = self._scan
        b = min(self._end, (a // 8 + GAMMA_BLOCK) * 8)
        first = a // 8
        bits = np.unpackbits(self._buf[first: (b + 7) // 8], bitorder="little")[a - 8 * first: b - 8 * first]
        ones = np.flatnonzero(bits) + a
        self._scan = b
        if not ones.size:
            return np.zeros(0, np.int64)
        n_bits = np.diff(ones, prepend=self._code - 1) - 1
        self._code = int(ones[-1]) + 1
        start = np.cumsum(n_bits) - n_bits
        lo, used = self._mant // 8, int(start[-1] + n_bits[-1])
        window = self._buf[lo: (self._mant + used + 7) // 8]
        v = read_fields(window, start + (self._mant - 8 * lo), n_bits) | (np.int64(1) << n_bits)
        self._mant += used
        return v


def bit_length(v: np.ndarray) -> np.ndarray:
    """bit_length of positive int64 values, exactly (no float rounding)."""
    out = np.zeros(v.shape, np.int64)
    x = v.copy()
    for shift in (32, 16, 8, 4, 2, 1):
        m = x >= (np.int64(1) << shift)
        out[m] += shift
        x[m] >>= shift
    return out + (x > 0)
