"""A vector's sorted summary, and what it says about any level set under eq. 7's stochastic rounding
without rounding the vector: J (eq. 8-9) and the expected number of elements each level receives
(the IDs' expected counts, whose order-0 entropy an rANS-coded message reaches); the same under
nearest rounding (:meth:`Summary.nearest_stats`).

The summary is the solver's sorted data (:func:`mucsc.codec.numerics.centroids._sample_sorted`): all
of x up to ``FULL_SORT_MAX`` elements (J and the counts then exact), above that a weighted stratified
subsample with the tails kept exactly (both estimates, within ~0.3 % at 2^17 samples).  With prefix
sums of weight, sum and sum of squares, a level set of K levels costs O(K log n): one binary search
per level.  Rate control (:mod:`mucsc.codec.ratecontrol.summary_search`) chooses a goal's levels from
it, then encodes once."""

from __future__ import annotations

import numpy as np

from mucsc.codec import kernels
from mucsc.codec.numerics.centroids import FULL_SORT_MAX, _sample_sorted, _Sorted, segment_costs

__all__ = ["Summary"]

THIN_ROUNDS = 8  # rounds of :meth:`Summary.thin` (each can halve a run of sparse levels)


class Summary:
    """Sorted (sub)sample of a vector with prefix weight / sum / sum of squares (centred); its
    weights add up to the vector's length, so J and counts are on the vector's scale."""

    def __init__(self, x: np.ndarray, lo: float, hi: float, cache: dict | None = None):
        xs, w = _sample_sorted(x, lo, hi, cache)
        self.lo, self.hi = lo, hi
        self.shift = 0.5 * (lo + hi)  # J is translation invariant; centring limits cancellation
        self.S = _Sorted.centred(xs, self.shift, w)
        self.exact = x.size <= FULL_SORT_MAX  # the summary is the data itself
        # a subsample's sampled bulk (its elements weigh more than 1): outside it the summary is exact
        bulk = None if w is None else np.flatnonzero(w != 1.0)
        self.bulk = None if bulk is None or not bulk.size else (float(xs[bulk[0]]), float(xs[bulk[-1]]))
        self.total = float(self.S.W[-1])

    def distinct(self, limit: int) -> np.ndarray | None:
        """The sorted distinct values (float64) when the summary is the data and has at most
        ``limit`` of them, else None."""
        xc = self.S.xc
        if not self.exact or xc.size == 0 or np.count_nonzero(xc[1:] != xc[:-1]) >= limit:
            return None
        return np.unique(xc) + self.shift

    def stats(self, levels: np.ndarray) -> tuple[float, np.ndarray]:
        """(J, expected count per level) of sorted levels bracketing the data: an element in
        [c_j, c_j+1) goes up with probability (x - c_j) / (c_j+1 - c_j) (eq. 7); elements at or
        beyond the last level all go to it."""
        S = self.S
        stats = kernels.compiled("summary_stats")
        if stats is not None and len(levels):  # the same values in one call (~15 numpy calls otherwise)
            seg, n = np.empty(len(levels) - 1), np.empty(len(levels))
            stats(S.xc, S.W, S.P1, S.P2, float(self.shift), np.ascontiguousarray(levels, np.float64), seg, n,
                  self.total)
            return float(seg.sum()), n
        v = np.asarray(levels, np.float64) - self.shift
        k = np.searchsorted(S.xc, v, side="left")
        W, P1 = S.W[k], S.P1[k]
        J = float(segment_costs(v, W, P1, S.P2[k]).sum())
        n = np.zeros(v.size)
        if v.size > 1:
            N, s1 = np.diff(W), np.diff(P1)
            up = np.clip((s1 - v[:-1] * N) / np.diff(v), 0.0, np.maximum(N, 0.0))
            n[1:] += up
            n[:-1] += N - up
        n[-1] += self.total - W[-1]
        return J, np.maximum(n, 0.0)

    def nearest_stats(self, levels: np.ndarray) -> tuple[float, np.ndarray]:
        """(J, count per level) of sorted levels under nearest rounding: each element to its nearest
        level, ties to the lower one (the cells cut at the midpoints, FORMAT.md 4.3.1); J the
        squared error sum (x - c)^2, per cell sum x^2 - 2 c sum x + n c^2 by prefix sums."""
        S = self.S
        v = np.asarray(levels, np.float64) - self.shift
        cuts = np.concatenate(([0], np.searchsorted(S.xc, 0.5 * (v[:-1] + v[1:]), side="right"), [S.xc.size]))
        W, P1, P2 = np.diff(S.W[cuts]), np.diff(S.P1[cuts]), np.diff(S.P2[cuts])
        J = float(np.maximum(P2 - 2.0 * v * P1 + v * v * W, 0.0).sum())
        return J, np.maximum(W, 0.0)

    def thin(self, levels: np.ndarray, counts: np.ndarray, lam: float, level_bytes: float) -> np.ndarray:
        """``levels`` without the interior ones whose J saving is worth less than ``lam`` per byte
        they cost: ``level_bytes`` each (the level and its table entry) plus the extra code length
        of their rare IDs, about n_k log2(n_neighbour / n_k) bits (sparse tails of a uniform grid).
        Non-adjacent levels go at a time, so each J saving is exact; a few rounds."""
        S = self.S
        thin = kernels.compiled("thin")
        if thin is not None:
            return self._thin_c(thin, levels, counts, lam, level_bytes)
        v = np.asarray(levels, np.float64)
        n = np.asarray(counts, np.float64)
        for _ in range(THIN_ROUNDS):
            if v.size <= 3:
                break
            k = np.searchsorted(S.xc, v - self.shift, side="left")
            W, P1, P2 = S.W[k], S.P1[k], S.P2[k]
            c = v - self.shift
            a, m, b = c[:-2], c[1:-1], c[2:]
            seg = segment_costs(c, W, P1, P2)
            merged = np.maximum((a + b) * (P1[2:] - P1[:-2]) - a * b * (W[2:] - W[:-2]) - (P2[2:] - P2[:-2]), 0.0)
            dJ = merged - seg[:-1] - seg[1:]
            nk, nb = n[1:-1], np.maximum(n[:-2], n[2:])
            with np.errstate(divide="ignore", invalid="ignore"):
                rare = np.where(nk > 0, nk * np.log2(np.maximum(nb, nk) / nk), 0.0) / 8
            drop = dJ < lam * (level_bytes + rare)
            drop[1::2] &= ~drop[:-1:2]  # never two neighbours in one round
            drop[2::2] &= ~drop[1:-1:2]
            if not drop.any():
                break
            keep = np.concatenate(([True], ~drop, [True]))
            moved = np.zeros_like(n)  # a dropped level's count goes to its neighbours, by eq. 7
            idx = np.flatnonzero(drop) + 1
            up = nk[drop] * (m[drop] - a[drop]) / (b[drop] - a[drop])
            moved[idx + 1] += up
            moved[idx - 1] += nk[drop] - up
            n = (n + moved)[keep]
            v = v[keep]
        return v

    def _thin_c(self, thin, levels: np.ndarray, counts: np.ndarray, lam: float, level_bytes: float) -> np.ndarray:
        """:meth:`thin` in one compiled call (~25 numpy calls a round otherwise), numpy's log2 called
        back between its steps: the same levels."""
        S = self.S
        v = np.array(levels, np.float64)
        n = np.array(counts, np.float64)
        ratio, lg = np.empty(v.size), np.empty(v.size)

        def log2(q: int) -> None:
            np.log2(ratio[:q], out=lg[:q])

        with np.errstate(divide="ignore", invalid="ignore"):
            m = thin(S.xc, S.W, S.P1, S.P2, float(self.shift), v, n, float(lam), float(level_bytes), THIN_ROUNDS,
                     ratio, lg, log2)
        return v[:m]
