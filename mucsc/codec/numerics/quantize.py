"""MUCSC stochastic rounding (paper eq. 7) against wire centroids, and its inverse.

Each U_m in [r_z, r_{z+1}] becomes id z with probability (r_{z+1} - U_m) / (r_{z+1} - r_z) and z + 1
otherwise, so E[r_id] = U_m.  The probabilities use the centroids *as sent* (``wire_centroids``), so the
decoder's values are exactly the ones the expectation is taken over.

Hot path: the interval of each element comes from a uniform-grid lookup table plus one exact
correction (no full-size searchsorted), in cache-sized chunks with preallocated buffers.
"""

from __future__ import annotations

import math
import operator

import numpy as np

from mucsc.codec import kernels, parallel
from mucsc.errors import InputError, ParameterError

__all__ = [
    "wire_centroids",
    "stochastic_round",
    "dequantize",
    "interval_index",
    "expected_sq_error",
    "id_dtype",
    "draw_key",
]

WIRE_DTYPES = (np.float16, np.float32, np.float64)
_WIRE_DTYPES = tuple(np.dtype(t) for t in WIRE_DTYPES)
_WIRE_MAX = {t: float(np.finfo(t).max) for t in _WIRE_DTYPES}  # the largest finite value of each
F32_MAX = float(np.finfo(np.float32).max)
CHUNK = 1 << 15  # elements per chunk: all working buffers stay in L2
BITGRID_MIN_N = 1 << 17  # float32 inputs this long use the bit-pattern grid (its tables cost ~1 ms)


def id_dtype(z: int) -> np.dtype:
    """Smallest unsigned dtype holding ids 0..z-1."""
    if z <= 1 << 8:
        return np.dtype(np.uint8)
    if z <= 1 << 16:
        return np.dtype(np.uint16)
    return np.dtype(np.uint32)


# --------------------------------------------------------------------------------------------------
# Wire centroids
# --------------------------------------------------------------------------------------------------


def wire_centroids(c: np.ndarray, x: np.ndarray, dtype=np.float32, *,
                   bounds: tuple[float, float] | None = None) -> np.ndarray:
    """``c`` rounded to the wire dtype, strictly increasing and still bracketing [min x, max x].

    Rounding may merge neighbours (duplicates are dropped) or move an end inward (it is moved outward
    with nextafter).  Raises InputError if the data range does not fit the wire dtype (float16).
    ``bounds``: the exact (min x, max x) when the caller has them (saves two passes over x).
    """
    dt = np.dtype(dtype)
    top = _WIRE_MAX.get(dt)  # the largest finite value of a wire dtype (None: not one)
    if top is None:
        raise ParameterError(f"wire dtype must be float16, float32 or float64, got {dt}")
    c = np.asarray(c, dtype=np.float64)
    x = None if x is None else np.asarray(x)  # None: the data lives elsewhere, ``bounds`` describe it
    if c.ndim != 1 or c.size == 0:
        raise ParameterError("centroids must be a non-empty 1-D array")
    if bounds is not None and (x is None or x.size):
        lo, hi = float(bounds[0]), float(bounds[1])
    elif x is not None and x.size:
        lo, hi = float(x.min()), float(x.max())
    else:
        lo, hi = float(c[0]), float(c[-1])
    # the small table's checks on Python floats (exact: float64 holds every wire value), not numpy
    # calls on a 16-element array (~1 us each, a dozen of them, in every encode)
    levels = c.tolist()
    # no level overflows the wire dtype (min and max skip a NaN only after a number, and a NaN
    # does not overflow)
    if -top <= min(levels) and max(levels) <= top:
        w = c.astype(dt)
    else:
        with np.errstate(over="ignore"):
            w = c.astype(dt)
    wl = w.tolist()
    if not all(map(operator.lt, wl, wl[1:])):  # strictly increasing: already np.unique's result
        w = np.unique(w)
        wl = w.tolist()
    if not (wl[0] <= lo and wl[-1] >= hi):  # rounding moved an end inward (or NaN): step it outward
        first, last = _outward(w[0], lo, -1), _outward(w[-1], hi, +1)
        if w.size == 1 and first != last:  # one level that rounding moved off the data: bracket it
            w = np.array([first, last], dtype=dt)
        else:
            w[0], w[-1] = first, last
        wl = [float(w[0]), float(w[-1])]
    # w is sorted (strictly increasing, or np.unique's, NaN last): finite when its ends are
    if not (math.isfinite(wl[0]) and math.isfinite(wl[-1])):
        raise InputError(f"data range [{lo:g}, {hi:g}] does not fit the wire dtype {dt}")
    return w


def _outward(v, target: float, direction: int):
    """Step v (a wire-dtype scalar) outward until it is on the far side of ``target``."""
    if (float(v) <= target) if direction < 0 else (float(v) >= target):
        return v  # the usual case: no step (and no np.errstate, ~3 us)
    # The steps end at the first wire value on the far side of target, which is the wire value
    # nearest target or its neighbour outward: start there (not NaN) instead of at v, since given
    # levels far inside the data took one step per representable value between (~2^30 in float32);
    # a NaN v stays (no step moves it: the caller refuses it)
    with np.errstate(over="ignore"):
        if target == target and v == v:
            v = v.dtype.type(target)
        inf = v.dtype.type(np.inf)
        while (float(v) > target) if direction < 0 else (float(v) < target):
            v = np.nextafter(v, -inf if direction < 0 else inf)
    return v


# --------------------------------------------------------------------------------------------------
# Interval lookup
# --------------------------------------------------------------------------------------------------


class _Tables:
    """What both grids share: per-bin interval ``k``, its lower level ``cb`` and width ``wb``."""

    def _set_tables(self, k: np.ndarray) -> None:
        self.kb = k.astype(self.kdt)
        self.cb = self.c[k]
        self.wb = self.width[k]
        self.k = k

    def float64_tables(self, c64: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(c_k, c_{k+1}) per bin in float64, for J alongside float32 rounding."""
        return c64[self.k], c64[self.k + 1]


class _Grid(_Tables):
    """Per-bin tables of a uniform grid over [c_0, c_{Z-1}]: interval, its lower level and its width.

    bin(x) = floor((x - c_0) * scale) is computed with the same floating-point operations for the data
    and for the levels.  Those operations are monotone, so a level whose bin is below bin(x) is < x and
    one whose bin is above is > x.  Hence ``k[b] = #{interior levels with bin < b}`` is the interval of
    every x in bin b except those at or above a level lying inside bin b; for them x - c_k >= c_{k+1} - c_k,
    which is how the rounding pass detects them (they are then located exactly, see ``_fixup``).
    """

    def __init__(self, c: np.ndarray, work: np.dtype, n: int):
        self.work = work
        self.c = c.astype(work)
        z = self.c.size
        self.kdt = id_dtype(z)
        self.width = np.diff(self.c)  # c_{k+1} - c_k in the working precision
        self.lo = self.c[0]
        with np.errstate(over="ignore"):  # a span beyond the work dtype: exact search instead (ok False)
            span = self.c[-1] - self.c[0]
        # enough bins that few elements share a bin with a level, but not more than the data needs
        nb = int(min(1 << 14 if z <= 1 << 8 else 1 << 16, max(1 << 8, 1 << max(n // 2, 1).bit_length())))
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            self.scale = work.type(nb) / span
        self.ok = bool(np.isfinite(span) and span > 0 and np.isfinite(self.scale) and self.scale > 0)
        if not self.ok:
            return
        bb = self.bins(self.c[1:-1])
        top = int(self.bins(self.c[-1:])[0])
        k = np.searchsorted(bb, np.arange(top + 1), side="left")
        self._set_tables(k)

    def bins(self, v: np.ndarray, t: np.ndarray | None = None, b: np.ndarray | None = None) -> np.ndarray:
        """Grid bin of each value (``t``, ``b``: optional work-dtype and intp output buffers)."""
        if t is None:
            t = np.empty(v.size, self.work)
            b = np.empty(v.size, np.intp)
        np.subtract(v, self.lo, out=t)
        np.multiply(t, self.scale, out=t)
        np.copyto(b, t, casting="unsafe")
        return b


class _BitGrid(_Tables):
    """Per-bin tables indexed by the top 16 bits of the float32 bit pattern (sign, exponent, 7 mantissa
    bits): 128 bins per octave at every scale, so levels crowded near zero or in heavy tails still fall
    in separate bins, and the bin is one shift of the raw bits (no arithmetic on the values).

    Each bin holds a contiguous range of values; ``k[b] = #{interior levels <= lowest value of bin b}``.
    As for ``_Grid``, only elements at or above a level inside their own bin (and above its lowest
    value) get a wrong k, and they show up as x - c_k >= c_{k+1} - c_k (then located exactly by
    ``_fixup``).  Counting a level equal to the bin's lowest value as below (side="right") keeps
    elements equal to it off that slow path: +0.0 and other values with 16 zero low bits
    (bfloat16-valued data), which are often levels and can be a large share of a checkpoint.
    """

    ok = True

    def __init__(self, c: np.ndarray, work=np.float32):
        self.work = np.dtype(work)
        self.c = c.astype(self.work)
        self.kdt = id_dtype(self.c.size)
        self.width = np.diff(self.c)
        h = np.arange(1 << 16, dtype=np.uint32)
        low_bits = np.where(h < 0x8000, h << np.uint32(16), (h << np.uint32(16)) | np.uint32(0xFFFF))
        with np.errstate(invalid="ignore"):
            low = low_bits.view(np.float32)  # NaN patterns: never hit by finite data
            k = np.searchsorted(self.c[1:-1], low, side="right")
        self._set_tables(k)

    def bins(self, v: np.ndarray, t: np.ndarray | None = None, b: np.ndarray | None = None) -> np.ndarray:
        """Table index of each float32 value: its bit pattern >> 16 (``t`` unused, ``b`` intp buffer)."""
        if b is None:
            b = np.empty(v.size, np.intp)
        np.right_shift(v.view(np.uint32), 16, out=b, casting="unsafe")
        return b


def grid_J(x: np.ndarray, c: np.ndarray) -> float:
    """Exact J of eq. 8-9 (float64 arithmetic, as ``centroids.variance_J``) for float32 ``x``: the
    intervals come from the bit-pattern grid (float64 tables) instead of a binary search per element."""
    c = np.asarray(c, dtype=np.float64)
    grid = _BitGrid(c, np.float64)
    J = 0.0
    step = CHUNK
    b = np.empty(step, np.intp)
    d = np.empty(step)
    g = np.empty(step)
    late = []
    for s in range(0, x.size, step):
        xc = x[s : s + step]
        L = xc.size
        bb, dd, gg = b[:L], d[:L], g[:L]
        grid.bins(xc, None, bb)
        np.take(grid.cb, bb, out=dd, mode="clip")
        np.subtract(xc, dd, out=dd)  # x - c_k (float64)
        np.take(grid.wb, bb, out=gg, mode="clip")
        m = dd >= gg
        if m.any():
            i = np.flatnonzero(m)
            late.append(i + s)
            dd[i] = 0.0  # recomputed exactly below
        np.subtract(gg, dd, out=gg)
        J += kernels.dot(dd, gg)
    if late:
        xs = x[np.concatenate(late)].astype(np.float64)
        k = interval_index(xs, c)
        J += kernels.dot(c[k + 1] - xs, xs - c[k])
    return J


def interval_index(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """k with c[k] <= x <= c[k+1] (k in 0..len(c)-2; a level value maps to the interval it starts)."""
    x = np.asarray(x)
    c = np.asarray(c)
    if c.size < 2:
        return np.zeros(x.size, dtype=np.intp)
    return np.searchsorted(c[1:-1], x, side="right")  # number of interior levels <= x


# --------------------------------------------------------------------------------------------------
# Stochastic rounding
# --------------------------------------------------------------------------------------------------


def _work_dtype(x: np.ndarray, c: np.ndarray) -> np.dtype:
    """float32 arithmetic when data and wire centroids are exact in float32 and every step
    c[k+1] - c[k] is finite in float32, else float64 (FORMAT.md 4.3).  A step overflows only when the
    data spans more than FLT_MAX (e.g. [-1.8e38, 1.8e38]); float32 arithmetic would then compare
    u * inf < x - c_k and send every element down, float64 differences of float32 values are exact."""
    if x.dtype == np.float32 and c.dtype == np.float32 and c.size and float(c[-1]) - float(c[0]) < F32_MAX:
        # sorted float32 levels whose span, rounded to float64, is below FLT_MAX: the exact span is
        # too (rounding is monotone and FLT_MAX a float64), so every step rounds to a finite float32
        return np.dtype(np.float32)
    if x.dtype == np.float32 and np.array_equal(c.astype(np.float32).astype(c.dtype), c):
        with np.errstate(over="ignore"):
            if np.all(np.isfinite(np.diff(c.astype(np.float32)))):
                return np.dtype(np.float32)
    return np.dtype(np.float64)


_DATA_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _check_inputs(x: np.ndarray, c: np.ndarray, bounds=None) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x)
    c = np.asarray(c)
    if x.dtype not in (np.float32, np.float64):
        raise InputError(f"stochastic_round needs float32 or float64 data, got {x.dtype}")
    if c.ndim != 1 or c.size == 0 or c.dtype.kind != "f":
        raise ParameterError("centroids must be a non-empty 1-D float array")
    if c.size > 1 and not np.all(c[1:] > c[:-1]):
        raise ParameterError("centroids must be strictly increasing")
    x = np.ascontiguousarray(x.reshape(-1))
    if x.size and c.size:
        lo, hi = (x.min(), x.max()) if bounds is None else bounds
        if lo < c[0] or hi > c[-1]:
            raise InputError("centroids do not bracket the data (use wire_centroids)")
    return x, c


def draw_key(rng: np.random.Generator) -> int:
    """The rounding step's only draw from the group's generator: the SplitMix64 key (FORMAT.md 4.3),
    ``rng.integers(0, 2**64, dtype=uint64)``.  That draw over the full 64-bit range is one raw
    output of the bit generator (numpy's bounded fill takes ``next_uint64`` as it is), which for
    PCG64, the API's generator, is ``random_raw()`` (~0.2 us instead of ~2 us)."""
    if type(rng) is np.random.Generator and type(rng.bit_generator) is np.random.PCG64:
        return int(rng.bit_generator.random_raw())
    return int(rng.integers(0, 1 << 64, dtype=np.uint64))


def stochastic_round(x: np.ndarray, c: np.ndarray, rng: np.random.Generator | None, *, return_J: bool = False,
                     bounds: tuple[float, float] | None = None, checked: bool = False, key: int | None = None):
    """Cluster ids of eq. 7: id k with prob. (c[k+1] - x)/(c[k+1] - c[k]), k + 1 otherwise.

    ``c`` are the wire centroids (strictly increasing, bracketing x).  ids use the smallest unsigned
    dtype holding len(c) - 1.  Deterministic for a given ``rng`` state: one 64-bit key drawn from
    ``rng`` seeds a counter-based SplitMix64 stream (spec/FORMAT.md 4.3) giving element i its own
    uniform, an exact multiple of 2^-24 for float32 arithmetic (used when x is float32 and c is exact
    in float32) or of 2^-53 for float64.  The element goes up iff u * (c[k+1] - c[k]) < x - c[k], i.e.
    with probability (x - c_k) / (c_{k+1} - c_k) up to the working precision's rounding.  The compiled
    kernel (``kernels.BACKEND == "c"``) and this numpy path give identical ids.
    With ``return_J=True`` also returns J of eq. 8-9 for these levels, in float64 (for float32 data
    the differences x - c_k, c_{k+1} - x are taken in float64, where they are exact), at little cost.
    ``bounds``: the exact (min x, max x) when the caller has them (the bracketing check needs no pass).
    ``checked``: ``c`` is :func:`wire_centroids`' result for these ``bounds`` (the solver's caller):
    strictly increasing and bracketing by construction, not checked again (``x`` still is).
    ``key``: the key already drawn from the group's generator (:func:`draw_key`; ``rng`` unused).
    """
    if checked and type(x) is np.ndarray and x.ndim == 1 and x.dtype in _DATA_DTYPES and x.flags.c_contiguous:
        pass
    else:
        x, c = _check_inputs(x, c, bounds)
    n = x.size
    if c.size == 1 or n == 0:
        ids = np.zeros(n, dtype=id_dtype(c.size))
        return (ids, 0.0) if return_J else ids
    work = _work_dtype(x, c)
    key = draw_key(rng) if key is None else key
    sround = kernels.compiled("sround")
    if sround is not None and c.size <= 1 << 16:  # the kernel writes every id: no zeroing pass
        ids = np.empty(n, dtype=id_dtype(c.size))
        J = _sround_chunks(sround, x, np.ascontiguousarray(c, work), key, ids, return_J, work)
        return (ids, J) if return_J else ids
    ids = np.zeros(n, dtype=id_dtype(c.size))
    J = _sround_numpy(x, c, key, ids, return_J, work)
    return (ids, J) if return_J else ids


def _sround_numpy(x: np.ndarray, c: np.ndarray, key: int, ids: np.ndarray, return_J: bool, work: type) -> float:
    """:func:`stochastic_round`'s numpy path (the compiled kernel's twin) into ``ids``: chunk by chunk,
    bins from a grid over the levels, then the few elements whose bin holds a level exactly.  Returns
    J (0.0 unless ``return_J``)."""
    n = x.size
    grid = _BitGrid(c) if work == np.float32 and n >= BITGRID_MIN_N else _Grid(c, work, n)
    step = min(CHUNK, n)
    draw = _Uniforms(key, work, step)
    d = np.empty(step, work)
    g = np.empty(step, work)
    u = np.empty(step, work)
    v = np.empty(step, work)
    b = np.empty(step, np.intp)
    m = np.empty(step, bool)
    k = np.empty(step, ids.dtype)
    # J in float64: float32 work takes c_k, c_{k+1} from float64 tables (as the C kernel does)
    wide = return_J and work == np.float32
    if wide:
        c64 = c.astype(np.float64)
        x64, lo64, hi64 = np.empty(step), np.empty(step), np.empty(step)
        if grid.ok:
            tlo, thi = grid.float64_tables(c64)
    J = 0.0
    pend = []  # (positions, uniforms) of elements needing an exact interval
    for s in range(0, n, step):
        e = min(s + step, n)
        L = e - s
        xc = x[s:e]
        dd, gg, uu, vv, bb, mm, kk = d[:L], g[:L], u[:L], v[:L], b[:L], m[:L], k[:L]
        draw.fill(uu, s)
        if grid.ok:
            grid.bins(xc, vv, bb)
            np.take(grid.kb, bb, out=kk, mode="clip")
            np.take(grid.cb, bb, out=gg, mode="clip")
            np.subtract(xc, gg, out=dd)  # x - c_k >= 0
            np.take(grid.wb, bb, out=gg, mode="clip")  # c_{k+1} - c_k
        else:  # degenerate span for the grid (overflow): exact search
            kk[:] = interval_index(xc, grid.c)
            np.subtract(xc, grid.c[kk], out=dd)
            gg[:] = grid.width[kk]
        np.multiply(uu, gg, out=vv)
        np.less(vv, dd, out=mm)  # up with probability (x - c_k) / (c_{k+1} - c_k)
        np.add(kk, mm.view(np.uint8), out=ids[s:e], casting="unsafe")
        np.greater_equal(dd, gg, out=mm)  # x at or above c_{k+1}: a level inside the bin
        late = np.flatnonzero(mm) if mm.any() else None
        if late is not None:
            pend.append((late + s, uu[late]))
        if return_J:  # sum (c_{k+1} - x)(x - c_k) over the elements whose k is right
            if wide:
                xx, ll, hh = x64[:L], lo64[:L], hi64[:L]
                np.copyto(xx, xc)
                if grid.ok:
                    np.take(tlo, bb, out=ll, mode="clip")
                    np.take(thi, bb, out=hh, mode="clip")
                else:
                    np.take(c64, kk, out=ll)
                    np.take(c64, kk.astype(np.intp) + 1, out=hh)
                np.subtract(xx, ll, out=ll)
                np.subtract(hh, xx, out=hh)
            else:
                ll = dd
                hh = np.subtract(gg, dd, out=vv)
            if late is not None:
                ll[late] = 0.0
            J += kernels.dot(ll, hh)
    if pend:
        J += _fixup(x, grid, ids, pend, return_J)
    return J


def _sround_chunks(sround, x, cw, key, ids, return_J, work) -> float:
    """The C kernel over parallel.CHUNK-sized chunks on parallel.current() threads.

    Chunk [s, e) uses the stream state key + (s / 2) * GAMMA (float32 work: two elements per word)
    or key + s * GAMMA (float64), so element i still gets word i/2 (or i) of FORMAT.md 4.3's stream
    and the ids do not depend on the chunking; J is summed over the chunks in chunk order.
    """
    if x.size <= parallel.CHUNK:  # one chunk (every small vector): the kernel called as it is
        return sround(x, cw, key, ids, return_J)
    per_word = 2 if work == np.float32 else 1

    def one(s: int, e: int) -> float:
        k = (key + (s // per_word) * kernels.GAMMA) & kernels.MASK64
        return sround(x[s:e], cw, k, ids[s:e], return_J)

    J = 0.0
    for part in parallel.run_spans(one, x.size):
        J += part
    return J


def _fixup(x, grid, ids, pend, return_J) -> float:
    """Exact interval for the few elements that sit at or above a level inside their grid bin.

    Their uniform was not used (the first test is always 'up' for them), so it is reused here.
    Returns their J (the rounding pass left them out), float64 as in the pass.
    """
    idx, u = (np.concatenate(p) for p in zip(*pend))
    xs = x[idx]
    kk = interval_index(xs, grid.c)
    d2 = xs - grid.c[kk]
    w2 = grid.width[kk]
    ids[idx] = kk + (u * w2 < d2)
    if not return_J:
        return 0.0
    if grid.work == np.float32:
        x64, c64 = xs.astype(np.float64), grid.c.astype(np.float64)
        return kernels.dot(x64 - c64[kk], c64[kk + 1] - x64)
    return kernels.dot(d2, w2 - d2)


class _Uniforms:
    """Element i's uniform on [0, 1) from the counter-based SplitMix64 stream with state ``key``
    (spec/FORMAT.md 4.3), so any chunk can be generated on its own:

    * float32 arithmetic: word w_j = splitmix64 output j + 1; element 2j takes bits 8..31 of w_j,
      element 2j + 1 bits 40..63; u = (those 24 bits) * 2^-24;
    * float64 arithmetic: u = (w_i >> 11) * 2^-53.
    """

    def __init__(self, key: int, work: np.dtype, step: int):
        self.key = key
        self.work = work
        words = (step + 1) // 2 if work == np.float32 else step
        self.w = np.empty(words, np.uint64)
        self.t = np.empty(words, np.uint64)
        self.ramp = np.arange(1, words + 1, dtype=np.uint64) * np.uint64(kernels.GAMMA)

    def fill(self, out: np.ndarray, start: int) -> None:
        """Uniforms of elements start .. start + len(out) - 1 (``start`` even for float32)."""
        n = out.size
        if self.work == np.float64:
            w = kernels.splitmix64(self.key, start, n, self.w, self.t, self.ramp)
            np.right_shift(w, np.uint64(11), out=w)
            np.multiply(w, 2.0**-53, out=out, casting="unsafe")
            return
        words = (n + 1) // 2
        w = kernels.splitmix64(self.key, start // 2, words, self.w, self.t, self.ramp)
        half = w.view("<u4") if w.dtype.byteorder in "<=|" and np.little_endian else w.astype("<u8").view("<u4")
        raw = half[:n]
        np.right_shift(raw, np.uint32(8), out=raw)
        np.multiply(raw, np.float32(2.0**-24), out=out, dtype=np.float32, casting="unsafe")


def dequantize(ids: np.ndarray, c: np.ndarray, dtype=np.float32, *, check: bool = True) -> np.ndarray:
    """The decoded values c[ids] as ``dtype``; ids must be < len(c) (``check=False``: the caller
    has checked).  Plain fancy indexing: ``np.take`` would first copy the ids into an int64 array
    (8 bytes per element, measured 2.4x the peak memory of ``c[ids]`` on 5e7 uint8 ids)."""
    c = np.asarray(c).astype(dtype)
    ids = np.asarray(ids)
    if check and ids.size and int(ids.max()) >= c.size:
        raise InputError(f"cluster id {int(ids.max())} out of range for {c.size} centroids")
    return c[ids] if c.size else np.empty(0, dtype)


def expected_sq_error(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Per-element variance J_m = (c[k+1] - x)(x - c[k]) of eq. 8, float64 (0 for a single level)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    c = np.asarray(c, dtype=np.float64)
    if c.size < 2:
        return np.zeros(x.size)
    k = interval_index(x, c)
    return (c[k + 1] - x) * (x - c[k])
