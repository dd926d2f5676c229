"""MUCSC stochastic rounding (paper eq. 7) against wire centroids, and its inverse.

Each U_m in [r_z, r_{z+1}] becomes id z with probability (r_{z+1} - U_m) / (r_{z+1} - r_z) and z + 1
otherwise, so E[r_id] = U_m.  The probabilities use the centroids *as sent* (``wire_centroids``), so the
decoder's values are exactly the ones the expectation is taken over.

Hot path: the interval of each element comes from a uniform-grid lookup table plus one exact
correction (no full-size searchsorted), in cache-sized chunks with preallocated buffers.
"""

from __future__ import annotations

import numpy as np

from mucsc.errors import InputError, ParameterError

__all__ = [
    "wire_centroids",
    "stochastic_round",
    "dequantize",
    "interval_index",
    "expected_sq_error",
    "id_dtype",
]

WIRE_DTYPES = (np.float16, np.float32, np.float64)
CHUNK = 1 << 15  # elements per chunk: all working buffers stay in L2
_MAX_EXTRA = 3  # more levels than this in one grid bin -> searchsorted for that call


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


def wire_centroids(c: np.ndarray, x: np.ndarray, dtype=np.float32) -> np.ndarray:
    """``c`` rounded to the wire dtype, strictly increasing and still bracketing [min x, max x].

    Rounding may merge neighbours (duplicates are dropped) or move an end inward (it is moved outward
    with nextafter).  Raises InputError if the data range does not fit the wire dtype (float16).
    """
    dt = np.dtype(dtype)
    if dt not in [np.dtype(t) for t in WIRE_DTYPES]:
        raise ParameterError(f"wire dtype must be float16, float32 or float64, got {dt}")
    c = np.asarray(c, dtype=np.float64)
    x = np.asarray(x)
    if c.ndim != 1 or c.size == 0:
        raise ParameterError("centroids must be a non-empty 1-D array")
    if x.size:
        lo, hi = float(x.min()), float(x.max())
    else:
        lo, hi = float(c[0]), float(c[-1])
    with np.errstate(over="ignore"):
        w = np.unique(c.astype(dt))
    first, last = _outward(w[0], lo, -1), _outward(w[-1], hi, +1)
    if w.size == 1 and first != last:  # one level that rounding moved off the data: bracket it
        w = np.array([first, last], dtype=dt)
    else:
        w[0], w[-1] = first, last
    if not np.all(np.isfinite(w)):
        raise InputError(f"data range [{lo:g}, {hi:g}] does not fit the wire dtype {dt}")
    return w


def _outward(v, target: float, direction: int):
    """Step v (a wire-dtype scalar) outward until it is on the far side of ``target``."""
    with np.errstate(over="ignore"):
        inf = v.dtype.type(np.inf)
        while (float(v) > target) if direction < 0 else (float(v) < target):
            v = np.nextafter(v, -inf if direction < 0 else inf)
    return v


# --------------------------------------------------------------------------------------------------
# Interval lookup
# --------------------------------------------------------------------------------------------------


class _Locator:
    """Maps x to its interval k (c[k] <= x <= c[k+1], k in 0..Z-2) with a uniform-grid table.

    bin(x) = floor((x - c_0) * scale) is computed with the same floating-point operations for the data
    and for the levels.  Those operations are monotone, so a level whose bin is below bin(x) is < x and
    one whose bin is above is > x: the table entry
    ``lut[b] = #{interior levels with bin < b}`` is exact up to the levels sharing bin b, which
    ``extra`` passes of ``k += x >= next_level[k]`` resolve.
    """

    def __init__(self, c: np.ndarray, work: np.dtype):
        self.work = work
        self.c = c.astype(work)
        z = self.c.size
        self.kdt = id_dtype(z)
        self.lo = self.c[0]
        span = self.c[-1] - self.c[0]
        nb = int(min(1 << 15, max(1 << 10, 64 * z)))
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            self.scale = work.type(nb) / span
        self.ok = bool(np.isfinite(span) and span > 0 and np.isfinite(self.scale))
        if not self.ok:
            return
        self.bdt = np.dtype(np.uint16) if nb < (1 << 16) - 2 else np.dtype(np.int32)
        inner = self.c[1:-1]
        bb = self.bins(inner)
        top = int(self.bins(self.c[-1:])[0])
        self.lut = np.searchsorted(bb, np.arange(top + 1), side="left").astype(self.kdt)
        self.extra = int(np.bincount(bb).max()) if bb.size else 0
        self.next = np.concatenate((inner, [np.inf])).astype(work)
        if self.extra > _MAX_EXTRA:
            self.ok = False

    def bins(self, v: np.ndarray, t: np.ndarray | None = None, b: np.ndarray | None = None) -> np.ndarray:
        if t is None:
            t = np.empty(v.size, self.work)
            b = np.empty(v.size, self.bdt)
        np.subtract(v, self.lo, out=t)
        np.multiply(t, self.scale, out=t)
        np.copyto(b, t, casting="unsafe")
        return b

    def locate(self, xc: np.ndarray, k: np.ndarray, t: np.ndarray, b: np.ndarray, g: np.ndarray, m: np.ndarray):
        """Write the interval index of chunk ``xc`` into ``k`` (buffers t, b, g, m of the same length)."""
        if not self.ok:
            k[:] = np.clip(np.searchsorted(self.c, xc, side="right") - 1, 0, self.c.size - 2)
            return
        self.bins(xc, t, b)
        np.take(self.lut, b, out=k, mode="clip")
        for _ in range(self.extra):
            np.take(self.next, k, out=g, mode="clip")
            np.greater_equal(xc, g, out=m)
            np.add(k, m, out=k, casting="unsafe")


def interval_index(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """k with c[k] <= x <= c[k+1] (k in 0..len(c)-2; a level value maps to the interval it starts)."""
    x = np.asarray(x)
    c = np.asarray(c)
    if c.size < 2:
        return np.zeros(x.size, dtype=np.intp)
    k = np.searchsorted(c, x, side="right") - 1
    return np.clip(k, 0, c.size - 2)


# --------------------------------------------------------------------------------------------------
# Stochastic rounding
# --------------------------------------------------------------------------------------------------


def _work_dtype(x: np.ndarray, c: np.ndarray) -> np.dtype:
    """float32 arithmetic when both data and wire centroids are exact in float32, else float64."""
    if x.dtype == np.float32 and np.array_equal(c.astype(np.float32).astype(c.dtype), c):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def _check_inputs(x: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x)
    c = np.asarray(c)
    if x.dtype not in (np.float32, np.float64):
        raise InputError(f"stochastic_round needs float32 or float64 data, got {x.dtype}")
    if c.ndim != 1 or c.size == 0 or c.dtype.kind != "f":
        raise ParameterError("centroids must be a non-empty 1-D float array")
    if c.size > 1 and not np.all(c[1:] > c[:-1]):
        raise ParameterError("centroids must be strictly increasing")
    x = np.ascontiguousarray(x.reshape(-1))
    if x.size and c.size and (x.min() < c[0] or x.max() > c[-1]):
        raise InputError("centroids do not bracket the data (use wire_centroids)")
    return x, c


def stochastic_round(x: np.ndarray, c: np.ndarray, rng: np.random.Generator, *, return_J: bool = False):
    """Cluster ids of eq. 7: id k with prob. (c[k+1] - x)/(c[k+1] - c[k]), k + 1 otherwise.

    ``c`` are the wire centroids (strictly increasing, bracketing x).  ids use the smallest unsigned
    dtype holding len(c) - 1.  Deterministic for a given ``rng`` state: a SFC64 stream seeded from
    ``rng`` supplies one uniform per element (24-bit for float32 arithmetic, 53-bit for float64).
    With ``return_J=True`` also returns the exact expected squared error J of this rounding (eq. 8-9).
    """
    x, c = _check_inputs(x, c)
    n = x.size
    ids = np.zeros(n, dtype=id_dtype(c.size))
    if c.size == 1 or n == 0:
        return (ids, 0.0) if return_J else ids
    work = _work_dtype(x, c)
    loc = _Locator(c, work)
    base = loc.c[:-1].copy()  # c_k
    width = np.diff(loc.c)  # c_{k+1} - c_k in the working precision
    sub = np.random.Generator(np.random.SFC64(rng.integers(0, 1 << 63, size=2)))
    step = min(CHUNK, n)
    t = np.empty(step, work)
    g = np.empty(step, work)
    u = np.empty(step, work)
    b = np.empty(step, loc.bdt if loc.ok else np.int32)
    m = np.empty(step, bool)
    k = np.empty(step, ids.dtype)
    J = 0.0
    for s in range(0, n, step):
        e = min(s + step, n)
        L = e - s
        xc = x[s:e]
        kk, tt, gg, uu, bb, mm = k[:L], t[:L], g[:L], u[:L], b[:L], m[:L]
        loc.locate(xc, kk, tt, bb, gg, mm)
        np.take(base, kk, out=gg, mode="clip")
        np.subtract(xc, gg, out=tt)  # x - c_k >= 0
        np.take(width, kk, out=gg, mode="clip")
        if return_J:
            J += float(np.dot((gg - tt).astype(np.float64), tt.astype(np.float64)))
        sub.random(out=uu, dtype=work.type)
        np.multiply(uu, gg, out=uu)
        np.less(uu, tt, out=mm)  # up with probability (x - c_k) / (c_{k+1} - c_k)
        np.add(kk, mm, out=ids[s:e], casting="unsafe")
    return (ids, J) if return_J else ids


def dequantize(ids: np.ndarray, c: np.ndarray, dtype=np.float32) -> np.ndarray:
    """The decoded values c[ids] as ``dtype``; ids must be < len(c)."""
    c = np.asarray(c).astype(dtype)
    ids = np.asarray(ids)
    if ids.size and int(ids.max()) >= c.size:
        raise InputError(f"cluster id {int(ids.max())} out of range for {c.size} centroids")
    return np.take(c, ids, mode="clip") if c.size else np.empty(0, dtype)


def expected_sq_error(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Per-element variance J_m = (c[k+1] - x)(x - c[k]) of eq. 8, float64 (0 for a single level)."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    c = np.asarray(c, dtype=np.float64)
    if c.size < 2:
        return np.zeros(x.size)
    k = interval_index(x, c)
    return (c[k + 1] - x) * (x - c[k])
