"""The planner: a codec whose parameters set a goal (bits= / size= / max_error=) resolved, before
encoding, to one fixed codec per group -- the levels, Z and ID coding chosen as explicit parameters
(so they take part in ==, hash and get_config).

A budget (bits=, size=) is one byte budget over the whole message, split across the groups to
minimise the total J (mucsc.codec.numerics.allocate); max_error= is per group, the smallest message
meeting the bound.  The options come from the searches (:mod:`~mucsc.codec.ratecontrol.search`,
:mod:`~mucsc.codec.ratecontrol.sparse_search`), which measure each by a trial encoding through the
codec's measuring protocol (``Codec.trials``).  The seam for planning without trial encodes: a
search with the same interface (options, sweep, refine, refine_z, exact) fed from summaries."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mucsc.codec.backends.tensors import is_torch_tensor
from mucsc.codec.codecs import base
from mucsc.codec.codecs.base import Codec
from mucsc.codec.codecs._dithered import DitherTrials
from mucsc.codec.codecs.bmucsc import KeptTrials
from mucsc.codec.codecs.clusters import ClusterTrials
from mucsc.codec.numerics import allocate
from mucsc.codec.ratecontrol import dither_search, summary_search
from mucsc.codec.ratecontrol.dither_search import DitherSearch
from mucsc.codec.ratecontrol.goal import GOALS, Goal
from mucsc.codec.ratecontrol.search import ClusterSearch
from mucsc.codec.ratecontrol.sparse_search import SparseSearch
from mucsc.codec.wire import container
from mucsc.errors import ParameterError

@dataclasses.dataclass(frozen=True)
class PlanContext:
    """What the planner knows about the message around the groups it plans."""

    zstd_level: int | None  # how the container will store compressible sections (None: raw)
    elements: int  # elements of the whole message (all records)
    fixed_bytes: int  # exact message bytes outside HEAD and these groups' sections
    rngs: Callable[[int], np.random.Generator]  # a fresh copy of group i's generator (i indexes xs)
    # exact bytes of the HEAD section (header, stored payload, padding) when group i has params[i]
    head_bytes: Callable[[Sequence[Mapping[str, Any]]], int]



CHECKS = 4  # exact checks of an estimated choice against an error bound (one is the rule)
RAISE = 2  # a calibrated choice falling short of its budget by more than this many slacks tries again

# The searches by measuring protocol: what a codec's ``trials`` returns decides how it is searched.
SEARCHES: Mapping[type, Callable[..., Any]] = {ClusterTrials: ClusterSearch, KeptTrials: SparseSearch,
                                                DitherTrials: DitherSearch}


def needs_plan(codec: Codec) -> bool:
    """True when ``codec`` sets a goal: :func:`plan` must see its groups before they are encoded."""
    return Goal.of(codec) is not None


def plan(codec: Codec, xs: Sequence[np.ndarray], ctx: PlanContext,
         encoded: dict[int, base.EncodedGroup] | None = None) -> list[Codec] | None:
    """One fixed codec per group ``xs`` of ``codec`` (None when it sets no goal).  ``encoded``: filled
    with the groups whose chosen encoding the search already made (group i's codec's
    ``encode_array(xs[i], ctx.rngs(i))``, the same bytes), so the caller need not encode them again."""
    goal = Goal.of(codec)
    if goal is None:
        return None
    groups = []
    for i, x in enumerate(xs):
        trials = codec.trials(x)
        rng = lambda i=i: ctx.rngs(i)  # noqa: E731
        if summary_search.applies(trials, goal):
            encode = lambda key, x=x, i=i: resolve(codec, key).encode_array(x, ctx.rngs(i))  # noqa: E731
            groups.append(summary_search.search(trials, rng, ctx.zstd_level, encode))
        elif dither_search.summarised(trials):
            groups.append(dither_search.DitherSummarySearch(trials, rng, ctx.zstd_level))
        else:
            groups.append(SEARCHES[type(trials)](trials, rng, ctx.zstd_level))
    chosen = plan_goal(codec, goal, groups, ctx)
    if encoded is not None:
        for i, (g, o) in enumerate(zip(groups, chosen)):
            done = getattr(g, "encoded", {}).get(o.key)  # a summary search's exact check (one encode)
            if done is not None:
                encoded[i] = done
    return [resolve(codec, o.key) for o in chosen]


def resolve(codec: Codec, choice: Any) -> Codec:
    """``codec`` fixed to one search's choice for one group (its goal cleared)."""
    return codec.replace(**{g: None for g in GOALS}, **choice.settings())


def _cheapest_within_error(g: Any, max_error: float) -> allocate.Option:
    """A ``max_error`` goal for one group: its fewest bytes with relative error <= ``max_error``."""
    meets = lambda o: allocate.relative_error(o.J, g.norm2) <= max_error  # noqa: E731
    J_goal = max_error ** 2 * g.norm2
    if hasattr(g, "aim"):  # a search that can aim at the bound's J (summary_search)
        g.aim(J_goal)
    g.sweep(meets, "error")
    best = allocate.cheapest_within(g.options, g.norm2, max_error)
    if best is None and hasattr(g, "trials_search"):  # beyond the summary's grids: the trial search's reach
        return _cheapest_within_error(g.trials_search(), max_error)
    if best is None:
        raise ParameterError(g.unreachable(max_error))
    cheaper = lambda a, b: (a.bytes, a.J) < (b.bytes, b.J)  # noqa: E731
    best = g.refine_z(g.refine(best, meets, cheaper), meets, cheaper)
    if getattr(g, "estimates", False):
        best = _confirmed(g, best, meets, J_goal)
    return best


def plan_goal(codec: Codec, goal: Goal, groups: Sequence[Any], ctx: PlanContext) -> list[allocate.Option]:
    """The goal search shared by ``mucsc`` and ``bmucsc``: one option per group (:func:`resolve`
    of its key is the fixed codec) for ``goal``.

    ``groups`` measure their options (:class:`ClusterSearch` for mucsc; bmucsc's adds positions and
    the rest's mean): ``options``, ``norm2``, ``sweep(stop, goal)``, ``refine``, ``refine_z``,
    ``exact``, ``unreachable(max_error)`` (the error message) and ``floor_note(option)`` (what the
    smallest message is made of, appended to the "below the smallest" error).  A search whose
    options are estimates (``estimates``: :class:`SummarySearch`) returns exact J from ``exact`` and
    ``closer(option, J_goal)`` after an exact miss of an error bound."""
    if goal.kind == "max_error":
        return [_cheapest_within_error(g, goal.value) for g in groups]
    total = goal.budget(ctx.elements)
    for g in groups:
        g.sweep(lambda o: o.bytes > total - ctx.fixed_bytes, "budget")
    splitter = BudgetSplit(codec, goal, lambda: [g.options for g in groups], [g.norm2 for g in groups],
                           [g.x.size for g in groups], ctx, [g.floor_note for g in groups])
    split, cost = splitter.split, splitter.cost
    best = splitter.balanced(total)
    if len(groups) == 1:  # squeeze the last bytes: mu between the grid points around the budget
        g = groups[0]
        fits = lambda o: cost([o]) <= total  # noqa: E731
        g.refine(best[0], fits, lambda a, b: a.J < b.J)
        g.refine_z(best[0], fits, lambda a, b: a.J < b.J)
        best = split(total)
    # The search used estimated rANS sizes: check the exact size (the cheapest options always fit:
    # checked below).
    fitted = _exact_fit(groups, best, total, cost, split)
    if fitted is not None:
        return fitted
    exact = [g.exact(min(g.options, key=lambda o: (o.bytes, o.J))) for g in groups]
    if cost(exact) > total:
        raise splitter.too_small(exact, cost(exact))
    return exact


class BudgetSplit:
    """A byte budget over the whole message split across groups' option curves (pure: the options'
    bytes and J as given, estimated or exact): each group's squared relative error weighted by its
    size (``weighting="size"``; "damped": by its size to the power allocate.DAMPED_POWER) or the total J, within the codec's ``error_cap`` (or the smallest cap
    the budget allows) and, for a size-weighted split, :data:`allocate.BALANCE` times the message's
    overall error where the budget allows (:meth:`balanced`).  ``curves()[i]`` is group i's options
    (asked at each split: a search may add or rescale options between splits); ``notes[i](option)``:
    what the error naming a budget below the smallest message appends for group i."""

    def __init__(self, codec: Codec, goal: Goal, curves: Callable[[], Sequence[Sequence[allocate.Option]]],
                 norm2s: Sequence[float], sizes: Sequence[int], ctx: PlanContext,
                 notes: Sequence[Callable[[allocate.Option], str]] | None = None):
        self.codec, self.what, self.curves, self.ctx = codec, str(goal), curves, ctx
        self.norm2s, self.sizes, self.notes = list(norm2s), list(sizes), notes
        self.cap: float | None = getattr(codec.params, "error_cap", None)  # raised or lowered by the splits
        weighting = getattr(codec.params, "weighting", "total")
        self.size_weighted = weighting in ("size", "damped")
        self.power = allocate.DAMPED_POWER if weighting == "damped" else 1.0  # of the sizes weighing J
        self._heads: dict[tuple, int] = {}  # HEAD bytes by the groups' params (a JSON dump and zstd each)

    def cost(self, chosen: Sequence[allocate.Option]) -> int:
        """The exact message size with these options."""
        params = tuple(o.key.params for o in chosen)
        if params not in self._heads:
            self._heads[params] = self.ctx.head_bytes([dict(p) for p in params])
        return self.ctx.fixed_bytes + self._heads[params] + sum(o.bytes for o in chosen)

    def too_small(self, chosen: Sequence[allocate.Option], size: int) -> ParameterError:
        note = "" if self.notes is None else "".join(n(o) for n, o in zip(self.notes, chosen))
        return ParameterError(f"{self.what} is below the smallest {self.codec.name} message for this input: "
                              f"{size} bytes ({8 * size / max(self.ctx.elements, 1):.3g} bits per element){note}")

    def split(self, total: int) -> list[allocate.Option]:
        """One option per group, the message within ``total`` bytes (:meth:`cost`)."""
        curves = self.shaped(total)
        cheapest = [min(c, key=lambda o: (o.bytes, o.J)) for c in curves]
        least = self.cost(cheapest)
        if least > total:
            raise self.too_small(cheapest, least)
        # HEAD's size depends on the params chosen (and is zstd'd): split what is left after the
        # HEAD of the last choice, check the exact size, and retry with the difference.
        best, tried = cheapest, set()
        budget = total - (least - sum(o.bytes for o in cheapest))
        while budget not in tried and len(tried) < 8:
            tried.add(budget)
            try:
                chosen = allocate.split_budget(curves, budget)
            except ParameterError:
                break
            size = self.cost(chosen)
            if size <= total and sum(o.J for o in chosen) < sum(o.J for o in best):
                best = chosen
            budget += total - size
            if size > total:  # the HEAD of this choice is larger: make the next split choose less
                budget = min(budget, sum(o.bytes for o in chosen) - 1)
        return best

    def shaped(self, total: int) -> list[list[allocate.Option]]:
        """The options the split chooses from: within the error cap (or the smallest cap the budget
        allows), J weighted as ``p.weighting`` says."""
        curves = [list(c) for c in self.curves()]
        if self.cap is not None:
            least = allocate.least_cap(curves, self.norm2s, self.cap, lambda chosen: self.cost(chosen) <= total)
            if least is not None:
                curves = allocate.capped(curves, self.norm2s, least)
        if self.size_weighted:
            curves = allocate.relative_curves(curves, self.sizes, self.norm2s, self.power)
        return curves

    def balanced(self, total: int) -> list[allocate.Option]:
        """:meth:`split`, and for a checkpoint's (size-weighted) split of several groups again with
        every group within BALANCE x the overall relative error where the budget allows: the size
        weighting alone leaves a tiny tensor (a token-type embedding: its codebook costs as much as
        its IDs) several times worse than the rest.  The cap found stays for later splits."""
        best = self.split(total)
        if self.size_weighted and len(self.sizes) > 1:
            q, n = self.norm2s, self.sizes
            overall = allocate.relative_error(sum(o.J * a / b ** self.power for o, a, b in zip(best, q, n)), sum(q))
            if overall > 0 and (self.cap is None or allocate.BALANCE * overall < self.cap):
                self.cap = allocate.BALANCE * overall
                best = self.split(total)
        return best



def _exact_fit(groups: Sequence[Any], best: list[allocate.Option], total: int,
               cost: Callable[[list[allocate.Option]], int], split: Callable[[int], list[allocate.Option]]
               ) -> list[allocate.Option] | None:
    """``best`` (a split of ``total`` on estimated sizes) checked exactly, or a corrected choice that
    fits; None when none fits after a few.  An overshoot shrinks the budget by itself (below the
    choice's estimated cost); a search that calibrates (its estimates scaled by the exact size
    measured: ``calibrate``, which returns its slack) aims its slack below the budget instead, after
    a miss either way (once after falling short by more than RAISE slacks), and the choice of least
    J that fits is kept."""
    goal, fitting, raised = total, None, False
    for _ in range(8):
        exact = [g.exact(o) for g, o in zip(groups, best)]
        size, J = cost(exact), sum(e.J for e in exact)
        if size <= total and (fitting is None or J < fitting[1]):
            fitting = (best, J)
        slack = sum(g.calibrate(o, e) for g, o, e in zip(groups, best, exact) if hasattr(g, "calibrate"))
        if size <= total:
            if not slack or raised or size >= total - RAISE * slack:
                break
            raised, goal = True, total - slack
        elif slack:
            goal = min(goal, total) - slack
        else:
            # Ask the next split for the overshoot less than this choice's *estimate*: when the options
            # are sparse there, this choice may sit below the goal by more than the overshoot (the
            # estimate off by more: subsampled counts), and the goal less the overshoot picks it again.
            goal = min(goal, cost(best)) - (size - total)
        if len(groups) == 1 and getattr(groups[0], "estimates", False):  # its options are cheap: squeeze again
            groups[0].refine(best[0], lambda o: cost([o]) <= goal, lambda a, b: a.J < b.J)
        best = split(goal)
    return None if fitting is None else fitting[0]


def _confirmed(g: Any, best: allocate.Option, meets: Callable[[allocate.Option], bool],
               J_goal: float) -> allocate.Option:
    """``best`` of a search that estimates J, measured exactly (the option it encoded: its ID coding
    may be the other one, when smaller), or the option one step closer when its exact J misses the
    bound."""
    for _ in range(CHECKS):
        exact = g.exact(best)
        if meets(exact):
            return exact
        best = g.closer(exact, J_goal)
    raise RuntimeError(f"the error bound was missed after {CHECKS} exact checks")  # J ~ step^2: cannot happen


def plan_alone(codec: Codec, x: Any, rng: np.random.Generator
               ) -> tuple[Codec, np.ndarray, np.random.Generator, base.EncodedGroup | None]:
    """A goal codec's ``encode_array`` called directly (not through the API, which plans a whole
    message): plan ``x`` as a message of its own -> (the planned codec, x on the host, where
    planning runs, a generator in ``rng``'s state, so the encode draws what the plan drew, and that
    encoding when the plan already made it)."""
    level = None if codec.params.id_packing == "tight" else container.DEFAULT_ZSTD_LEVEL
    state = rng.bit_generator.state
    fresh = lambda: _restored(rng, state)  # noqa: E731
    host = x.cpu().numpy() if is_torch_tensor(x) else x
    done: dict[int, base.EncodedGroup] = {}
    (planned,) = plan(codec, [host], PlanContext(level, host.size, 0, lambda i: fresh(), lambda params: 0), done)
    return planned, host, fresh(), done.get(0)


def _restored(rng: np.random.Generator, state: dict) -> np.random.Generator:
    """A new generator of ``rng``'s kind in the given state (a replay of the same draws)."""
    g = np.random.Generator(type(rng.bit_generator)())
    g.bit_generator.state = state
    return g


base._lone_planner[:] = [plan_alone]
