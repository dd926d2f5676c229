"""Centroid solvers for MUCSC: pick levels r_1 < ... < r_Z minimising J (paper eq. 8-9).

J(r) = sum_m (r_{z+1} - U_m)(U_m - r_z) is the variance of the paper's stochastic rounding (eq. 7);
r_1 = min U and r_Z = max U are fixed.  Solvers (registry ``SOLVERS``):

* ``"optimal"`` (default): DP over a few thousand candidate levels (at most DP_MAX_Z of them chosen),
  then exact coordinate polishing; for z > DP_MAX_Z greedy insertion of further levels, a DP over
  the levels plus nearby data values (up to DP_REFINE_MAX_Z levels) and more insertion.  Runs on the
  sorted data (small inputs) or on a sorted stratified subsample (large inputs).
* ``"exact"``: the global optimum by a divide-and-conquer DP over the sorted distinct values.
* ``"paper"``: Algorithm 1 as configured in section VI-A (5 gradient steps of eq. 10, alpha = 0.001).
* ``"uniform"``: evenly spaced levels.

All solvers return float64, strictly increasing, first == min(x), last == max(x), at most ``z`` levels
(the distinct values themselves when there are no more than ``z`` of them: J = 0).
See docs/centroids.md for the method and measurements.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from mucsc.codec import kernels, parallel
from mucsc.errors import InputError, ParameterError

__all__ = ["SOLVERS", "solve", "variance_J", "variance_J_sorted", "segment_costs"]

# Inputs up to this size are solved on the full sorted data; larger ones on a stratified subsample.
FULL_SORT_MAX = 1 << 18
SUBSAMPLE = 1 << 17
# Above that size, every element beyond the subsample's TAIL_RANK-th smallest / largest value is kept
# exactly (weight 1; ~d * TAIL_RANK / SUBSAMPLE elements per side), the rest is the weighted subsample.
TAIL_RANK = 256
# Above this Z the DP picks DP_MAX_Z levels and greedy insertion adds the rest (J(z) <= J(DP_MAX_Z)).
DP_MAX_Z = 256
MAX_LEVELS = 1 << 16  # the format's most levels (clusters.MAX_Z)
# Up to this many levels the inserted levels are re-optimised by a DP over the levels plus REFINE_Q
# interior data ranks per interval (O(Z^2 log Z): ~0.1 s with the C kernel at 1024, ~2 s in numpy).
DP_REFINE_MAX_Z = 1024
REFINE_Q = 3
POLISH_SWEEPS = 200
# Unweighted prefix sums from this many elements on are summed by blocks of PREFIX_BLOCK
# (_blocked_cumsum; _kernels.c's PB_MIN_N and PB)
PREFIX_BLOCK_MIN, PREFIX_BLOCK = 4096, 16
# DP candidates: max(CAND_MIN, CAND_PER_LEVEL * z).  The DP costs O(z m^2), a fixed cost that dominates
# small inputs; the polish after it recovers what fewer candidates miss: with 192 instead of 384 the
# J at Z = 16 of standard Gaussian d = 1e4 / 1e5 / 1e6 moves -0.0026% / -0.0020% / 0, every vector's
# within 0.005%, Gaussian and Student-t(3) d = 3e5 / 2e6 / 1e7 within 0.05% (either way), and a
# 1e4-element Z = 16 encode costs ~15% less (issue 37).
CAND_MIN, CAND_PER_LEVEL = 192, 12
# From this many sorted elements the snapped grid and companding points bring their lower neighbour
# xs[p - 1] only across a gap wider than one of the density bins: in dense data it is all but xs[p]
# itself (~40% of the DP's candidates at d = 1e4, ~30 us of its ~120 us solve), while on a clustered
# input it is the top of the cluster below the gap (without any neighbours an earlier round measured
# up to +24% J on 15-element inputs).  J at Z = 16 of standard Gaussian d = 1e4 / 1e5 / 1e6: unchanged; of every
# solve made for the vectors: unchanged; Student-t(3) d = 3e4 at Z = 16: +0.0006% (_kernels.c's
# NEIGHBOUR_MIN_N, the same rule).
NEIGHBOUR_MIN_N = 4096


# --------------------------------------------------------------------------------------------------
# The objective
# --------------------------------------------------------------------------------------------------


def variance_J(x: np.ndarray, c: np.ndarray) -> float:
    """Exact J = sum_m (r_{z+1} - U_m)(U_m - r_z) (eq. 8-9) of levels ``c`` on data ``x``, in float64.

    ``c`` must be sorted and bracket ``x``; elements equal to a level contribute 0.
    """
    from mucsc.codec.numerics.quantize import BITGRID_MIN_N, grid_J, interval_index  # lookups live with the quantizer

    x = np.asarray(x)
    c = np.asarray(c, dtype=np.float64)
    if x.size == 0 or c.size <= 1:
        return 0.0
    if x.dtype == np.float32 and x.ndim == 1 and x.flags.c_contiguous and x.size >= BITGRID_MIN_N:
        return grid_J(x, c)  # same float64 arithmetic, grid lookup instead of a binary search
    total = 0.0
    step = 1 << 16
    for s in range(0, x.size, step):
        xs = x[s : s + step].astype(np.float64)
        k = interval_index(xs, c)
        total += kernels.dot(c[k + 1] - xs, xs - c[k])
    return total


def variance_J_sorted(xs: np.ndarray, c: np.ndarray) -> float:
    """J from a histogram form: prefix sums of the *sorted* data, O(Z log d) after the sums.

    Per segment [a, b] J = (a + b) S1 - a b S0 - S2 over the points inside (points on a level add 0).
    """
    xs = np.asarray(xs, dtype=np.float64)
    c = np.asarray(c, dtype=np.float64)
    if xs.size == 0 or c.size <= 1:
        return 0.0
    shift = 0.5 * (xs[0] + xs[-1])  # J is translation invariant; centring limits cancellation
    v = xs - shift
    p1 = np.concatenate(([0.0], np.cumsum(v)))
    p2 = np.concatenate(([0.0], np.cumsum(v * v)))
    pos = np.searchsorted(xs, c, side="left")
    return float(segment_costs(c - shift, pos.astype(np.float64), p1[pos], p2[pos]).sum())


def segment_costs(v: np.ndarray, n: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> np.ndarray:
    """J of each segment [v_i, v_{i+1}] from prefix count/sum/sum-of-squares at the level positions."""
    a, b = v[:-1], v[1:]
    dn, d1, d2 = np.diff(n), np.diff(s1), np.diff(s2)
    return np.maximum((a + b) * d1 - a * b * dn - d2, 0.0)


# --------------------------------------------------------------------------------------------------
# Dispatch
# --------------------------------------------------------------------------------------------------


def solve(x: np.ndarray, z: int, solver: str = "optimal", rng: np.random.Generator | None = None, *,
          bounds: tuple[float, float] | None = None, cache: dict | None = None) -> np.ndarray:
    """Levels for ``x`` with at most ``z`` entries: float64, strictly increasing, [min x, max x] ends.

    ``rng`` is used by the ``paper`` solver's random initialisation (default: seed 0); the other
    solvers are deterministic functions of (x, z).  ``bounds``: (min x, max x) when the caller already
    has them (saves two passes over x; they must be exact).  ``cache``: a dict the caller keeps for
    one unchanged ``x`` across several ``z`` (a goal's search): the sorted (sub)sample and the
    distinct-value probes are computed once (the same levels as without it).
    """
    try:
        fn = SOLVERS[solver]
    except KeyError:
        raise ParameterError(f"unknown centroid solver {solver!r}; known: {', '.join(SOLVERS)}") from None
    if isinstance(z, bool) or int(z) != z or z < 1:
        raise ParameterError(f"z must be an integer >= 1, got {z!r}")
    z = int(z)
    x = _solver_input(x, solver)
    if bounds is None:
        bounds = (x.min(), x.max()) if isinstance(x, np.ndarray) else x.bounds()
    lo, hi = float(bounds[0]), float(bounds[1])
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise InputError("input contains NaN or Inf")
    # a small input is sorted once for the distinct-value check and the solver (a call-local cache)
    own_cache = cache is None
    cache = None if not isinstance(x, np.ndarray) else {} if cache is None else cache
    if fn is _solve_optimal and own_cache and lo != hi and z > 2:  # nothing else reads the solver's
        c = _solve_sorted(x, z, cache)  # prefix sums: one call, which also finds more than z values
        if c is not None:
            return _finish(c, lo, hi)
    few = _few_levels(x, z, lo, hi, cache)
    if few is not None:
        return few
    if rng is None:
        rng = np.random.default_rng(0)
    c = _solve_optimal(x, z, lo, hi, rng, cache) if fn is _solve_optimal else fn(x, z, lo, hi, rng)
    return _finish(c, lo, hi)


def _solver_input(x: Any, solver: str) -> Any:
    """``x`` as the solvers read it: a flat float array, or a device summary (``backends.torch_summary``) that the
    optimal solver reads for large inputs (the data itself on the host otherwise)."""
    if not isinstance(x, np.ndarray) and hasattr(x, "outside"):
        if x.size <= FULL_SORT_MAX or solver != "optimal":
            x = x.all()  # small, or a solver that reads every element: the data itself on the host
    else:
        x = np.asarray(x)
    if x.dtype.kind != "f":
        raise InputError(f"centroid solvers need float input, got {x.dtype}")
    x = x.reshape(-1) if isinstance(x, np.ndarray) else x
    if x.size == 0:
        raise InputError("cannot choose centroids for an empty vector")
    return x


def _few_levels(x: Any, z: int, lo: float, hi: float, cache: dict | None) -> np.ndarray | None:
    """The levels when no solver is needed: a constant vector, z = 2 (the two ends), or at most z
    distinct values; None otherwise."""
    if lo == hi:
        return np.array([lo])
    if z == 1:
        raise ParameterError("z = 1 cannot bracket a non-constant vector (r_1 = min, r_Z = max)")
    if z == 2:
        return np.array([lo, hi])
    return _distinct_if_at_most(x, z, cache)


def _distinct_if_at_most(x: np.ndarray, z: int, cache: dict | None = None) -> np.ndarray | None:
    """The sorted distinct values of x when there are at most z of them, else None (cheaply)."""
    if x.size <= FULL_SORT_MAX:
        s = _cached(cache, ("sort",), lambda: np.sort(x))  # the solver's sorted data too
        if s.size > 1 and _changes_at_least(s, z):  # more than z distinct values: np.unique not needed
            return None
        u = _cached(cache, ("unique",), lambda: np.unique(x).astype(np.float64))
        return u if u.size <= z else None
    step = max(1, x.size // max(4096, 2 * z))
    probe = _cached(cache, ("probe", step),  # can show > z values
                    lambda: np.unique(x[::step] if isinstance(x, np.ndarray) else x.strided(step)))
    if probe.size > z:
        return None
    # Few distinct values in a probe: check every element against them (rare path).
    if not isinstance(x, np.ndarray):  # a device summary: the same checks where the data lives
        if x.equals_levels(probe):
            return probe.astype(np.float64)
        x = x.all()
    k = np.minimum(np.searchsorted(probe, x), probe.size - 1)
    if np.array_equal(probe[k], x):
        return probe.astype(np.float64)
    u = np.unique(x)
    return u.astype(np.float64) if u.size <= z else None


def _changes_at_least(s: np.ndarray, z: int) -> bool:
    """Whether the sorted ``s`` changes value at least ``z`` times (more than z distinct values).
    An evenly strided subsequence of a sorted array changes value no more often than the array, so
    ~4 z samples usually decide it (~10 us of a 1e5-element encode); the whole array otherwise."""
    t = s[:: max(1, s.size // (4 * z))]
    return bool(np.count_nonzero(t[1:] != t[:-1]) >= z or np.count_nonzero(s[1:] != s[:-1]) >= z)


def _cached(cache: dict | None, key: tuple, make):
    """``make()``, memoised in ``cache`` under ``key`` when a cache is given."""
    if cache is None:
        return make()
    if key not in cache:
        cache[key] = make()
    return cache[key]


def _finish(c: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Sort, clip to [lo, hi], drop duplicates and pin the two ends (r_1 = min, r_Z = max)."""
    c = np.asarray(c, dtype=np.float64)
    if _finished(c, lo, hi):  # the solvers' usual output: inside [lo, hi] already, so np.clip's result
        return c
    c = np.clip(c, lo, hi)
    if _finished(c, lo, hi):  # what np.unique below returns
        return c
    c = np.unique(np.concatenate(([lo], c, [hi])))
    return c


def _finished(c: np.ndarray, lo: float, hi: float) -> bool:
    """Whether ``c`` is already strictly increasing from exactly ``lo`` to exactly ``hi`` (the same
    bits at both ends, so np.unique's pick among equal -0.0 / 0.0 cannot matter).  On Python floats:
    a few levels, where numpy's per-call cost is the whole cost."""
    v = c.tolist()
    if len(v) < 2 or not (v[0] == lo and v[-1] == hi):
        return False
    sign = math.copysign
    same = sign(1.0, v[0]) == sign(1.0, lo) and sign(1.0, v[-1]) == sign(1.0, hi)
    return same and all(a < b for a, b in zip(v, v[1:]))


# --------------------------------------------------------------------------------------------------
# Simple solvers
# --------------------------------------------------------------------------------------------------


def _solve_uniform(x, z, lo, hi, rng):
    """Evenly spaced levels between min and max."""
    return np.linspace(lo, hi, z)


def _solve_paper(x, z, lo, hi, rng, alpha=1e-3, iters=5, max_retries=30):
    """Algorithm 1 with the settings of section VI-A.

    Where the paper is silent: the random initial r_2..r_{Z-1} are uniform on (min, max) and sorted;
    the E-step loop over z = 2..Z-1 is sequential (each gradient of eq. 10 uses the already-updated
    r_{z-1}, as the for-loop reads) with the cluster sums of the previous M-step; when a step moves a
    centroid outside [min, max] the step is discarded and retried with alpha / 10 (at most
    ``max_retries`` times, then the step is skipped); accepted centroids are re-sorted so phi stays
    well defined; duplicates are removed at the end.
    """
    xf = np.asarray(x, dtype=np.float64)
    r = np.empty(z)
    r[0], r[-1] = lo, hi
    r[1:-1] = np.sort(rng.uniform(lo, hi, z - 2))
    for _ in range(iters):
        # M-step quantities for the current centroids: n_z = |L_z|, s_z = sum_{L_z} U (eq. 10)
        k = np.clip(np.searchsorted(r, xf, side="right") - 1, 0, z - 2)
        n = np.bincount(k, minlength=z - 1).astype(np.float64)
        s = np.bincount(k, weights=xf, minlength=z - 1)
        for _retry in range(max_retries):
            new = r.copy()
            for j in range(1, z - 1):  # E-step, eq. 10
                grad = (s[j - 1] - n[j - 1] * new[j - 1]) - (n[j] * new[j + 1] - s[j])
                new[j] = new[j] - alpha * grad
            if np.all((new[1:-1] >= lo) & (new[1:-1] <= hi)):
                r = np.sort(new)
                break
            alpha /= 10.0
    return r


# --------------------------------------------------------------------------------------------------
# Dynamic programming (exact on distinct values; approximate on candidates)
# --------------------------------------------------------------------------------------------------


def _prefix(xs: np.ndarray, shift: float):
    """Prefix count/sum/sum-of-squares of sorted data (float64, centred by ``shift``)."""
    v = xs.astype(np.float64) - shift
    p1 = np.empty(v.size + 1)
    p2 = np.empty(v.size + 1)
    p1[0] = p2[0] = 0.0
    np.cumsum(v, out=p1[1:])
    np.cumsum(v * v, out=p2[1:])
    return p1, p2


def dp_levels(v: np.ndarray, n: np.ndarray, s1: np.ndarray, s2: np.ndarray, z: int) -> np.ndarray:
    """Indices of the best ``z`` levels among candidates ``v`` (both ends included).

    ``n, s1, s2`` are the prefix count, sum and sum of squares of the data below each candidate
    (data centred like ``v``).  D_k[j] = min_i D_{k-1}[i] + C(i, j) with the segment cost
    C(i, j) = (v_i + v_j) S1 - v_i v_j S0 - S2; C obeys the quadrangle inequality, so the leftmost
    argmin is monotone in j and each layer is solved by divide and conquer, breadth first so every
    recursion depth is one vectorised numpy pass: O(z m log m) for m candidates.  The compiled
    kernel (``kernels.BACKEND == "c"``) runs the same recursion with the same cost expression and
    tie rule, so both backends return the same indices.
    """
    m = v.size
    if z >= m:
        return np.arange(m)
    kernel = kernels.compiled("dp_levels")
    if kernel is not None and m < 1 << 31:
        idx = np.empty(z, dtype=np.int64)
        f = [np.ascontiguousarray(a, dtype=np.float64) for a in (v, n, s1, s2)]
        kernel(*f, z, idx)
        return idx
    inf = np.inf
    prev = np.full(m, inf)
    prev[0] = 0.0
    args = np.zeros((z, m), dtype=np.int32)
    for k in range(1, z):
        jlo = k  # j needs k earlier distinct candidates
        jhi = m - 1 - (z - 1 - k) if k < z - 1 else m - 1
        if k == z - 1:
            jlo = m - 1
        cur = np.full(m, inf)
        _dc_layer(prev, cur, args[k], v, n, s1, s2, jlo, jhi, k - 1, args[k - 1] if k > 1 else None)
        prev = cur
    return _backtrack(args, m, z)


def _backtrack(args: np.ndarray, m: int, z: int) -> np.ndarray:
    idx = np.empty(z, dtype=np.int64)
    j = m - 1
    for k in range(z - 1, 0, -1):
        idx[k] = j
        j = int(args[k, j])
    idx[0] = 0
    return idx


def _dc_layer(prev, cur, arg, v, n, s1, s2, jlo, jhi, ilo, lower=None):
    """cur[j] = min_{ilo <= i < j} prev[i] + C(i, j) for j in [jlo, jhi], breadth-first D&C.

    ``lower``: the previous layer's argmins; with one more level the last segment starts no earlier
    (Knuth's bound opt_{k-1}(j) <= opt_k(j)), so each scan starts at max(its range's start,
    lower[j]) (clipped to the range where rounding makes the two bounds disagree)."""
    lo = np.array([jlo], dtype=np.int64)
    hi = np.array([jhi], dtype=np.int64)
    olo = np.array([ilo], dtype=np.int64)
    ohi = np.array([jhi - 1], dtype=np.int64)
    while lo.size:
        mid = (lo + hi) >> 1
        top = np.minimum(ohi, mid - 1)
        frm = olo if lower is None else np.maximum(olo, lower[mid])
        frm = np.where(frm > top, np.where(top >= olo, top, olo), frm)
        cnt = top - frm + 1  # >= 1 by construction (opt(j) < j and ranges stay consistent)
        starts = np.zeros(cnt.size, dtype=np.int64)
        np.cumsum(cnt[:-1], out=starts[1:])
        total = int(cnt.sum())
        seg = np.repeat(np.arange(cnt.size), cnt)
        i = np.arange(total) - starts[seg] + frm[seg]
        j = mid[seg]
        vi, vj = v[i], v[j]
        cost = prev[i] + ((vi + vj) * (s1[j] - s1[i]) - vi * vj * (n[j] - n[i]) - (s2[j] - s2[i]))
        best = np.minimum.reduceat(cost, starts)
        hit = np.flatnonzero(cost <= best[seg])
        first = hit[np.searchsorted(hit, starts)]  # leftmost argmin of each segment
        bi = i[first]
        cur[mid] = cost[first]
        arg[mid] = bi
        # children: left half keeps [olo, bi], right half [bi, ohi]
        left = lo <= mid - 1
        right = mid + 1 <= hi
        lo, hi, olo, ohi = (
            np.concatenate((lo[left], (mid + 1)[right])),
            np.concatenate(((mid - 1)[left], hi[right])),
            np.concatenate((olo[left], bi[right])),
            np.concatenate((bi[left], ohi[right])),
        )


def _solve_exact(x, z, lo, hi, rng):
    """Global optimum: DP over all sorted distinct values (O(z d log d))."""
    u, cnt = np.unique(x, return_counts=True)
    u = u.astype(np.float64)
    shift = 0.5 * (lo + hi)
    w = u - shift
    n = np.concatenate(([0.0], np.cumsum(cnt, dtype=np.float64)))[:-1]
    s1 = np.concatenate(([0.0], np.cumsum(cnt * w)))[:-1]
    s2 = np.concatenate(([0.0], np.cumsum(cnt * w * w)))[:-1]
    idx = dp_levels(w, n, s1, s2, z)
    return u[idx]


# --------------------------------------------------------------------------------------------------
# The default solver
# --------------------------------------------------------------------------------------------------


def _sample_sorted(x: np.ndarray, lo: float, hi: float,
                   cache: dict | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Sorted float64 data to solve on and its weights (None: all 1).

    Small inputs: all of x.  Large ones: a stratified subsample (one element at a fixed pseudo-random
    offset in each of SUBSAMPLE equal blocks, a fixed seed, so centroids are a pure function of the
    input) for the bulk, with weight d_bulk / n_bulk, plus every element below the subsample's
    TAIL_RANK-th smallest or above its TAIL_RANK-th largest value, exactly, with weight 1.  Heavy
    tails are where a subsample misses the levels that matter (its extremes are far from min/max).
    """
    d = x.size
    if d <= FULL_SORT_MAX:
        return _cached(cache, ("sort",), lambda: np.sort(x)).astype(np.float64), None
    xs, steps = _sample_steps(x, lo, hi)
    return xs.astype(np.float64), steps.weights()


class _Steps(NamedTuple):
    """The subsample's weights without an array: 1 before ``a``, ``wb`` in [a, b), 1 from b to n."""

    a: int
    b: int
    wb: float
    n: int

    def weights(self) -> np.ndarray:
        """The same weights as a float64 array."""
        return np.concatenate((np.ones(self.a), np.full(self.b - self.a, self.wb), np.ones(self.n - self.b)))


def _sample_steps(x: Any, lo: float, hi: float) -> tuple[np.ndarray, _Steps]:
    """``_sample_sorted``'s large-input sample in x's dtype (float32 stays float32) and its weights
    as steps (the prefix kernel reads them without an array: ~2 MB fewer bytes written at 3e5)."""
    d = x.size
    idx = _subsample_index(d)
    s = np.sort(x[idx] if isinstance(x, np.ndarray) else x.gather(idx))
    t_lo, t_hi = s[TAIL_RANK], s[-1 - TAIL_RANK]  # elements of x: exact in its dtype
    if isinstance(x, np.ndarray):
        low, high = _outside(x, t_lo, t_hi)
    else:  # a device summary: the tails in index order, sorted here as _outside sorts them
        low, high = (np.sort(t) for t in x.outside(t_lo, t_hi))
    bulk = s[np.searchsorted(s, t_lo, side="left"):np.searchsorted(s, t_hi, side="right")]
    wb = (d - low.size - high.size) / bulk.size  # bulk elements of x per sampled bulk element
    xs = np.concatenate((low, bulk, high))
    return xs, _Steps(low.size, low.size + bulk.size, wb, xs.size)


@functools.lru_cache(maxsize=16)
def _subsample_index(d: int) -> np.ndarray:
    """The subsample's positions for d elements: one at a fixed pseudo-random offset in each of
    SUBSAMPLE equal blocks (a fixed seed).  Memoised (read-only, 1 MB): drawing them took ~1.7 ms
    of a 3e5-element encode's ~12 ms."""
    block = d // SUBSAMPLE
    g = np.random.Generator(np.random.SFC64(0x6D756373))
    idx = np.arange(SUBSAMPLE, dtype=np.int64) * block + g.integers(0, block, SUBSAMPLE)
    idx.setflags(write=False)
    return idx


def _outside(x: np.ndarray, t_lo, t_hi) -> tuple[np.ndarray, np.ndarray]:
    """The sorted elements of x below ``t_lo`` and above ``t_hi`` (one pass over x).

    Both backends collect them in index order, so the sorted results are identical.
    """
    kernel = kernels.compiled("outside")
    if kernel is not None and x.dtype in (np.float32, np.float64) and x.flags.c_contiguous:
        parts = parallel.run_spans(lambda s, e: _outside_c(kernel, x[s:e], t_lo, t_hi), x.size)  # index order
        return tuple(np.sort(np.concatenate(side)) for side in zip(*parts))
    lows, highs = [], []
    step = 1 << 16
    m = np.empty(min(step, x.size), bool)
    for s in range(0, x.size, step):
        xc = x[s : s + step]
        mm = m[: xc.size]
        np.less(xc, t_lo, out=mm)
        if mm.any():
            lows.append(xc[mm])
        np.greater(xc, t_hi, out=mm)
        if mm.any():
            highs.append(xc[mm])
    cat = lambda a: np.sort(np.concatenate(a)) if a else np.zeros(0, x.dtype)  # noqa: E731
    return cat(lows), cat(highs)


def _outside_c(kernel: Callable, x: np.ndarray, t_lo, t_hi) -> tuple[np.ndarray, np.ndarray]:
    """The C kernel's pass (``kernel``: ``kernels.compiled("outside")``): x's elements below ``t_lo``
    and above ``t_hi``, in index order."""
    cap = 4 * (x.size * (TAIL_RANK + 1) // SUBSAMPLE) + 4096  # expected count per side, with room
    low, high = np.empty(cap, x.dtype), np.empty(cap, x.dtype)
    nl, nh = kernel(x, float(t_lo), float(t_hi), low, high)
    if nl > cap or nh > cap:  # many equal values beyond a threshold: exact sizes
        low, high = np.empty(nl, x.dtype), np.empty(nh, x.dtype)
        kernel(x, float(t_lo), float(t_hi), low, high)
    return low[:nl], high[:nh]


class _Sorted:
    """Sorted centred (sub)sample with prefix weight / weighted sum / weighted sum of squares.

    ``W[i]`` is the total weight of xc[:i] (exactly i when ``unit``); J and the DP costs use
    (W, P1, P2) where the unweighted formulas used (count, sum, sum of squares).
    """

    def __init__(self, xc: np.ndarray, w: np.ndarray | None):
        self.xc = xc
        self.unit = w is None
        n = xc.size
        buf = np.empty((2 if w is None else 3, n + 1))  # one allocation (3x faster than concatenations)
        buf[:, 0] = 0.0
        self._rows(buf)
        self._sums(w)

    def _rows(self, buf: np.ndarray) -> None:
        """W, P1, P2 as the rows of ``buf`` (2 x (n + 1) without weights: W is then shared, read-only)."""
        if self.unit:
            self.W = _unit_weights(buf.shape[1] - 1)
            self.P1, self.P2 = buf
        else:
            self.W, self.P1, self.P2 = buf

    @classmethod
    def centred(cls, xs: np.ndarray, shift: float, w: np.ndarray | None) -> "_Sorted":
        """``_Sorted(xs - shift, w)`` with xs float32 or float64 and xc = float64(xs) - shift; with the
        C kernels, centring and the prefix sums in one pass (the same values: numpy's cumsum adds in
        sequence, and the products are the same).  Without weights W is a shared read-only 0, 1, ..., n
        (the pass writes xc, P1 and P2 only: at 1e5 elements it is bound by its stores); ``w`` may be
        the subsample's ``_Steps`` (read without an array)."""
        kernel = kernels.compiled("prefix")
        xs = np.asarray(xs)
        if xs.dtype not in (np.float32, np.float64):
            xs = xs.astype(np.float64)
        if kernel is None:
            return cls(np.subtract(xs, shift, dtype=np.float64), w.weights() if isinstance(w, _Steps) else w)
        S = cls.__new__(cls)
        S.unit = w is None
        S.xc = np.empty(xs.size)
        buf = np.empty((2 if w is None else 3, xs.size + 1))
        kernel(np.ascontiguousarray(xs), float(shift), S.xc, buf,
               None if w is None else (w.a, w.b, float(w.wb)) if isinstance(w, _Steps)
               else np.ascontiguousarray(w, np.float64))
        S._rows(buf)
        return S

    def _sums(self, w: np.ndarray | None) -> None:
        xc = self.xc
        if w is None and xc.size >= PREFIX_BLOCK_MIN:
            _blocked_cumsum(xc, self.P1)
            _blocked_cumsum(xc * xc, self.P2)
            return
        wx = xc if w is None else w * xc
        if w is not None:
            np.cumsum(w, out=self.W[1:])
        np.cumsum(wx, out=self.P1[1:])
        np.cumsum(wx * xc if w is None else np.multiply(wx, xc, out=wx), out=self.P2[1:])

    def rank_at(self, lo: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Index of the first point at or after ``lo`` whose cumulative weight from ``lo`` reaches t
        (t > 0): lo - 1 + ceil(t) for unit weights (may run past the data: callers clip)."""
        if self.unit:
            return lo - 1 + np.ceil(t).astype(np.int64)
        i = np.searchsorted(self.W, self.W[lo] + t, side="left")
        return np.maximum(i, lo + 1) - 1

    def J(self, v: np.ndarray) -> float:
        """J of sorted levels v (centred like xc) on the weighted data."""
        k = np.searchsorted(self.xc, v, side="left")
        return float(segment_costs(v, self.W[k], self.P1[k], self.P2[k]).sum())


def _blocked_cumsum(v: np.ndarray, out: np.ndarray) -> None:
    """The prefix sums of ``v`` into ``out`` (v.size + 1 entries, out[0] = 0) by blocks of
    PREFIX_BLOCK: each full block summed by a fixed tree (u_i = a_i + a_(i+8), w_i = u_i + u_(i+4),
    then (w_0 + w_2) + (w_1 + w_3)), the block sums added in sequence (np.cumsum) to each block's
    start, and an entry inside a block its start plus the block's values from there in sequence.
    Unweighted solves from PREFIX_BLOCK_MIN elements on use these (the compiled kernels add the same
    way, four wide): a sequential cumsum is one chain of adds an element, most of a 1e5-element
    solve's prefix pass; these are one chain a block.  Within ~1e-16 of the sequential sums, not
    equal to them bit for bit."""
    n = v.size
    nb = n // PREFIX_BLOCK
    a = v[: nb * PREFIX_BLOCK].reshape(nb, PREFIX_BLOCK)
    u = a[:, :8] + a[:, 8:]
    w = u[:, :4] + u[:, 4:]
    rows = np.empty((nb + 1, PREFIX_BLOCK))
    rows[0, 0] = 0.0
    np.cumsum((w[:, 0] + w[:, 2]) + (w[:, 1] + w[:, 3]), out=rows[1:, 0])  # each block's start
    tail = np.zeros((nb + 1) * PREFIX_BLOCK)
    tail[:n] = v
    rows[:, 1:] = tail.reshape(nb + 1, PREFIX_BLOCK)[:, :-1]  # the block's values but its last
    np.cumsum(rows, axis=1, out=rows)
    out[:] = rows.reshape(-1)[: n + 1]


@functools.lru_cache(maxsize=4)
def _unit_weights(n: int) -> np.ndarray:
    """0.0, 1.0, ..., n as float64 (read-only): the prefix weights of n unweighted points."""
    W = np.arange(n + 1, dtype=np.float64)
    W.setflags(write=False)
    return W


def _candidates(xs: np.ndarray, W: np.ndarray, m: int) -> np.ndarray:
    """Up to ~m candidate data values: weighted quantiles, a uniform grid and f^(1/3) companding points.

    ``W``: prefix weights of the sorted data ``xs`` (W[i] = i for unweighted data).  Optimal level
    density for J is ~ f^(1/3) (J ~ sum_segments n w^2 / 6), so companding points concentrate
    candidates where levels go; quantiles and the uniform grid cover the rest.
    """
    cand = _candidates_c(xs, W, m)
    if cand is not None:
        return cand
    d = xs.size
    lo, hi = xs[0], xs[-1]
    # element covering each cumulative weight (= rank linspace(0, d - 1) for unit weights)
    q = np.clip(np.searchsorted(W, np.linspace(0, W[-1] - 1, m // 3 + 2), side="right") - 1, 0, d - 1)
    grid = np.linspace(lo, hi, m // 3 + 2)
    nb = 4 * m
    edges = np.linspace(lo, hi, nb + 1)
    counts = np.diff(W[np.searchsorted(xs, edges, side="right")])
    dens = np.cbrt(counts)
    cdf = np.concatenate(([0.0], np.cumsum(dens)))
    t = np.linspace(0, cdf[-1], m // 3 + 2)
    comp = np.interp(t, cdf, edges)
    vals = np.concatenate((grid, comp))
    pos = np.clip(np.searchsorted(xs, vals), 0, d - 1)  # snap to data values (levels sit on data)
    nbr = np.maximum(pos - 1, 0)  # and the value below each: the far side of a gap
    if d >= NEIGHBOUR_MIN_N:  # dense data: only across a gap wider than a density bin
        nbr = np.where(xs[pos] - xs[nbr] > (hi - lo) / nb, nbr, pos)
    cand = np.unique(np.concatenate((xs[q], xs[pos], xs[nbr])))
    return cand


def _candidates_c(xs: np.ndarray, W: np.ndarray, m: int) -> np.ndarray | None:
    """``_candidates`` in two compiled calls around numpy's own ``np.cbrt`` (numpy may use a SIMD
    cube root: the kernels take its values rather than libm's); the same values, or None when -0.0
    and 0.0 both occur among them (np.unique's pick between the two is its sort's) or when the
    compiled kernels are not selected (``kernels.compiled``)."""
    cand_counts, candidates = kernels.compiled("cand_counts"), kernels.compiled("candidates")
    if cand_counts is None or candidates is None:
        return None
    xs = np.ascontiguousarray(xs, dtype=np.float64)
    W = np.ascontiguousarray(W, dtype=np.float64)
    k = m // 3 + 2
    counts = np.empty(4 * m)
    cand_counts(xs, W, counts)
    out = np.empty(5 * k)
    n = candidates(xs, W, _cbrt(counts), k, out)
    return out[:n] if n >= 0 else None


CBRT_TABLE = 1 << 12  # whole counts below this take np.cbrt's values from a table


@functools.lru_cache(maxsize=1)
def cbrt_table() -> np.ndarray:
    """np.cbrt(0), np.cbrt(1), ... np.cbrt(CBRT_TABLE - 1), computed once (read-only)."""
    t = np.cbrt(np.arange(CBRT_TABLE, dtype=np.float64))
    t.setflags(write=False)
    return t


def _cbrt(counts: np.ndarray) -> np.ndarray:
    """np.cbrt(counts) in place: bin weights that are small whole numbers (unit weights, every input
    up to FULL_SORT_MAX) are looked up in np.cbrt's own table (an elementwise function: the same
    values), ~10x faster than ~2000 cube roots (~30 us of a small encode's fixed cost)."""
    whole = counts.astype(np.intp)
    if counts.size and 0 <= whole.min() and whole.max() < CBRT_TABLE and np.array_equal(whole, counts):
        return np.take(cbrt_table(), whole, out=counts)
    return np.cbrt(counts, out=counts)


def _polish(S: _Sorted, c: np.ndarray, sweeps: int = POLISH_SWEEPS) -> np.ndarray:
    """Exact coordinate descent on sorted data (ALQ update): odd levels, then even levels, until fixed.

    For fixed neighbours a < c the best b is the first data value whose cumulative weight from a
    reaches T / (c - a), T = sum_{a < x < c} w (c - x) (rank lo - 1 + ceil(T / (c - a)) for unit
    weights, lo = #{x <= a}).  Never increases J.
    """
    xs, W, p1 = S.xc, S.W, S.P1
    c = np.array(c, dtype=np.float64)  # a copy
    z = c.size
    if z <= 2:
        return c
    kernel = kernels.compiled("polish")
    if kernel is not None:  # the same sweeps in one call: numpy's ~15 calls per sweep dominate small inputs
        kernel(xs, W, p1, c, S.unit, sweeps)
        return c
    for _ in range(sweeps):
        changed = False
        for parity in (1, 2):
            j = np.arange(parity, z - 1, 2)
            if j.size == 0:
                continue
            a, b = c[j - 1], c[j + 1]
            lo = np.searchsorted(xs, a, side="right")
            hi = np.searchsorted(xs, b, side="left")
            T = b * (W[hi] - W[lo]) - (p1[hi] - p1[lo])
            t = T / (b - a)
            ok = (hi > lo) & (t > 0)
            rank = np.clip(S.rank_at(lo, np.where(ok, t, 1.0)), 0, xs.size - 1)
            new = np.where(ok, xs[rank], c[j])
            if not np.array_equal(new, c[j]):
                changed = True
                c[j] = new
        if not changed:
            break
    return c


def _solve_optimal(x, z, lo, hi, rng, cache: dict | None = None):
    """DP over candidates from the (sub)sampled sorted data, then exact coordinate polishing.

    For z > DP_MAX_Z each stage starts from the previous stage's levels and never raises J on the
    (weighted sub)sample: the DP_MAX_Z solution, greedy insertion up to DP_REFINE_MAX_Z levels, a DP
    over those levels plus interior data ranks, then greedy insertion up to z.  So J(z) <= J(DP_MAX_Z)
    and J(z) <= J(DP_REFINE_MAX_Z) for larger z, by construction.
    """
    shift = 0.5 * (lo + hi)

    def sample() -> _Sorted:
        if isinstance(x, np.ndarray) and x.size <= FULL_SORT_MAX:  # x's own sort (float32: half the bytes)
            return _Sorted.centred(_cached(cache, ("sort",), lambda: np.sort(x)), shift, None)
        xs, steps = _sample_steps(x, lo, hi)
        return _Sorted.centred(xs, shift, steps)

    S = _cached(cache, ("sorted", lo, hi), sample)  # read-only below
    zd = min(z, DP_MAX_Z)
    m = candidate_count(S.xc.size, zd)
    cand = _candidates(S.xc, S.W, m)  # on the centred data: candidates are its values
    c = _dp_polish(S, cand, zd)
    if z > zd:
        zr = min(z, DP_REFINE_MAX_Z)
        c = _polish(S, _insert_levels(S, c, zr))
        c = _polish(S, _refine_dp(S, c))
        if z > zr:
            c = _polish(S, _insert_levels(S, c, z))
    return c + shift


def _solve_sorted(x: Any, z: int, cache: dict | None) -> np.ndarray | None:
    """``_solve_optimal`` for a small unweighted x in one compiled call on x's own sort (the same
    operations: prefix sums, candidates, DP and polish; ~20 numpy calls fewer, which are most of a
    1e4-element solve's fixed cost), or None where that path does not apply: among them x of at most
    z distinct values, which the call counts first (:func:`_few_levels` returns those)."""
    kernel = kernels.compiled("solve_sorted")
    if kernel is None or not isinstance(x, np.ndarray) or x.size > FULL_SORT_MAX or z > DP_MAX_Z:
        return None
    s = _cached(cache, ("sort",), lambda: np.sort(x))
    if s.dtype not in (np.float32, np.float64):
        return None
    m = candidate_count(s.size, z)
    if m < z:
        return None
    out = np.empty(z)
    count = kernel(np.ascontiguousarray(s), z, m, cbrt_table(), POLISH_SWEEPS, out)
    return out[:count] if count > 0 else None


def candidate_count(n: int, z: int) -> int:
    """The DP's candidate count m for z levels over n sorted unweighted values (CAND_MIN, CAND_PER_LEVEL)."""
    return int(min(n, max(CAND_MIN, CAND_PER_LEVEL * z)))


def _dp_polish(S: _Sorted, cand: np.ndarray, z: int) -> np.ndarray:
    """The best ``z`` of the sorted distinct candidates ``cand`` (centred like S.xc) by the DP, then
    polished; with the kernels in one call (~10 numpy calls fewer: they dominate small inputs)."""
    kernel = kernels.compiled("dp_polish")
    if kernel is not None and cand.size < 1 << 31:
        out = np.empty(min(z, cand.size))
        kernel(S.xc, S.W, S.P1, S.P2, np.ascontiguousarray(cand, np.float64), z, S.unit, POLISH_SWEEPS, out)
        return out
    pos = np.searchsorted(S.xc, cand, side="left")
    idx = dp_levels(cand, S.W[pos], S.P1[pos], S.P2[pos], z)
    return _polish(S, np.unique(cand[idx]))


def _refine_dp(S: _Sorted, c: np.ndarray) -> np.ndarray:
    """Best ``c.size`` levels among c plus REFINE_Q evenly spaced interior data ranks per interval.

    Coordinate polishing stalls when intervals hold few points; this DP moves many levels at once.
    c is one feasible choice, so the DP optimum is no worse; the J check guards against rounding.
    """
    xc = S.xc
    lo = np.searchsorted(xc, c[:-1], side="right")
    hi = np.searchsorted(xc, c[1:], side="left")
    cnt = hi - lo
    frac = np.arange(1, REFINE_Q + 1) / (REFINE_Q + 1)
    r = lo[:, None] + np.floor(cnt[:, None] * frac[None, :]).astype(np.int64)
    r = r[r < hi[:, None]]  # interior ranks only (none for empty intervals)
    cand = np.unique(np.concatenate((c, xc[r])))
    if cand.size == c.size:
        return c
    pos = np.searchsorted(xc, cand, side="left")
    idx = dp_levels(cand, S.W[pos], S.P1[pos], S.P2[pos], c.size)
    new = cand[idx]
    return new if S.J(new) <= S.J(c) else c


def _best_splits(S: _Sorted, a: np.ndarray, c: np.ndarray):
    """For each interval [a, c] of consecutive levels: the best new level b on a data value, and the
    J reduction of inserting it (0 when no data lies strictly inside).

    b is the exact coordinate update (ALQ, as in ``_polish``).  Inserting b removes
    (c - b) sum_{a < x <= b} w (x - a) + (b - a) sum_{b < x < c} w (c - x) from J (eq. 8: the points
    left of b swap the factor (c - x) for (b - x), those right of it (x - a) for (x - b)); all >= 0.
    """
    xc, W, p1 = S.xc, S.W, S.P1
    lo = np.searchsorted(xc, a, side="right")
    hi = np.searchsorted(xc, c, side="left")
    cnt = hi - lo
    inside = cnt > 0
    T = c * (W[hi] - W[lo]) - (p1[hi] - p1[lo])
    w = c - a
    t = np.divide(T, w, out=np.zeros_like(T), where=inside)
    if S.unit:
        k = np.clip(np.ceil(t), 1, np.maximum(cnt, 1))
        rank = lo - 1 + k.astype(np.int64)
    else:
        rank = np.clip(S.rank_at(lo, np.maximum(t, 0.0)), lo, np.maximum(hi - 1, lo))
    rank = np.clip(rank, 0, xc.size - 1)
    b = np.where(inside, xc[rank], a)
    j = np.clip(np.searchsorted(xc, b, side="right"), lo, hi)  # points in (a, b] are lo .. j-1
    left = (p1[j] - p1[lo]) - a * (W[j] - W[lo])
    right = c * (W[hi] - W[j]) - (p1[hi] - p1[j])
    gain = np.where(inside, (c - b) * np.maximum(left, 0.0) + (b - a) * np.maximum(right, 0.0), 0.0)
    return b, gain


def _insert_levels(S: _Sorted, c: np.ndarray, z: int) -> np.ndarray:
    """Grow sorted levels ``c`` towards ``z`` levels by greedy insertion on the sorted data ``S``.

    Each pass computes every interval's best split (``_best_splits``) and inserts the larger half of
    the positive gains (at most the remaining budget; ties broken by position), so the level count
    grows geometrically; only the two halves of a split interval get new gains.  Every insertion
    lowers J by its gain (splits of different intervals are independent).  Stops early, with fewer
    than ``z`` levels, when no interval has data strictly inside.
    """
    b, gain = _best_splits(S, c[:-1], c[1:])
    while c.size < z:
        pos_idx = np.flatnonzero(gain > 0.0)
        if pos_idx.size == 0:
            break
        take = min(z - c.size, max(1, (pos_idx.size + 1) // 2))
        if take < pos_idx.size:
            order = np.argsort(-gain[pos_idx], kind="stable")  # deterministic: stable on ties
            sel = np.sort(pos_idx[order[:take]])
        else:
            sel = pos_idx
        # new levels: interval i gets b[i] between c[i] and c[i + 1]
        new_c = np.insert(c, sel + 1, b[sel])
        # gains: unsplit intervals keep theirs; each split interval i becomes [c_i, b_i], [b_i, c_i+1]
        split = np.zeros(gain.size, dtype=bool)
        split[sel] = True
        keep_b = np.repeat(b, np.where(split, 2, 1))
        keep_g = np.repeat(gain, np.where(split, 2, 1))
        at = sel + np.arange(sel.size)  # index of the left half in the new interval list
        fresh = np.concatenate((at, at + 1))
        nb, ng = _best_splits(S, new_c[fresh], new_c[fresh + 1])
        keep_b[fresh], keep_g[fresh] = nb, ng
        c, b, gain = new_c, keep_b, keep_g
    return c


SOLVERS: dict[str, Callable[..., np.ndarray]] = {
    "optimal": _solve_optimal,
    "exact": _solve_exact,
    "paper": _solve_paper,
    "uniform": _solve_uniform,
}


# --------------------------------------------------------------------------------------------------
# For rate control: J-optimal levels of an already sorted summary
# --------------------------------------------------------------------------------------------------

# Candidates per level of :func:`levels_on_sorted`: its DP (O(z m log m)) over 3 z candidates, then
# the exact polish, reached the fewest levels that the default solver's 12 z candidates reach on
# Gaussian and Student-t(3) vectors of 500-8,000 elements at a 1% error bound (issue 37's bytes).
SORTED_CAND_PER_LEVEL = 3


def levels_on_sorted(S: _Sorted, z: int, cache: dict | None = None,
                     per_level: int = SORTED_CAND_PER_LEVEL) -> np.ndarray:
    """About J-optimal ``z`` levels of the sorted data ``S`` (centred like ``S.xc``, both ends
    included): the DP over ``per_level * z`` candidates, then polished; above DP_MAX_Z levels the
    DP_MAX_Z ones with greedy insertion up to ``z``, polished (the default solver without its
    refining DP: J up to ~11% above its J for 300-1,000 levels, within ~2% beyond; ~5-10 ms
    instead of ~60-80 ms at z ~ 2,000, d ~ 1e4).  What a
    goal's search measures a level count by.  ``cache``: a dict kept across calls on one ``S``
    (the DP_MAX_Z levels, computed once)."""
    if not 2 <= z <= MAX_LEVELS:
        raise ParameterError(f"z must be in 2..{MAX_LEVELS}, got {z!r}")
    zd = min(z, DP_MAX_Z)
    if zd < z and cache is not None and "dp" in cache:
        c = cache["dp"]
    else:
        m = int(min(S.xc.size, max(zd, per_level * zd)))
        c = _dp_polish(S, _candidates(S.xc, S.W, m), zd)
        if zd < z and cache is not None:
            cache["dp"] = c
    return c if zd == z else _polish(S, _insert_levels(S, c, z))
