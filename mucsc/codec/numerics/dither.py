"""Subtractive dither on a uniform grid (``mucsc`` with ``rounding="dithered"``, spec/FORMAT.md 4.5).

Element i gets a uniform v_i on [0, 1) from the counter-based stream of FORMAT.md 4.3 (its key is in
the message, so the receiver regenerates v at no byte cost).  The sender sends
q_i = floor((x_i - offset) / step + v_i); the receiver outputs offset + (q_i + (1/2 - v_i) share) step.
With share = 1 it subtracts the whole dither u_i = (v_i - 1/2) step that the sender added before
rounding to the nearest grid point: the error is uniform on (-step/2, step/2], independent of x
(Schuchman's condition: the dither spans exactly one cell), variance step^2 / 12 per element whatever
x is, half the average step^2 / 6 of stochastic rounding to the same grid.  With share = 0 it is
stochastic rounding to the grid (q_i is k + 1 with probability f_i, the fraction of x_i's cell below
it), variance step^2 f_i (1 - f_i): far smaller for the elements near a grid point (the near-zero
bulk of a sparse update).  Every share in [0, 1] is unbiased (E[q_i] = (x_i - offset) / step and
E[1/2 - v_i] = 0); element i's variance is step^2 (f_i (1 - f_i) (1 - share) + share^2 / 12)
(Cov(q_i, v_i) = f_i (1 - f_i) / 2), so the share minimising the total is 6 mean f (1 - f), at most
1 (:func:`best_share`).  The indices, hence the bytes, do not depend on the share.  The indices are entropy-coded
conditioned on the top bits of v_i (the *context*): the receiver knows v_i, and at low rates it
narrows q_i to about two values (measured, Gaussian at 1 bit: 0.98 -> 0.72 bits per index with 8
contexts).

Pure functions of arrays: the stream, the grid, the index alphabet (with an escape for the tails),
and the size estimates that rate control chooses with.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from mucsc.codec import kernels
from mucsc.codec.wire import rans

__all__ = ["stream", "contexts", "context_counts", "by_context", "from_contexts", "quantize", "rounded", "Histogram", "symbols_by_context", "dequantize", "straddle", "best_share", "variance", "Alphabet", "choose_alphabet",
           "chosen_alphabet", "zigzag_varints", "read_zigzag_varints", "ZigzagReader", "estimated_bytes", "expected_choice", "MAX_INDEX", "MAX_SYMBOLS",
           "MAX_CONTEXTS"]

MAX_INDEX = 1 << 52  # |q| at most this: q + 1/2 is exact in float64
MAX_SYMBOLS = 1 << 16  # the index alphabet (escape included)
MAX_CONTEXTS = 64
CONTEXT_CHOICES = (1, 2, 4, 8, 16)  # what the reference encoder tries
FINE = CONTEXT_CHOICES[-1]  # the finest contexts: every coarser choice is a union of them
JOINT_MAX = 1 << 22  # cells of the (finest context, distinct index) histogram kept in memory
MIN_PER_VALUE = 8  # expected_choice's model applies down to this many elements per index value
MANTISSA = 53
SHARE_QUANTUM = 2.0**-16  # the chosen share's resolution (:func:`best_share`)


def stream(key: int, n: int, start: int = 0) -> np.ndarray:
    """t_i = w_i >> 11 for start <= i < start + n (uint64, 53 bits): FORMAT.md 4.3's stream with
    state ``key`` (position-addressable: a decoder regenerates it a chunk at a time);
    v_i = t_i 2^-53 is element i's uniform."""
    if n == 0:
        return np.zeros(0, np.uint64)
    return kernels.splitmix64(key, start, n, shift=64 - MANTISSA)


def uniforms(t: np.ndarray) -> np.ndarray:
    """v_i = t_i 2^-53 (float64, exact)."""
    return t.astype(np.float64) * 2.0**-MANTISSA


def contexts(t: np.ndarray, count: int) -> np.ndarray:
    """Element i's context floor(v_i * count) = (t_i * count) >> 53, exact integer arithmetic."""
    if count == 1:
        return np.zeros(t.size, np.intp)
    return ((t * np.uint64(count)) >> np.uint64(MANTISSA)).astype(np.intp)


def _c_route(sym: np.ndarray, count: int) -> Callable | None:
    """The compiled ``context_route`` where it moves these symbols between index and context order,
    else None (the numpy twin runs)."""
    route = kernels.compiled("context_route")
    return route if route is not None and sym.dtype == np.uint32 and count <= MAX_CONTEXTS else None


def context_counts(t: np.ndarray, count: int) -> np.ndarray:
    """How many elements each context 0 .. count - 1 holds (int64)."""
    kernel = kernels.compiled("context_counts")
    if kernel is not None and 1 <= count <= MAX_CONTEXTS:
        out = np.empty(count, np.int64)
        kernel(np.ascontiguousarray(t, np.uint64), count, out)
        return out
    return np.bincount(contexts(t, count), minlength=count).astype(np.int64)


def by_context(sym: np.ndarray, t: np.ndarray, count: int) -> list[np.ndarray]:
    """The symbols of each context 0 .. count - 1, in index order within each (one stable sort)."""
    if count == 1:
        return [sym]
    route = _c_route(sym, count)
    if route is not None:
        ordered = np.empty_like(sym)
        counts = route(np.ascontiguousarray(t, np.uint64), count, np.ascontiguousarray(sym), ordered, True)
        return np.split(ordered, np.cumsum(counts)[:-1])
    ctx = contexts(t, count).astype(np.uint8)
    ordered = sym[np.argsort(ctx, kind="stable")]
    return np.split(ordered, np.cumsum(np.bincount(ctx, minlength=count))[:-1])


def from_contexts(ordered: np.ndarray, t: np.ndarray, count: int) -> np.ndarray:
    """Inverse of :func:`by_context`: the symbols in index order from their concatenation in context
    order (``ordered``, as many as ``t``)."""
    if count == 1:
        return ordered
    route = _c_route(ordered, count)
    if route is not None:
        sym = np.empty_like(ordered)
        route(np.ascontiguousarray(t, np.uint64), count, ordered, sym, False)
        return sym
    ctx = contexts(t, count).astype(np.uint8)
    sym = np.empty_like(ordered)
    sym[np.argsort(ctx, kind="stable")] = ordered
    return sym


def quantize(x: np.ndarray, step: float, offset: float, v: np.ndarray) -> np.ndarray:
    """q_i = floor((x_i - offset) / step + v_i), every operation in float64 rounded to nearest
    (x widened exactly): what every encoder must compute (FORMAT.md 4.5)."""
    y = np.subtract(x, offset, dtype=np.float64)
    np.divide(y, step, out=y)
    np.add(y, v, out=y)
    np.floor(y, out=y)
    return y.astype(np.int64)


def rounded(x: np.ndarray, step: float, offset: float, t: np.ndarray, straddled: bool = True,
            bounds: tuple[float, float] | None = None) -> tuple[np.ndarray, float, "Histogram | None"]:
    """(:func:`quantize` of x with the uniforms of ``t``, :func:`straddle` of x or 0.0 without
    ``straddled``, the indices' histogram per finest context for :func:`choose_alphabet` or None):
    one compiled pass over x where the kernels are built (the straddle summed in numpy's pairwise
    order), else the numpy functions.  ``bounds``: (min x, max x), which bound the indices
    (every index lies in floor((min - offset) / step) .. floor((max - offset) / step) + 1), so the
    histogram is counted in the same pass.  The same numbers either way."""
    kernel = kernels.compiled("dither_quantize")
    if kernel is not None and x.dtype in (np.float32, np.float64) and x.size:
        x = np.ascontiguousarray(x)
        q = np.empty(x.size, np.int64)
        base, joint = 0, None
        if bounds is not None and all(map(math.isfinite, bounds)):
            base = math.floor((bounds[0] - offset) / step)
            span = math.floor((bounds[1] - offset) / step) + 2 - base
            if 1 <= span <= max(4 * x.size, 1 << 16) and FINE * span <= JOINT_MAX:
                joint = np.empty((FINE, span), np.int64)
        got = kernel(x, np.ascontiguousarray(t, np.uint64), float(step), float(offset), q, base, FINE, joint)
        if got is not None:  # the straddle summed in numpy's pairwise order, as :func:`straddle`
            return q, (got[2] if straddled else 0.0), (None if joint is None else Histogram(*got[:2], base, joint))
    q = quantize(x, step, offset, uniforms(t))
    return q, (straddle(x, step, offset) if straddled else 0.0), None


class Histogram(NamedTuple):
    """The indices' range (q_min .. q_max) and their histogram per finest context, ``joint``:
    FINE rows, column j for index base + j (the columns beyond the range are empty)."""

    q_min: int
    q_max: int
    base: int
    joint: np.ndarray


def symbols_by_context(alpha: "Alphabet", q: np.ndarray, t: np.ndarray, count: int,
                       counts: np.ndarray | None = None) -> tuple[list[np.ndarray], np.ndarray]:
    """(the symbols of each context 0 .. count - 1 in index order, the escaped q in index order):
    :meth:`Alphabet.split` then :func:`by_context`, in one compiled pass where the kernels are built.
    ``counts``: the symbols' counts per context (:func:`chosen_alphabet`'s), which save the kernel
    its counting pass (it checks them)."""
    kernel = kernels.compiled("dither_split")
    if kernel is not None and 1 <= count <= MAX_CONTEXTS and q.size:
        ordered = np.empty(q.size, np.uint32)
        per = None
        if counts is not None:
            per = np.append(counts.sum(1), counts[:, alpha.inner].sum() if alpha.escape else 0).astype(np.int64)
        per, esc = kernel(np.ascontiguousarray(q, np.int64), np.ascontiguousarray(t, np.uint64),
                          count, alpha.q_lo, alpha.inner, alpha.escape, ordered, per)
        return np.split(ordered, np.cumsum(per)[:-1]), np.frombuffer(esc, np.int64)
    sym, esc = alpha.split(q)
    return by_context(sym, t, count), esc


def dequantize(q: np.ndarray, step: float, offset: float, v: np.ndarray, dtype, share: float = 1.0) -> np.ndarray:
    """(q_i + (1/2 - v_i) share) step + offset in float64, in that order, then cast to ``dtype``
    (1/2 - v_i is exact; with share 1 this is ((q_i + 1/2) - v_i) step + offset bit for bit)."""
    y = np.subtract(0.5, v)
    np.multiply(y, share, out=y)
    np.add(y, q, out=y)
    np.multiply(y, step, out=y)
    np.add(y, offset, out=y)
    return y.astype(dtype, copy=False)


def straddle(x: np.ndarray, step: float, offset: float) -> float:
    """sum_i f_i (1 - f_i), f_i = frac((x_i - offset) / step) (float64): the stochastic-rounding part
    of the variance, in units of step^2."""
    a = np.subtract(x, offset, dtype=np.float64)
    np.divide(a, step, out=a)
    f = np.subtract(a, np.floor(a))
    np.multiply(f, 1.0 - f, out=f)
    return float(f.sum())  # numpy's pairwise sum, not np.dot: BLAS sums in an order set by its threads


def best_share(n: int, straddled: float) -> float:
    """The share of the dither to subtract that minimises the variance: 6 mean f (1 - f), at most 1
    (1 for an empty vector), rounded to a multiple of ``SHARE_QUANTUM``: GRID carries the share, and
    the last bits of the sum f (1 - f) depend on the order it was summed in (threads, backends,
    other implementations); rounded, they change the bytes only when the exact value lies within
    those bits of a rounding boundary.  Costs nothing measurable: J is flat at its minimum."""
    if not n:
        return 1.0
    return round(min(1.0, 6.0 * straddled / n) / SHARE_QUANTUM) * SHARE_QUANTUM


def variance(n: int, step: float, share: float = 1.0, straddled: float = 0.0) -> float:
    """The expected squared error summed over the n elements, for every x:
    step^2 (straddled (1 - share) + n share^2 / 12); n step^2 / 12 with the whole dither subtracted."""
    return step * step * (straddled * (1.0 - share) + n * share * share / 12.0)


# ------------------------------------------------------------------------------------------------
# The index alphabet: q_lo .. q_lo + inner - 1 as symbols 0 .. inner - 1, the rest escaped
# ------------------------------------------------------------------------------------------------


class Alphabet:
    """Symbols of the indices: q - q_lo for q_lo <= q < q_lo + inner, else the escape symbol
    ``inner`` (only when ``escape``), whose q is sent in QESC."""

    def __init__(self, q_lo: int, inner: int, escape: bool):
        self.q_lo, self.inner, self.escape = int(q_lo), int(inner), bool(escape)

    @property
    def symbols(self) -> int:
        return self.inner + int(self.escape)

    def split(self, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(symbols, the escaped q in index order)."""
        s = q - self.q_lo
        out = (s < 0) | (s >= self.inner)
        if not self.escape:
            assert not out.any(), "an index outside an alphabet without escape"
            return s.astype(np.uint32), q[:0]
        s[out] = self.inner
        return s.astype(np.uint32), q[out]


def _varint_len(v: np.ndarray) -> np.ndarray:
    """Bytes of each LEB128 varint of the non-negative int64 ``v``."""
    bits = np.maximum(1, np.floor(np.log2(np.maximum(v, 1).astype(np.float64))).astype(np.int64) + 1)
    return (bits + 6) // 7


def zigzag(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, np.int64)
    return ((v << 1) ^ (v >> 63)).astype(np.uint64)


def zigzag_varints(v: np.ndarray) -> bytes:
    """LEB128 varints of the zigzag codes (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...) of ``v``."""
    out = bytearray()
    for z in zigzag(v).tolist():
        while z >= 0x80:
            out.append((z & 0x7F) | 0x80)
            z >>= 7
        out.append(z)
    return bytes(out)


class ZigzagReader:
    """Zigzag LEB128 varints read from ``buf`` a part at a time (each |value| <= ``limit``), so a
    decoder holds only the part it is filling; :meth:`take` and :meth:`finish` return a string
    saying what is wrong where the bytes do not fit (the caller raises it as its error type)."""

    def __init__(self, buf: bytes | memoryview, limit: int):
        self.b, self.limit, self.pos, self.count = bytes(buf), limit, 0, 0

    def take(self, count: int) -> np.ndarray | str:
        """The next ``count`` values (int64)."""
        b, limit, pos = self.b, self.limit, self.pos
        vals = np.zeros(count, np.int64)
        for i in range(count):
            z, shift = 0, 0
            while True:
                if pos >= len(b):
                    return f"escaped index {self.count + i} runs past the end of the section"
                byte = b[pos]
                pos += 1
                z |= (byte & 0x7F) << shift
                if z > 2 * limit + 1:
                    return f"escaped index {self.count + i} exceeds {limit}"
                if not byte & 0x80:
                    break
                shift += 7
            vals[i] = (z >> 1) ^ -(z & 1)
        self.pos, self.count = pos, self.count + count
        return vals

    def finish(self) -> str | None:
        """None when every byte was read, else what is left."""
        return None if self.pos == len(self.b) else f"{len(self.b) - self.pos} bytes after the {self.count} escaped indices"


def read_zigzag_varints(buf: bytes | memoryview, count: int, limit: int) -> np.ndarray | str:
    """``count`` zigzag varints filling ``buf`` exactly, each |value| <= ``limit``; a string saying
    what is wrong otherwise (the caller raises it as its error type)."""
    reader = ZigzagReader(buf, limit)
    vals = reader.take(count)
    return vals if isinstance(vals, str) else (reader.finish() or vals)


# ------------------------------------------------------------------------------------------------
# Size estimates (rate control) and the choice of the alphabet and the contexts
# ------------------------------------------------------------------------------------------------


def _table_bytes(counts: np.ndarray, n: int, S: int) -> np.ndarray:
    """Estimated varint bytes of each symbol's frequency (counts scaled to 2^S; 1 byte for zero)."""
    f = np.where(counts > 0, np.maximum(1, counts * float(1 << S) / max(n, 1)), 0)
    return _varint_len(f.astype(np.int64))


def _coded_bytes(hist: np.ndarray) -> float:
    """Estimated QIDX bytes of per-context symbol histograms ``hist`` (contexts x symbols): each
    context an IDSA payload (rans.estimated_size's model) plus its 4-byte length."""
    total = 1.0
    for counts in hist:
        n = int(counts.sum())
        used = counts > 0
        S = rans.scale_bits_for(int(used.sum()))
        W = rans.lanes_for(n)
        if n:
            f = rans.normalize(counts, S)
            bits = kernels.dot(counts[used], S - np.log2(f[used]))
            table = len(rans._varints(f))
        else:
            bits, table = 0.0, 1 + counts.size - 1
        total += 4 + 2 + table + 8 * W + math.ceil(bits / 8) + W
    return total


def choose_alphabet(q: np.ndarray, t: np.ndarray, hist: Histogram | None = None) -> tuple[Alphabet, int, float]:
    """(alphabet, contexts, estimated bytes of QIDX + QESC): :func:`chosen_alphabet` without its counts."""
    return chosen_alphabet(q, t, hist)[:3]


def chosen_alphabet(q: np.ndarray, t: np.ndarray, hist: Histogram | None = None
                    ) -> tuple[Alphabet, int, float, np.ndarray]:
    """(alphabet, contexts, estimated bytes of QIDX + QESC, the symbols' counts per context: int64,
    contexts x symbols, what each context's IDSA table is made from) minimising the estimate: a contiguous
    range around the bulk of the indices (the tails beyond it escaped when that is cheaper than
    table entries for them), chosen with one context, then 1..16 contexts for it (more contexts:
    sharper tables, more tables to send).  ``hist``: the histogram :func:`rounded` counted."""
    n = q.size
    if n == 0:
        return Alphabet(0, 1, False), 1, _coded_bytes(np.zeros((1, 1), np.int64)), np.zeros((1, 1), np.int64)
    if hist is not None:  # the same histograms as below (the range is within 4 n and FINE m <= JOINT_MAX)
        qmin, qmax = hist.q_min, hist.q_max
        joint = hist.joint[:, qmin - hist.base: qmax - hist.base + 1]
        counts = joint.sum(0)
        keep = counts > 0
        values, counts, joint = np.arange(qmin, qmax + 1)[keep], counts[keep], joint[:, keep]
        return _choose(values, counts, lambda c, col, cols: _columns(joint.reshape(c, FINE // c, -1).sum(1), col, cols),
                       _coded_sizes)
    qmin, qmax = int(q.min()), int(q.max())
    span = qmax - qmin + 1
    if span <= max(4 * n, 1 << 16) and span <= 1 << 24:
        counts = np.bincount(q - qmin, minlength=span)
        keep = counts > 0
        values, counts = np.arange(qmin, qmax + 1)[keep], counts[keep]
        inv = (np.cumsum(keep) - 1)[q - qmin]  # each index's rank among the distinct values
    else:  # sparse: the distinct indices only
        values, inv, counts = np.unique(q, return_inverse=True, return_counts=True)
    fine = contexts(t, FINE)
    m = values.size
    joint = (np.bincount(fine * m + inv, minlength=FINE * m).reshape(FINE, m) if FINE * m <= JOINT_MAX
             else None)

    def by_context(c: int, col: np.ndarray, cols: int) -> np.ndarray:
        """c x cols: the indices per context (floor(v c)) and symbol (``col`` of each distinct value)."""
        if joint is None:
            return np.bincount((fine >> (FINE.bit_length() - c.bit_length())) * cols + col[inv],
                               minlength=c * cols).reshape(c, cols)
        return _columns(joint.reshape(c, FINE // c, m).sum(1), col, cols)

    return _choose(values, counts, by_context, _coded_sizes)


def _columns(h: np.ndarray, col: np.ndarray, cols: int) -> np.ndarray:
    """Rows of ``h`` (per distinct value) summed into ``cols`` columns: value i into column col[i]
    (one bincount over every row: each cell summed in value order, as a bincount per row sums it)."""
    rows = h.shape[0]
    at = (np.arange(rows)[:, None] * cols + col).ravel()
    return np.bincount(at, weights=h.ravel(), minlength=rows * cols).reshape(rows, cols).astype(h.dtype, copy=False)


def _choose(values: np.ndarray, counts: np.ndarray, by_context, coded
            ) -> tuple[Alphabet, int, float, np.ndarray]:
    """The alphabet and contexts minimising ``coded`` bytes (+ QESC's) of the distinct indices
    ``values`` (sorted) occurring ``counts`` times, and their histogram (contexts x symbols);
    ``by_context(c, col, cols)`` gives their histogram per context and symbol (realised or expected:
    :func:`expected_choice`); ``coded`` sizes a list of histograms at once.  Ties go to the
    earlier candidate (the ranges in :func:`_candidate_ranges`' order, then fewer contexts)."""
    cands = []
    for alpha in _candidate_ranges(values, counts):
        s = values - alpha.q_lo
        out = (s < 0) | (s >= alpha.inner)
        col = np.where(out, alpha.inner, s)
        esc = (32 + kernels.dot(counts[out], _varint_len(zigzag(values[out] - alpha.q_lo).astype(np.int64)))
               if alpha.escape else 0.0)
        cands.append((alpha, col, esc, np.bincount(col, weights=counts, minlength=alpha.symbols).astype(counts.dtype)[None]))
    sizes = coded([h for *_, h in cands])
    i = min(range(len(cands)), key=lambda i: (sizes[i] + cands[i][2], i))
    alpha, col, esc, hist = cands[i]
    best = (alpha, 1, sizes[i] + esc, hist)
    hists = [by_context(c, col, alpha.symbols) for c in CONTEXT_CHOICES[1:]]
    for c, size, h in zip(CONTEXT_CHOICES[1:], coded(hists), hists):
        if size + esc < best[2]:
            best = (alpha, c, size + esc, h)
    return best


def _coded_sizes(hists: list[np.ndarray]) -> list[float]:
    """:func:`_coded_bytes` of each of ``hists``."""
    return [_coded_bytes(h) for h in hists]


def expected_choice(xs: np.ndarray, w: np.ndarray | None, step: float
                    ) -> tuple[Alphabet, int, float, float] | None:
    """What :func:`choose_alphabet` is expected to choose for x on the grid k ``step`` (offset 0), from
    a sample ``xs`` of x (weights ``w``, summing to x's size; None: all 1) without drawing the
    dither: (alphabet, contexts, estimated QIDX + QESC bytes, expected straddle sum f (1 - f)).
    Element y = x / step = k + f goes to k + 1 iff v >= 1 - f, so in the finest context j (v in
    [j, j + 1) / FINE, probability 1 / FINE) with probability clip(FINE f - (FINE - 1 - j), 0, 1):
    per index value and context the expected count follows from each element's cell a = floor(FINE f)
    and remainder FINE f - a.  None when the indices take more than JOINT_MAX / FINE values, or
    fewer than MIN_PER_VALUE elements a value on average (there the realised histogram, mostly ones,
    is far from the expected one, and the alphabet chosen from it too)."""
    cell, W, B, G = _cells(xs, w, FINE / step)
    k, a = np.divmod(cell, FINE)
    # f = (a + b) / FINE: the sum of f (1 - f) from each cell's weight, sum of b and of b^2
    straddled = float(np.sum((a * W + B) / FINE - (a * a * W + 2 * a * B + G) / FINE**2))
    new_k = np.concatenate(([True], k[1:] != k[:-1]))
    ks, row = k[new_k], np.cumsum(new_k) - 1
    values = np.union1d(ks, ks + 1)
    if values.size * FINE > JOINT_MAX or values.size * MIN_PER_VALUE > W.sum():
        return None
    Wk, Bk = np.zeros((ks.size, FINE)), np.zeros((ks.size, FINE))
    Wk[row, a], Bk[row, a] = W, B
    above = np.zeros((ks.size, FINE + 1))  # above[:, a] = the weight in cells a.. of each k
    above[:, :FINE] = np.cumsum(Wk[:, ::-1], axis=1)[:, ::-1]
    j = np.arange(FINE)
    up = (above[:, FINE - j] + Bk[:, FINE - 1 - j]) / FINE  # k x j: to k + 1 in context j
    H = np.zeros((FINE, values.size))
    H[:, np.searchsorted(values, ks)] = (Wk.sum(1)[:, None] / FINE - up).T
    H[:, np.searchsorted(values, ks + 1)] += up.T
    counts = H.sum(0)
    keep = counts > 0
    values, counts, H = values[keep], counts[keep], H[:, keep]

    def by_context(c: int, col: np.ndarray, cols: int) -> np.ndarray:
        return _columns(H.reshape(c, FINE // c, -1).sum(1), col, cols)

    return (*_choose(values, counts, by_context, _expected_coded_sizes)[:3], straddled)


def _cells(xs: np.ndarray, w: np.ndarray | None, scale: float
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The occupied cells of the sorted sample ``xs`` on the grid 1 / ``scale`` (z = floor(xs scale),
    each run of equal z a cell, in order) -> (z, weight, sum of b w, sum of (b w)^2 / w) per cell,
    b = xs scale - z the remainder (without weights: count, sum of b, sum of b^2); sums as
    np.add.reduceat's.  One compiled pass where the kernels are built (the same numbers)."""
    kernel = kernels.compiled("dither_cells")
    if kernel is not None and xs.size and xs.dtype == np.float64:
        n = xs.size
        cell, W, B, G = np.empty(n, np.int64), np.empty(n), np.empty(n), np.empty(n)
        m = kernel(np.ascontiguousarray(xs), None if w is None else np.ascontiguousarray(w, np.float64), scale,
                   cell, W, B, G)
        if m >= 0:
            return cell[:m], W[:m], B[:m], G[:m]
    g = np.multiply(xs, scale)
    z = np.floor(g)
    g -= z  # the remainder within the cell
    cell = z.astype(np.int64)  # ascending (xs is sorted): sum per occupied cell
    first = np.flatnonzero(np.concatenate(([True], cell[1:] != cell[:-1])))
    W = (np.diff(np.append(first, xs.size)).astype(np.float64) if w is None else np.add.reduceat(w, first))
    if w is not None:
        g *= w
    B = np.add.reduceat(g, first)
    g *= g if w is None else g / w
    return cell[first], W, B, np.add.reduceat(g, first)


def _expected_coded_sizes(hists: list[np.ndarray]) -> list[float]:
    """:func:`_coded_bytes` of each of the expected (float) per-context histograms ``hists``:
    rans.expected_size's model of each context's IDSA payload (its table from the proportional
    frequencies), every context of every histogram in one set of array operations (the rows padded
    with empty symbols to the widest, which the table bytes do not count)."""
    width = max(h.shape[1] for h in hists)
    rows = np.array([h.shape[0] for h in hists])
    h = np.zeros((int(rows.sum()), width))
    pad = np.empty(h.shape[0])
    at = 0
    for g in hists:
        h[at: at + g.shape[0], : g.shape[1]] = g
        pad[at: at + g.shape[0]] = width - g.shape[1]
        at += g.shape[0]
    used = h > 0
    total = h.sum(1)
    S = rans.scale_bits_for_each(used.sum(1))
    W = rans.lanes_for_each(np.rint(total))
    with np.errstate(divide="ignore", invalid="ignore"):
        f = np.maximum(1.0, np.rint(h * (np.exp2(S) / total)[:, None]))
        bits = np.where(used, h * (S[:, None] - np.log2(f)), 0.0).sum(1)
    table = np.where(used, 1 + (f >= 1 << 7) + (f >= 1 << 14) + (f >= 1 << 21), 1).sum(1) - pad
    per = 4 + np.where(total > 0, 2 + table + 9 * W + np.ceil(bits / 8), 3 + 9 * W)
    ends = np.cumsum(rows)
    return [1.0 + float(per[e - r: e].sum()) for r, e in zip(rows.tolist(), ends.tolist())]


def _candidate_ranges(values: np.ndarray, counts: np.ndarray) -> list[Alphabet]:
    """The full range of the indices (no escape) and the ranges spanning the indices that occur at
    least tau times, tau = 1, 2, 4, ... 64 (the rest escaped)."""
    lo, hi = int(values[0]), int(values[-1])
    out = []
    if hi - lo + 1 <= MAX_SYMBOLS:
        out.append(Alphabet(lo, hi - lo + 1, False))
    for tau in (1, 2, 4, 8, 16, 32, 64):
        keep = values[counts >= tau]
        if keep.size == 0:
            break
        a, b = int(keep[0]), int(keep[-1])
        if (a, b) == (lo, hi) or b - a + 2 > MAX_SYMBOLS:
            continue
        out.append(Alphabet(a, b - a + 1, True))
    if not out:  # indices too spread for any of these: the widest alphabet around the commonest
        mode = int(values[np.argmax(counts)])
        out.append(Alphabet(mode - MAX_SYMBOLS // 2 + 1, MAX_SYMBOLS - 1, True))
    return out


def estimated_bytes(x: np.ndarray, step: float, offset: float, t: np.ndarray, v: np.ndarray
                    ) -> tuple[float, Alphabet, int]:
    """(estimated QIDX + QESC bytes, alphabet, contexts) of the grid (step, offset) for x."""
    q = quantize(x, step, offset, v)
    alpha, c, size = choose_alphabet(q, t)
    return size, alpha, c


def fused_decode(key: int, c: int, states: tuple, q_lo: int, k: int, escape: bool, qesc: Any, step: float,
                 offset: float, share: float, y: np.ndarray) -> tuple | None:
    """One compiled pass of a dithered group's decode into ``y`` (the stream, the contexts, their
    rANS lanes from ``states``, the escapes ``qesc`` and the dequantisation): (code, escape bytes
    read, the contexts' counts); None where that kernel is not built or ``y`` is not float32/64
    (the caller decodes in passes)."""
    decode = kernels.compiled("dither_decode")
    if decode is None or y.dtype not in (np.float32, np.float64) or not y.size:
        return None
    return decode(key, c, states, q_lo, k, escape, qesc, step, offset, share, y)
