"""Sparse position sets <-> bytes.

A position set is a sorted array of unique int64 positions in [0, d) (the kept elements of a top-k or
B-MUCSC update).  Methods (normative layouts in spec/codecs.md, "Position coding"):

- ``fixed``: ceil(log2 d) bits per position, the paper's eq. CompressRateB count;
- ``int32``: little-endian int32 per position, the DGC paper's wire;
- ``rice``: Golomb-Rice code of the gaps with parameter b (unary quotients, then b-bit remainders);
- ``ef``: Elias-Fano (l = floor(log2(d/k)) low bits, unary-coded high parts);
- ``bitmap``: d bits, bit p set for every kept p.

All bit streams are LSB-first (stream bit i is bit i % 8 of byte i // 8), zero-padded to a whole byte,
and read and written with the helpers of :mod:`mucsc.codec.wire.bitpack`; this module holds what is about
position sets (gaps, the methods' layouts and sizes, the choice among them, top-k selection).
Encoders and decoders are numpy-vectorised.  Decoders check every length against the buffer before
allocating and raise FormatError on anything that is not the canonical encoding; they read fields and
unary codes straight from the bytes (never a byte per bit of the whole stream), so their memory is
bounded by the declared count k, not by what a hostile buffer could expand to.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from mucsc.codec.wire.bitpack import (
    bits_to_bytes, ceil_log2, check_padding, pack_fields, read_unary, set_bits, unpack_fields, write_fields,
    write_unary,
)
from mucsc.errors import FormatError, ParameterError, SizeError

METHODS = ("fixed", "int32", "rice", "ef", "bitmap")
COMPACT = ("bitmap", "rice", "ef")  # what "auto" chooses from; the first wins a tie
# A codec's ``positions`` parameter: "auto" (smallest compact code), "paper" (the code its paper
# counts, the codec's ``paper_positions``) or one method by name.
POSITION_MODES = ("auto", "paper") + METHODS
_MAX_D = 1 << 48  # positions are int64; keeps every shift and cumulative sum below 2**62


@dataclasses.dataclass(frozen=True)
class Coded:
    """An encoded position set: the method, its integer argument (Rice b; 0 otherwise) and the bytes."""

    method: str
    arg: int
    data: bytes


# ---- public API -------------------------------------------------------------------------------------

def encode(positions: np.ndarray, d: int, method: str = "auto", rice_parameter: int | None = None) -> Coded:
    """Encode sorted unique positions in [0, d); ``method="auto"`` picks the smallest compact code.

    Rice uses ``rice_parameter`` when given (STC's b*), else the exact best one for these gaps."""
    p = np.ascontiguousarray(positions, dtype=np.int64).reshape(-1)
    _check_positions(p, d)
    if method == "auto":
        sizes = compact_sizes(p, d)
        method = min(COMPACT, key=lambda m: (sizes[m], COMPACT.index(m)))
    if method not in METHODS:
        raise ParameterError(f"unknown position method {method!r}; known: auto, {', '.join(METHODS)}")
    if p.size == 0:
        return Coded(method, 0, b"")  # every method codes the empty set as no bytes
    if method == "fixed":
        return Coded("fixed", 0, pack_fields(p, _fixed_width(d)))
    if method == "int32":
        if d > 1 << 31:
            raise ParameterError(f"int32 positions need d <= 2**31, got d = {d}")
        return Coded("int32", 0, p.astype("<i4").tobytes())
    if method == "rice":
        b = best_rice_parameter(p, d) if rice_parameter is None else int(rice_parameter)
        if not 0 <= b <= max_rice_parameter(d):
            raise ParameterError(f"rice parameter must be in [0, {max_rice_parameter(d)}], got {b}")
        return Coded("rice", b, _rice_encode(p, b))
    if method == "ef":
        return Coded("ef", 0, _ef_encode(p, d))
    if method == "bitmap":
        bits = np.zeros(d, np.uint8)
        bits[p] = 1
        return Coded("bitmap", 0, bits_to_bytes(bits))
    raise ParameterError(f"unknown position method {method!r}; known: auto, {', '.join(METHODS)}")


def decode(data: bytes | memoryview, d: int, k: int, method: str, arg: int = 0) -> np.ndarray:
    """Decode ``k`` positions in [0, d) (int64, strictly increasing); FormatError on invalid input."""
    if not (isinstance(d, int) and 0 <= d <= _MAX_D and isinstance(k, int) and 0 <= k <= d):
        raise FormatError(f"position set: need 0 <= k <= d <= 2**48, got k = {k}, d = {d}")
    buf = np.frombuffer(data, np.uint8)
    if method == "rice":
        if not (isinstance(arg, int) and 0 <= arg <= max_rice_parameter(d)):
            raise FormatError(f"rice parameter must be in [0, {max_rice_parameter(d)}], got {arg!r}")
    elif arg != 0:
        raise FormatError(f"position method {method!r} takes no parameter, got {arg!r}")
    if k == 0:
        if buf.size:
            raise FormatError(f"empty position set with {buf.size} bytes of positions")
        return np.zeros(0, np.int64)
    if method == "fixed":
        w = _fixed_width(d)
        _expect_len(buf, (k * w + 7) // 8, "fixed-width positions")
        check_padding(buf, k * w, "fixed-width positions")
        p = unpack_fields(buf, 0, k, w)
    elif method == "int32":
        if d > 1 << 31:
            raise FormatError("int32 positions need d <= 2**31")
        _expect_len(buf, 4 * k, "int32 positions")
        p = buf.view("<i4").astype(np.int64)
    elif method == "rice":
        p = _rice_decode(buf, k, arg, d)
    elif method == "ef":
        p = _ef_decode(buf, d, k)
    elif method == "bitmap":
        _expect_len(buf, (d + 7) // 8, "position bitmap")
        check_padding(buf, d, "position bitmap")
        p, more = set_bits(buf, 0, d, k)
        if more or p.size != k:
            raise FormatError(f"position bitmap has {'more' if more else p.size} bits set, header says {k}")
    else:
        raise FormatError(f"unknown position method {method!r}")
    _validate_decoded(p, d)
    return p


def nbytes(method: str, d: int, k: int, arg: int = 0, positions: np.ndarray | None = None) -> int:
    """Exact encoded size for the data-independent methods (and Rice/EF given the positions)."""
    if k == 0:
        return 0
    if method == "fixed":
        return (k * _fixed_width(d) + 7) // 8
    if method == "int32":
        return 4 * k
    if method == "bitmap":
        return (d + 7) // 8
    if method == "ef":
        l = _ef_low_bits(d, k)
        return (k * l + k + ((d - 1) >> l) + 1 + 7) // 8
    if method == "rice":
        if positions is None:
            raise ValueError("the Rice size depends on the positions")
        g = _gaps(np.asarray(positions, np.int64))
        return (int(np.sum(g >> arg)) + k * (1 + arg) + 7) // 8
    raise ParameterError(f"unknown position method {method!r}")


def position_bytes(method: str, d: int, k: int, *, estimate: bool = False) -> int:
    """Bytes of k positions in [0, d) coded with ``method`` (or "auto").  The data-independent methods
    are exact; Rice and "auto" depend on the positions: SizeError, or with ``estimate`` the expected
    size of k uniformly random positions."""
    if method not in ("auto", "rice"):
        return nbytes(method, d, k)
    if not estimate:
        raise SizeError(f"positions={method!r} has a data-dependent size: pass positions_bytes")
    if method == "rice":
        return expected_rice_bytes(d, k)
    return min(expected_rice_bytes(d, k), nbytes("ef", d, k), nbytes("bitmap", d, k))


def compact_sizes(positions: np.ndarray, d: int) -> dict[str, int]:
    """Exact byte counts of the compact methods for these positions (Rice at its best parameter)."""
    p = np.asarray(positions, np.int64)
    k = p.size
    b = best_rice_parameter(p, d)
    return {"rice": nbytes("rice", d, k, b, p), "ef": nbytes("ef", d, k), "bitmap": nbytes("bitmap", d, k)}


def choose(d: int, k: int, positions: np.ndarray | None = None) -> str:
    """The smallest compact method: exact when ``positions`` is given, else by the expected size of
    ``k`` uniformly random positions (Rice cost of geometric gaps).  Bitmap wins when k/d is large."""
    if positions is not None:
        sizes = compact_sizes(positions, d)
    else:
        sizes = {"rice": expected_rice_bytes(d, k), "ef": nbytes("ef", d, k), "bitmap": nbytes("bitmap", d, k)}
    return min(COMPACT, key=lambda m: (sizes[m], COMPACT.index(m)))


def expected_rice_bytes(d: int, k: int) -> int:
    """Expected Rice size of k uniform random positions in [0, d), at the best parameter for k/d."""
    if k == 0:
        return 0
    q = k / d  # gap g >= 0 is ~ geometric: P(g) = (1-q)^g q
    best = math.inf
    for b in range(0, max_rice_parameter(d) + 1):
        t = (1.0 - q) ** (1 << b)  # P(g >= 2^b); E[g >> b] = t / (1 - t)
        eq = t / (1.0 - t) if t < 1.0 else math.inf
        best = min(best, k * (1 + b + eq))
    return math.ceil(best / 8)


def rice_parameter_for(d: int, k: int) -> int:
    """Golomb's optimal power-of-two parameter for geometric gaps with kept fraction k/d.

    b = max(0, ceil(log2(log(phi - 1) / log(1 - k/d)))): the STC paper's b* (Sattler et al., 2019,
    eq. 17) is 1 + floor of the same logarithm, which equals it except at exact powers of two.
    """
    if k == 0 or k >= d:
        return 0
    phi = (1 + math.sqrt(5)) / 2
    x = math.log(phi - 1) / math.log(1 - k / d)
    return min(max(0, math.ceil(math.log2(x))), max_rice_parameter(d))


def stc_golomb_parameter(p: float) -> int:
    """The STC paper's b* = 1 + floor(log2(ln(phi - 1) / ln(1 - p))) for sparsity fraction p in (0, 1)."""
    phi = (1 + math.sqrt(5)) / 2
    return max(0, 1 + math.floor(math.log2(math.log(phi - 1) / math.log(1 - p))))


def max_rice_parameter(d: int) -> int:
    """Largest meaningful Rice parameter: gaps are < d, so b never needs more than bit_length(d)."""
    return max(0, int(d).bit_length())


def best_rice_parameter(positions: np.ndarray, d: int) -> int:
    """The Rice parameter minimising the exact size of these gaps (searched around the k/d optimum)."""
    p = np.asarray(positions, np.int64)
    k = p.size
    if k == 0:
        return 0
    g = _gaps(p)
    b0 = rice_parameter_for(d, k)
    lo, hi = max(0, b0 - 3), min(max_rice_parameter(d), b0 + 3)
    costs = [(int(np.sum(g >> b)) + k * b, b) for b in range(lo, hi + 1)]
    return min(costs)[1]


# ---- helpers -------------------------------------------------------------------------------------

def _expect_len(buf: np.ndarray, n: int, what: str) -> None:
    if buf.size != n:
        raise FormatError(f"{what}: {buf.size} bytes, expected {n}")


# ---- methods -------------------------------------------------------------------------------------

def _fixed_width(d: int) -> int:
    """ceil(log2 d) bits (0 when d == 1): the paper's parameter-ID width."""
    return ceil_log2(d)


def _gaps(p: np.ndarray) -> np.ndarray:
    """g_i = p_i - p_{i-1} - 1 >= 0 with p_{-1} = -1."""
    return np.diff(p, prepend=-1) - 1


def _rice_encode(p: np.ndarray, b: int) -> bytes:
    """Layout: k unary quotients (g_i >> b), then k b-bit remainders (g_i mod 2^b), zero padding."""
    g = _gaps(p)
    q = g >> b
    k = p.size
    n_unary = int(q.sum()) + k
    bits = np.zeros(n_unary + k * b, np.uint8)
    write_unary(bits, 0, q)
    if b:
        r = g & ((1 << b) - 1)
        write_fields(bits, n_unary + np.arange(k, dtype=np.int64) * b, r, np.full(k, b))
    return bits_to_bytes(bits)


def _rice_decode(buf: np.ndarray, k: int, b: int, d: int) -> np.ndarray:
    if buf.size * 8 < k * (1 + b):
        raise FormatError(f"rice positions: {buf.size} bytes cannot hold {k} codes of >= {1 + b} bits")
    q, end = read_unary(buf, 0, k)
    used = end + k * b
    if used > 8 * buf.size:
        raise FormatError("rice positions: remainders run past the end of the section")
    check_padding(buf, used, "rice positions")
    if int(q.max()) > (d >> b):
        raise FormatError("rice positions: a gap exceeds d")
    r = unpack_fields(buf, end, k, b) if b else np.zeros(k, np.int64)
    g = (q << b) | r
    # each gap is < 3d but k gaps can overflow int64: bound their sum (in float) before the cumsum;
    # the exact check p[-1] < d follows in _validate_decoded.
    if float(g.sum(dtype=np.float64)) > 2.0 * d:
        raise FormatError("rice positions: gaps sum past d")
    return np.cumsum(g + 1) - 1


def _ef_low_bits(d: int, k: int) -> int:
    return int(math.floor(math.log2(d / k))) if 0 < k < d else 0


def _ef_encode(p: np.ndarray, d: int) -> bytes:
    """Layout: k l-bit low parts, then an upper bit vector of length k + ((d-1) >> l) + 1 with bit
    (p_i >> l) + i set, zero padding.  The length is a function of (d, k) alone."""
    k = p.size
    l = _ef_low_bits(d, k)
    n_upper = k + ((d - 1) >> l) + 1
    bits = np.zeros(k * l + n_upper, np.uint8)
    if l:
        write_fields(bits, np.arange(k, dtype=np.int64) * l, p & ((1 << l) - 1), np.full(k, l))
    bits[k * l + (p >> l) + np.arange(k)] = 1
    return bits_to_bytes(bits)


def _ef_decode(buf: np.ndarray, d: int, k: int) -> np.ndarray:
    l = _ef_low_bits(d, k)
    n_upper = k + ((d - 1) >> l) + 1
    _expect_len(buf, (k * l + n_upper + 7) // 8, "Elias-Fano positions")
    check_padding(buf, k * l + n_upper, "Elias-Fano positions")
    ones, more = set_bits(buf, k * l, k * l + n_upper, k)
    if more or ones.size != k:
        raise FormatError(f"Elias-Fano positions: {'more' if more else ones.size} upper bits set, expected {k}")
    high = ones - k * l - np.arange(k)
    low = unpack_fields(buf, 0, k, l) if l else np.zeros(k, np.int64)
    return (high << l) | low


# ---- validation ---------------------------------------------------------------------------------

def _check_positions(p: np.ndarray, d: int) -> None:
    if not (isinstance(d, (int, np.integer)) and 0 <= d <= _MAX_D):
        raise ParameterError(f"dimension must be an integer in [0, 2**48], got {d!r}")
    if p.size > d:
        raise ParameterError(f"{p.size} positions in a vector of {d}")
    if p.size and (p[0] < 0 or p[-1] >= d or np.any(np.diff(p) <= 0)):
        raise ParameterError("positions must be strictly increasing and in [0, d)")


def _validate_decoded(p: np.ndarray, d: int) -> None:
    if p.size and (int(p[0]) < 0 or int(p[-1]) >= d or bool(np.any(np.diff(p) <= 0))):
        raise FormatError("decoded positions are not strictly increasing in [0, d)")


# ---- top-k selection and codec header helpers ------------------------------------------------------

def keep_count(keep: float, n: int) -> int:
    """ceil(keep * n), at least 1 when n > 0 (B-MUCSC's d0, top-k's k)."""
    return min(n, max(1, math.ceil(keep * n))) if n else 0


def top_k(x: np.ndarray, k: int) -> np.ndarray:
    """Sorted positions of the (at most) k elements of largest |x|, never a zero element.

    Fewer than k come back when x has fewer than k non-zeros (the rest decode to 0 anyway, so sending
    their positions would only cost bytes).  Updates are often mostly zeros (frozen layers, sparse
    gradients); np.argpartition over many tied zeros is slow (265 ms against 6 ms on a 99.7%-zero
    update), so when at most half the elements are non-zero the selection runs over the non-zeros.
    """
    n = x.size
    if k == 0 or n == 0:
        return np.zeros(0, np.int64)
    nnz = int(np.count_nonzero(x))
    if nnz <= k or 2 * nnz <= n:
        nz = np.flatnonzero(x)
        if nnz <= k:
            return nz.astype(np.int64, copy=False)
        part = np.argpartition(np.abs(x[nz]), nnz - k)[nnz - k:]
        return np.sort(nz[part]).astype(np.int64, copy=False)
    # the k-th largest magnitude by an in-place partition of one |x| copy (argpartition would add an
    # int64 index array of n), then the positions above it and, in order, enough of those equal to it
    a = np.abs(x)
    a.partition(n - k)
    t = a[n - k]
    del a
    above = np.flatnonzero(np.abs(x) > t)
    if above.size < k:
        tied = np.flatnonzero(np.abs(x) == t)[: k - above.size]
        above = np.sort(np.concatenate([above, tied]))
    return above.astype(np.int64, copy=False)


def header_params(c: Coded) -> dict:
    """The header keys recording a position coding: ``pos`` (method) and ``pos_arg``."""
    return {"pos": c.method, "pos_arg": c.arg}


def decode_from_header(params, data, d: int, k: int) -> np.ndarray:
    """Decode positions described by header keys ``pos``/``pos_arg`` (untrusted)."""
    method = params.get("pos")
    arg = params.get("pos_arg")
    if method not in METHODS:
        raise FormatError(f"header parameter 'pos' must be one of {METHODS}, got {method!r}")
    if isinstance(arg, bool) or not isinstance(arg, int):
        raise FormatError(f"header parameter 'pos_arg' must be an integer, got {arg!r}")
    return decode(data, d, k, method, arg)
