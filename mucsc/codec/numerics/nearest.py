"""Nearest rounding for ``mucsc`` (``rounding="nearest"``): Lloyd-Max levels and the deterministic
assignment to them.

Each element goes to its nearest level, so the error is deterministic and biased; its squared sum
sum (x_m - c_id(m))^2 is what J reports.  The levels minimise that error, not eq. 8-9's variance: a
Lloyd-Max quantizer (Lloyd 1982, Max 1960), each level the mean of its cell and each cell boundary
the midpoint of its two levels.  For a stored model, where unbiasedness buys nothing, this has about
half the squared error of stochastic rounding to the J-optimal levels.
"""

from __future__ import annotations

import numpy as np

from mucsc.codec import kernels
from mucsc.codec.numerics.quantize import id_dtype
from mucsc.errors import InputError

__all__ = ["lloyd_max", "wire_levels", "assign", "SortedSample"]

SAMPLE = 1 << 20  # the levels are fitted on at most this many elements (a strided sample)
ITERATIONS = 200  # Lloyd iterations at most (they stop earlier once no level moves)
CHUNK = 1 << 16  # elements per chunk of the assignment (bounds the numpy path's float64 temporaries)


def lloyd_max(x: np.ndarray, z: int, cache: dict | None = None, iterations: int = ITERATIONS) -> np.ndarray:
    """At most ``z`` float64 levels, sorted, minimising sum (x - nearest level)^2 locally (Lloyd's
    iteration).  Fewer when x has fewer distinct values (then exact).  The start is the high-rate
    optimum's point density, proportional to p(x)^(1/3) (Panter-Dite): from plain quantiles, heavy
    tails kept too few levels and Lloyd moved them out too slowly (Student-t(3), Z = 256: 13x the
    squared error)."""
    x = np.asarray(x).reshape(-1)
    if x.size == 0:
        return np.zeros(1)
    if cache is not None and "nearest" in cache:
        xs, s1, distinct = cache["nearest"]
    else:
        xs = np.sort(x[:: max(1, x.size // SAMPLE)].astype(np.float64))
        s1 = np.concatenate(([0.0], np.cumsum(xs)))
        distinct = np.unique(xs)
        if cache is not None:  # a goal's search fits many z to the same data
            cache["nearest"] = (xs, s1, distinct)
    if distinct.size <= z:  # few values: each is its own level
        return distinct
    m = xs.size
    # density from the spacing of neighbours k apart; weight p^(1/3 - 1) per element = gap^(2/3)
    k = max(1, m // (8 * z))
    i = np.arange(m)
    cw = np.cumsum(np.cbrt(np.square(xs[np.minimum(i + k, m - 1)] - xs[np.maximum(i - k, 0)])))
    c = np.unique(xs[np.minimum(np.searchsorted(cw, (np.arange(z) + 0.5) / z * cw[-1]), m - 1)])
    for _ in range(iterations):
        cuts = np.searchsorted(xs, (c[:-1] + c[1:]) * 0.5, side="right")
        lo = np.concatenate(([0], cuts))
        hi = np.concatenate((cuts, [m]))
        cnt = hi - lo
        new = np.where(cnt > 0, (s1[hi] - s1[lo]) / np.maximum(cnt, 1), c)
        new = np.unique(new)
        if new.size == c.size and np.array_equal(new, c):
            break
        c = new
    return c


def wire_levels(c: np.ndarray, dtype) -> np.ndarray:
    """The levels as sent: rounded to the wire dtype, merged where rounding made them equal.  Unlike
    stochastic rounding's, they need not bracket the data (the outer cells extend to infinity)."""
    dt = np.dtype(dtype)
    with np.errstate(over="ignore"):
        w = np.unique(np.asarray(c, np.float64).astype(dt))
    if not np.all(np.isfinite(w)):
        raise InputError(f"levels {float(c[0]):g} .. {float(c[-1]):g} do not fit the wire dtype {dt}")
    return w


def assign(x: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, float]:
    """(ids, squared error): element m gets the level nearest to it, ties to the lower one.  The
    boundaries t_k = (c_k + c_{k+1}) / 2 and the comparisons x > t_k are in float64 (exact for float32
    data), so every backend that follows spec/FORMAT.md 4.3.1 makes the same choice.  One pass of
    :func:`kernels.nearest` (compiled: O(Z) working memory; numpy: a chunk at a time, the boundaries
    of evenly spaced levels located on their grid), the error summed in its fixed chunk order, so a
    goal's trial encodes of one x cost one pass each and keep no sorted copy of x (it was 12 bytes
    per element: order and float64 values)."""
    x = np.asarray(x).reshape(-1)
    c64 = np.asarray(c, np.float64)
    ids = np.zeros(x.size, id_dtype(c64.size))
    if c64.size == 1:
        return ids, float(np.sum(np.square(x.astype(np.float64) - c64[0])))
    t = (c64[:-1] + c64[1:]) * 0.5
    grid = _uniform(t)
    index = None if grid is None else (lambda xc: _grid_index(t, xc, *grid))
    return ids, kernels.nearest(x, t, c64, ids, CHUNK, index)


def _uniform(t: np.ndarray) -> tuple[float, float] | None:
    """(first boundary, 1 / spacing) when the boundaries lie within a quarter spacing of an evenly
    spaced grid (a goal's uniform grid, its levels rounded to the wire dtype), so that x's position
    on that grid is off by at most one boundary; else None."""
    if t.size < 8:
        return None
    h = float(t[-1] - t[0]) / (t.size - 1)
    if not h > 0 or float(np.abs(t - (t[0] + h * np.arange(t.size))).max()) > 0.25 * h:
        return None
    return float(t[0]), 1.0 / h


def _grid_index(t: np.ndarray, xc: np.ndarray, t0: float, inv: float) -> np.ndarray:
    """``np.searchsorted(t, xc, side="left")`` for evenly spaced boundaries: each x's position on the
    grid, moved by one where the exact comparisons say so, and any element still not between its two
    boundaries found by the binary search (the same ids: ~4x faster than the binary search alone)."""
    n = t.size
    g = np.floor((xc - t0) * inv)
    np.clip(g, -1.0, n - 1.0, out=g)
    k = g.astype(np.intp) + 1  # about the number of boundaries below x
    below = np.take(t, k - 1, mode="clip")
    k -= (k > 0) & (below >= xc)
    above = np.take(t, k, mode="clip")
    k += (k < n) & (above < xc)
    bad = ((k > 0) & (np.take(t, k - 1, mode="clip") >= xc)) | ((k < n) & (np.take(t, k, mode="clip") < xc))
    if bad.any():
        k[bad] = np.searchsorted(t, xc[bad], side="left")
    return k


class SortedSample:
    """A small sorted sample of x with prefix sums: the squared error of nearest rounding to any
    levels, predicted in O(Z log m) without touching x (a goal's search uses it to skip the trial
    encodes whose error it already knows to be far from the goal)."""

    SIZE = 1 << 16  # elements at most (a strided sample)
    ITERATIONS = 20  # Lloyd iterations for the predicted levels (from Panter-Dite's start: close)

    def __init__(self, x: np.ndarray):
        x = np.asarray(x).reshape(-1)
        self.n = x.size
        self.xs = np.sort(x[:: max(1, x.size // self.SIZE)].astype(np.float64))
        self.s1 = np.concatenate(([0.0], np.cumsum(self.xs)))
        self.s2 = np.concatenate(([0.0], np.cumsum(np.square(self.xs))))
        self._cache: dict = {}
        self._levels: dict[int, np.ndarray] = {}

    def levels(self, z: int) -> np.ndarray:
        """Lloyd-Max levels for ``z`` fitted on the sample (a few iterations: a prediction)."""
        if z not in self._levels:
            self._levels[z] = lloyd_max(self.xs, z, self._cache, self.ITERATIONS)
        return self._levels[z]

    def J(self, c: np.ndarray) -> float:
        """The predicted sum (x - nearest level)^2 over all n elements of x (the sample's, scaled)."""
        m = self.xs.size
        if m == 0:
            return 0.0
        c = np.asarray(c, np.float64)
        cuts = np.concatenate(([0], np.searchsorted(self.xs, (c[:-1] + c[1:]) * 0.5, side="right"), [m]))
        lo, hi = cuts[:-1], cuts[1:]
        # per cell: sum x^2 - 2 c sum x + count c^2
        err = (self.s2[hi] - self.s2[lo]) - 2.0 * c * (self.s1[hi] - self.s1[lo]) + (hi - lo) * c * c
        return max(float(err.sum()), 0.0) * self.n / m
