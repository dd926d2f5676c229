"""Rate allocation: choose one encoding per group so that a message meets a byte budget or an error bound.

Each group of a message (one tensor, or several sharing a codebook) can be encoded in several ways,
each with a cost in bytes and an expected squared error J (eq. 8-9 for MUCSC).  A caller lists them
per group as :class:`Option` s and asks:

* :func:`split_budget` -- one option per group, total bytes <= budget, total J as small as possible.
  Greedy on the lower convex hull of each group's (bytes, J) points: start every group at its
  cheapest option and repeatedly take the upgrade with the largest J saved per extra byte that still
  fits.  On the hulls this is the Lagrangian (common-lambda) solution, optimal up to the last upgrade
  that did not fit; a final pass spends what is left on any option, hull or not, that lowers J.
* :func:`cheapest_within` -- per group: the cheapest option whose relative error sqrt(J) / ||x|| is
  at most a bound (``--max-error`` per tensor).
* :func:`relative_curves` and :func:`capped` -- what a checkpoint's budget split minimises instead of
  the total J (each group's squared relative error weighted by its element count, so that a small
  tensor is not starved for a large one's sake) and the per-group error cap it keeps where the
  budget allows (:func:`least_cap`: the smallest cap the budget can meet).

The module knows nothing about codecs: an option's ``key`` is whatever the caller needs to re-create
the encoding (the mucsc codec uses the number of centroids).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections.abc import Callable, Hashable, Sequence

from mucsc.errors import ParameterError

# A size-weighted (checkpoint) split keeps every group within this many times the message's overall
# relative error where the budget allows (GGUF's block quantizers land within ~1.2x by construction)
BALANCE = 2.0
# A damped split (weighting "damped": a checkpoint's) weighs each group's squared relative error by
# its element count to this power instead of the count itself.  With the count itself the split
# equalises every tensor's relative error, the least overall error of the weights; but what a model
# computes goes through each matrix once, whatever its size, and an embedding table (half of
# all-MiniLM-L6-v2's weights) then takes half the bits.  Measured on all-MiniLM-L6-v2 at 4.5
# bits/weight (benchmarks/bench_gguf.py): power 1: 5.26% overall error, sentence embeddings 1 - cos
# 1.19e-2; 0.8: 5.32%, 8.32e-3; 0.7: 5.74%, 5.96e-3 (the embedding table past 7%).
DAMPED_POWER = 0.8

__all__ = ["Option", "lower_hull", "split_budget", "cheapest_within", "relative_error", "relative_curves",
           "capped", "least_cap", "DAMPED_POWER"]


@dataclasses.dataclass(frozen=True)
class Option:
    """One way to encode a group: its exact cost in bytes, its expected squared error J, and ``key``
    (what the caller needs to reproduce it)."""

    bytes: int
    J: float
    key: Hashable


def relative_error(J: float, norm2: float) -> float:
    """sqrt(J) / ||x|| (0 for a zero vector): the quantity ``max_error`` bounds."""
    return math.sqrt(max(J, 0.0) / norm2) if norm2 > 0 else 0.0


def lower_hull(options: Sequence[Option]) -> list[Option]:
    """The options on the lower convex hull of the (bytes, J) points, by increasing bytes and strictly
    decreasing J (dominated options -- more bytes and no less J -- are dropped)."""
    pts: list[Option] = []
    for o in sorted(options, key=lambda o: (o.bytes, o.J)):
        if pts and o.J >= pts[-1].J:
            continue  # dominated: costs at least as much, saves nothing
        while len(pts) >= 2:
            a, b = pts[-2], pts[-1]
            # b lies on or above the segment a-o: drop it (cross product of (b - a) and (o - a))
            if (b.J - a.J) * (o.bytes - a.bytes) >= (o.J - a.J) * (b.bytes - a.bytes):
                pts.pop()
            else:
                break
        pts.append(o)
    return pts


def split_budget(curves: Sequence[Sequence[Option]], budget: int) -> list[Option]:
    """One option per group with total bytes <= ``budget`` and total J near-minimal (see the module
    docstring).  Raises :class:`ParameterError` when even the cheapest options together exceed it."""
    if not curves:
        return []
    if any(not c for c in curves):
        raise ParameterError("every group needs at least one option")
    hulls = [lower_hull(c) for c in curves]
    spent = sum(h[0].bytes for h in hulls)
    if spent > budget:
        raise ParameterError(f"the budget of {budget} bytes is below the smallest possible size, {spent} bytes")
    chosen, spent = _climb_hulls(hulls, spent, budget)
    return _spend_leftover(curves, chosen, spent, budget)


def _climb_hulls(hulls: list[list[Option]], spent: int, budget: int) -> tuple[list[Option], int]:
    """Greedy on the hulls: repeatedly take the next hull step with the most J saved per byte that
    still fits the budget (ties: the first group) -> (one option per group, bytes spent).  A heap of
    each group's next step: a step that does not fit now never will (the spending only grows), so its
    group is done (O(steps log groups): a scan of every group per step took ~1 s for 145 groups)."""
    pick = [0] * len(hulls)

    def step(g: int) -> tuple[float, int, int] | None:
        h, i = hulls[g], pick[g]
        if i + 1 >= len(h):
            return None
        extra = h[i + 1].bytes - h[i].bytes
        rate = (h[i].J - h[i + 1].J) / extra if extra > 0 else math.inf
        return (-rate, g, extra) if rate > 0.0 else None

    heap = [s for s in map(step, range(len(hulls))) if s is not None]
    heapq.heapify(heap)
    while heap:
        _, g, extra = heapq.heappop(heap)
        if spent + extra > budget:
            continue
        spent += extra
        pick[g] += 1
        nxt = step(g)
        if nxt is not None:
            heapq.heappush(heap, nxt)
    return [h[i] for h, i in zip(hulls, pick)], spent


def _spend_leftover(curves: Sequence[Sequence[Option]], chosen: list[Option], spent: int,
                    budget: int) -> list[Option]:
    """Leftover bytes: the best affordable option of each group, hull or not (greedy, largest J saved)."""
    while True:
        best_g, best_o, best_saved = -1, None, 0.0
        for g, c in enumerate(curves):
            for o in c:
                if spent - chosen[g].bytes + o.bytes <= budget and chosen[g].J - o.J > best_saved:
                    best_g, best_o, best_saved = g, o, chosen[g].J - o.J
        if best_o is None:
            return chosen
        spent += best_o.bytes - chosen[best_g].bytes
        chosen[best_g] = best_o


def cheapest_within(options: Sequence[Option], norm2: float, max_error: float) -> Option | None:
    """The cheapest option with sqrt(J) / ||x|| <= ``max_error`` (ties: smaller J), or None."""
    ok = [o for o in options if relative_error(o.J, norm2) <= max_error]
    return min(ok, key=lambda o: (o.bytes, o.J)) if ok else None


def relative_curves(curves: Sequence[Sequence[Option]], sizes: Sequence[int],
                    norm2s: Sequence[float], power: float = 1.0) -> list[list[Option]]:
    """The curves with J replaced by n^power * J / ||x||^2 (n elements): with power 1 minimising
    their sum minimises the mean over all elements of each one's tensor's squared relative error
    (below 1, :data:`DAMPED_POWER`, a large tensor counts less than its elements).  Total J (the
    paper's objective for an update, where errors add up) lets a small tensor with a small norm -- a
    bias, a key projection -- go to hundreds of percent for a negligible saving on a large one."""
    return [[dataclasses.replace(o, J=o.J * n ** power / q) if q > 0 else o for o in c]
            for c, n, q in zip(curves, sizes, norm2s)]


def capped(curves: Sequence[Sequence[Option]], norm2s: Sequence[float], cap: float) -> list[list[Option]] | None:
    """Each curve's options with relative error sqrt(J) / ||x|| <= ``cap`` (J unweighted), or None
    when some group has none."""
    out = [[o for o in c if relative_error(o.J, q) <= cap] for c, q in zip(curves, norm2s)]
    return None if any(not c for c in out) else out


def least_cap(curves: Sequence[Sequence[Option]], norm2s: Sequence[float], cap: float,
              fits: Callable[[Sequence[Option]], bool]) -> float | None:
    """The smallest cap >= ``cap`` whose cheapest per-group options (J unweighted) ``fits`` the
    budget: ``cap`` itself when it fits, None when not even the cheapest options fit.  The caps
    tried are the groups' own relative errors, so the answer is exact."""
    def cheapest(c: float) -> list[Option] | None:
        within = capped(curves, norm2s, c)
        return None if within is None else [min(o, key=lambda o: (o.bytes, o.J)) for o in within]

    first = cheapest(cap)
    if first is not None and fits(first):
        return cap
    levels = sorted({relative_error(o.J, q) for c, q in zip(curves, norm2s) for o in c if relative_error(o.J, q) > cap})
    lo, hi = 0, len(levels) - 1  # bisect: fitting is monotone in the cap
    if not levels or not ((top := cheapest(levels[hi])) is not None and fits(top)):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        c = cheapest(levels[mid])
        if c is not None and fits(c):
            hi = mid
        else:
            lo = mid + 1
    return levels[lo]
