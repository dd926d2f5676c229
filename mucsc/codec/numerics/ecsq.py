"""Entropy-constrained unbiased levels: minimise J + lambda * R over level sets (docs/centroids.md).

With stochastic rounding (eq. 7) an element x in [c_k, c_{k+1}] is sent as c_{k+1} with probability
(x - c_k) / (c_{k+1} - c_k), so level k receives the expected count

    n_k = sum_{x in [c_{k-1}, c_k)} (x - c_{k-1}) / (c_k - c_{k-1}) + sum_{x in [c_k, c_{k+1})} (c_{k+1} - x) / (c_{k+1} - c_k)

and a static entropy coder (mucsc.codec.wire.rans) spends about R = sum_k -n_k log2(n_k / d) bits on the
IDs, plus the level itself and its frequency (``level_bits``).  J (eq. 8-9) is a sum over segments;
n_k couples a level to both neighbours only, so a DP whose state is the last two levels (p, k) is
exact over a candidate set: V(k, l) = min_p V(p, k) + J(k, l) + lambda * r(up(p, k) + down(k, l)).
Unlike the J-optimal solvers, the two end levels may lie beyond the data (only bracketing is needed
for unbiasedness): at low rates a wider range sends most elements to a level near zero.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mucsc.codec import kernels
from mucsc.codec.numerics.centroids import _candidates, _sample_sorted, _Sorted

__all__ = ["Prepared", "prepare", "solve"]

INTERIOR_CANDIDATES = 256
# End levels tried: min - t * span and max + t * span for these t.
END_STEPS = (0.0, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """Candidates and the pair tables of one vector, reusable across lambdas."""

    shift: float
    cand: np.ndarray  # candidate levels (centred), increasing
    left: np.ndarray  # bool: candidate can be the first level (<= min)
    right: np.ndarray  # bool: candidate can be the last level (>= max)
    J: np.ndarray  # J of segment (i, j), i < j
    up: np.ndarray  # expected count sent to the upper end of segment (i, j)
    down: np.ndarray  # ... to the lower end
    tail: np.ndarray  # count at or beyond candidate j (the last level takes it)
    total: float  # d (sum of weights)
    norm2: float


def prepare(x: np.ndarray, m: int = INTERIOR_CANDIDATES) -> Prepared:
    """Sort (or subsample) ``x`` once and tabulate J, up and down counts for all candidate pairs."""
    x = np.asarray(x).reshape(-1)
    lo, hi = float(x.min()), float(x.max())
    xs, w = _sample_sorted(x, lo, hi)
    shift = 0.5 * (lo + hi)
    xc = xs - shift
    S = _Sorted(xc, w)
    span = max(hi - lo, np.finfo(np.float64).tiny)
    inner = _candidates(xc, S.W, m)
    inner = inner[(inner > xc[0]) & (inner < xc[-1])]
    extra = [0.0 - shift] if lo < 0.0 < hi else []
    lefts = xc[0] - span * np.array(END_STEPS)
    rights = xc[-1] + span * np.array(END_STEPS)
    cand = np.unique(np.concatenate((lefts, inner, extra, rights)))
    left = cand <= xc[0]
    right = cand >= xc[-1]
    pos = np.searchsorted(xc, cand, side="left")
    W, P1, P2 = S.W[pos], S.P1[pos], S.P2[pos]
    a, b = cand[:, None], cand[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        N = W[None, :] - W[:, None]
        s1 = P1[None, :] - P1[:, None]
        s2 = P2[None, :] - P2[:, None]
        J = np.maximum((a + b) * s1 - a * b * N - s2, 0.0)
        up = np.clip(np.where(b > a, (s1 - a * N) / (b - a), 0.0), 0.0, np.maximum(N, 0.0))
    down = np.maximum(N - up, 0.0)
    tail = S.W[-1] - W
    norm2 = kernels.dot(xs * xs, w) if w is not None else kernels.dot(xs, xs)
    return Prepared(shift, cand, left, right, J, up, down, tail, float(S.W[-1]), norm2)


def _rate(n: np.ndarray, total: float) -> np.ndarray:
    """-n log2(n / total), 0 for n = 0 (call under np.errstate(divide=..., invalid="ignore"): the
    n = 0 entries are computed, then replaced)."""
    r = -n * np.log2(n / total)
    return np.where(n > 0, r, 0.0)


def solve(P: Prepared, lam: float, level_bits: float = 48.0) -> tuple[np.ndarray, float, float]:
    """Levels minimising J + lam * (ID bits + level_bits per level) over the candidates: (levels
    (float64, increasing, bracketing the data), expected J, expected bits)."""
    m = P.cand.size
    INF = np.inf
    V = np.full((m, m), INF)  # V[p, k]: best cost with last two levels p < k (k's rate pending)
    back = np.full((m, m), -2, np.int64)  # previous of p; -1: p is the first level
    first_cost = np.where(P.left, lam * level_bits, INF)  # a first level: only its own cost
    interior_ok = ~P.left  # a level after the first must lie above the minimum
    with np.errstate(divide="ignore", invalid="ignore"):  # once, not per _rate call (same values)
        best_total, best_end = _dp(P, lam, level_bits, V, back, first_cost, interior_ok)
    if best_end is None:
        raise RuntimeError("no level set brackets the data")  # the ends always do: cannot happen
    p, k = best_end
    seq = [k]
    while p >= 0:
        seq.append(p)
        p, k = int(back[p, k]), p
    idx = np.array(seq[::-1])
    levels = P.cand[idx] + P.shift
    J = float(sum(P.J[i, j] for i, j in zip(idx[:-1], idx[1:])))
    return levels, J, (best_total - J) / lam if lam > 0 else float("nan")


def _dp(P: Prepared, lam: float, level_bits: float, V: np.ndarray, back: np.ndarray, first_cost: np.ndarray,
        interior_ok: np.ndarray) -> tuple[float, tuple[int, int] | None]:
    """The DP of :func:`solve` over the candidates (fills V and back): (best total, its last two levels)."""
    m = P.cand.size
    best_total, best_end = np.inf, None
    interior = np.flatnonzero(interior_ok)  # increasing
    for k in range(m):
        # incoming states for k as the current level: from "start" (k is the first level) or (p, k)
        ps = np.flatnonzero(np.isfinite(V[:k, k]))
        inc_cost = np.concatenate(([first_cost[k]], V[ps, k]))
        inc_mass = np.concatenate(([0.0], P.up[ps, k]))
        inc_from = np.concatenate(([-1], ps))
        ok = np.isfinite(inc_cost)
        if not ok.any():
            continue
        inc_cost, inc_mass, inc_from = inc_cost[ok], inc_mass[ok], inc_from[ok]
        if P.right[k]:  # k as the last level: it takes the rest of the data
            tot = inc_cost + lam * _rate(inc_mass + P.tail[k], P.total)
            i = int(np.argmin(tot))
            if tot[i] < best_total:
                best_total, best_end = float(tot[i]), (int(inc_from[i]), k)
            continue  # nothing lies beyond a last level
        ls = interior[np.searchsorted(interior, k, side="right"):]  # the interior candidates above k
        if ls.size == 0:
            continue
        cost = (inc_cost[:, None] + lam * _rate(inc_mass[:, None] + P.down[k, ls][None, :], P.total)
                + P.J[k, ls][None, :] + lam * level_bits)
        i = np.argmin(cost, axis=0)
        V[k, ls] = cost[i, np.arange(ls.size)]
        back[k, ls] = inc_from[i]
    return best_total, best_end
