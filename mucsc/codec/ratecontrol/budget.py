"""A byte budget (``bits=``, ``size=``) met without trial encodes, in the three phases a stream of
tensors can follow (issue 35: a checkpoint compressed tensor by tensor):

1. :func:`summarize` -- one group at a time, its option curve measured on its sorted summary
   (:mod:`~mucsc.codec.ratecontrol.summary_search`: uniform grids, J from prefix sums, the IDs' bytes
   from their expected counts).  What is kept (:class:`GroupSummary`) is the curve, a few hundred
   numbers: the sample itself is dropped with the group, so memory is O(sample), not O(model).
2. :class:`Budget` -- a pure split of the budget over the curves (the planner's
   :class:`~mucsc.codec.ratecontrol.planner.BudgetSplit`: size or damped weighting, error cap, balance), each
   group's choice a grid step (its levels kept from phase 1 as an array, not a tuple of floats).
3. :meth:`Budget.encode` -- each group encoded once with its choice, in order, its exact bytes
   recorded.  The estimates err by a few bytes per group (and ~0.3% on a subsampled group's IDs), so
   the split aims ``MARGIN`` of the estimated bytes below the budget and, for the last
   ``CORRECT`` groups, splits again what is left after the bytes written so far: the total lands
   close under the budget.  Should the last group still overshoot, it is encoded again with cheaper
   options until the message fits (``re_encodes`` counts them; the estimates make it rare).

Used where every group of the codec is a clustering with rANS-coded IDs allowed and the message is
large (:func:`applies`); other goals, codecs and small messages keep the planner's searches (:func:`mucsc.codec.ratecontrol.planner.plan`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from mucsc.codec.codecs.base import Codec, EncodedGroup
from mucsc.codec.codecs.clusters import ClusterTrials
from mucsc.codec.numerics import allocate
from mucsc.codec.ratecontrol import summary_search
from mucsc.codec.ratecontrol.goal import Goal
from mucsc.codec.ratecontrol.planner import BudgetSplit, PlanContext, resolve
from mucsc.codec.ratecontrol.search import group_bytes
from mucsc.errors import ParameterError

__all__ = ["GroupSummary", "Budget", "applies", "summarize"]

# Smaller messages keep the planner's searches: trial encodes are cheap there, and for groups under
# summary_search.MIN_ELEMENTS their ecsq levels and exact fit are ~1-2% lower in error at the same
# bytes (the 30,000-element stochastic-rounding cases of tests/test_goal_digests.py: relative error
# 2.360 against 2.385 at bits=0.5, 0.445 against 0.451 at bits=2)
MIN_ELEMENTS = 1 << 20
CORRECT = 8  # the last groups are split again from the bytes actually written
# The last group is encoded once more, its estimates scaled by the first try's miss, when that try
# overshot or left more than this share of the budget unspent (a BERT-shaped file's --bits 8.5
# overshot by 732 bytes, and the next cheaper grid left 0.3% unspent: 8.473 bits per element)
UNSPENT = 1e-3
# The first split aims this share of the groups' estimated bytes below the budget (the subsampled
# groups' estimates err by up to ~0.3%), plus SLACK_BYTES per group (rANS table and state rounding)
MARGIN = 2e-3
SLACK_BYTES = 8
# A group's curve stops at this many bits per element above the message's mean, plus HEADROOM_BYTES
# (a small group's codebook: a 512-weight embedding at 8.5 bits/weight on average takes ~18
# bits/weight to stay within 2x the message's error).  At equal relative error two large groups differ
# by the differential entropies of their normalised values (a Gaussian's is the largest at a given
# variance), about a bit between a transformer's matrices: the splits measured (all-MiniLM-L6-v2
# at 4.5 and 8.5 bits, a generated 335M-weight model) give no group of 2^15 or more elements over
# 0.7 bits above the mean.  Below the mean less HEADROOM_BITS a large group's grids are an
# octave apart.  Against 8 bits and every grid a quarter of a bit apart: 49 grids per tensor instead
# of 74, the summaries of 30 tensors of the 335M-weight file 0.59 s CPU instead of 0.86 s.
HEADROOM_BITS, HEADROOM_BYTES = 4.0, 4096


@dataclasses.dataclass(frozen=True)
class GroupSummary:
    """What the split needs of one group: its element count, squared norm, the options measured on
    its summary (keys without their grid levels) and each grid option's levels as the wire carries
    them (``wires``: :meth:`full` puts them back into the chosen key; no second look at the data)."""

    size: int
    norm2: float
    options: tuple[allocate.Option, ...]
    wires: Mapping[Any, np.ndarray] = dataclasses.field(default_factory=dict, compare=False)

    def full(self, key: Any) -> Any:
        """The choice of a compact key with its levels."""
        wire = self.wires.get(key)
        return key if wire is None else dataclasses.replace(key, levels=tuple(map(float, wire)))


def applies(codec: Codec, elements: int) -> bool:
    """True when ``codec`` sets a byte budget, its groups are clusterings that may code IDs with rANS
    (mucsc with id_coding "auto" or "rans", stochastic or nearest rounding) and the message has at
    least :data:`MIN_ELEMENTS` elements."""
    goal = Goal.of(codec)
    if goal is None or goal.kind == "max_error" or elements < MIN_ELEMENTS:
        return False
    trials = codec.trials(np.zeros(2, np.float32))
    return isinstance(trials, ClusterTrials) and trials.p.id_coding in ("auto", "rans")


def _search(codec: Codec, x: np.ndarray, zstd_level: int | None) -> summary_search.SummarySearch:
    """``x``'s summary search (its options are estimates: nothing is encoded)."""
    def never(key: Any) -> EncodedGroup:
        raise RuntimeError("a budget's summary search does not encode")
    return summary_search.search(codec.trials(x), lambda: np.random.default_rng(0), zstd_level, never)


def summarize(codec: Codec, x: np.ndarray, zstd_level: int | None, max_bits: float) -> GroupSummary:
    """Phase 1: group ``x``'s options under ``codec``'s budget, from the coarsest grid up to
    ``max_bits`` bits per element (the caller's mean rate plus :data:`HEADROOM_BITS`) and
    :data:`HEADROOM_BYTES`, without
    encoding (an empty or constant group: one trial option)."""
    g = _search(codec, x, zstd_level)
    g.packed_twins = x.size < summary_search.MIN_ELEMENTS  # small groups: packed IDs may be smaller
    g.wires = {}  # the grids' keys without their levels (kept as arrays)
    if x.size >= summary_search.MIN_ELEMENTS:  # a large group: octaves below mean - headroom
        g.fine_from_bits = max_bits - 2 * HEADROOM_BITS
    g.sweep(lambda o: o.bytes > max_bits * x.size / 8 + HEADROOM_BYTES, "budget")
    if x.size and g.lo != g.hi:  # the coarse end, which that sweep stops at once: the fewest bits
        for j in range(2, summary_search.COARSEST + 1):  # (a few levels each: cheap)
            g.grid((g.hi - g.lo) * 2.0 ** j)
    return GroupSummary(int(x.size), float(g.norm2), tuple(g.options), g.wires)


def max_bits(goal: Goal, elements: int) -> float:
    """How far each group's curve goes: the message's mean rate plus :data:`HEADROOM_BITS`."""
    return 8 * goal.budget(elements) / max(elements, 1) + HEADROOM_BITS


class Budget:
    """Phases 2 and 3 (the module docstring) for groups summarised in order.  ``ctx``: the message
    around the groups (its ``fixed_bytes`` and ``head_bytes`` as for the planner; ``rngs`` unused:
    :meth:`encode` takes the group's generator)."""

    def __init__(self, codec: Codec, summaries: Sequence[GroupSummary], ctx: PlanContext):
        goal = Goal.of(codec)
        if goal is None or goal.kind == "max_error":
            raise ParameterError(f"codec {codec.name!r} sets no byte budget")
        self.codec, self.goal, self.ctx = codec, goal, ctx
        self.summaries = list(summaries)
        self.total = goal.budget(ctx.elements)
        curves = [list(s.options) for s in self.summaries]
        self.splitter = BudgetSplit(codec, goal, lambda: curves,
                                    [s.norm2 for s in self.summaries], [s.size for s in self.summaries], ctx)
        aim = self.total
        chosen = self.splitter.balanced(self.total)  # the exact budget first: the error's own floor
        margin = sum(math.ceil(MARGIN * o.bytes) + SLACK_BYTES for o in chosen)
        if len(self.summaries) > CORRECT and margin:
            aim = self.total - margin
            try:
                chosen = self.splitter.split(aim)  # the cap the balance set, below the budget by the margin
            except ParameterError:  # only the exact budget fits: keep its split
                aim = self.total
        self.planned: list[allocate.Option] = chosen
        self.written: list[allocate.Option] = []  # exact options of the groups encoded so far
        self.re_encodes = 0

    def choice(self, i: int) -> allocate.Option:
        """Group i's option (estimated): the first split's, or for the last :data:`CORRECT` groups a
        split of what the groups written so far left."""
        if i != len(self.written):
            raise ParameterError(f"groups are encoded in order: expected group {len(self.written)}, got {i}")
        n = len(self.summaries)
        if n - i > CORRECT or i == 0:
            return self.planned[i]
        rest = self._rest(i)
        try:
            self.planned[i:] = rest.split(self.total)
        except ParameterError:  # even the cheapest options overshoot now: the cheapest
            self.planned[i:] = [min(s.options, key=lambda o: (o.bytes, o.J)) for s in self.summaries[i:]]
        return self.planned[i]

    def _rest(self, i: int) -> BudgetSplit:
        """A split of groups i.. with the groups before them as written (their bytes and HEAD params
        fixed), within the cap the first split settled on."""
        done = self.written[:i]
        ctx = dataclasses.replace(self.ctx, fixed_bytes=self.ctx.fixed_bytes + sum(o.bytes for o in done),
                                  head_bytes=lambda params: self.ctx.head_bytes(
                                      [dict(o.key.params) for o in done] + list(params)))
        rest = self.summaries[i:]
        curves = [list(s.options) for s in rest]
        split = BudgetSplit(self.codec, self.goal, lambda: curves, [s.norm2 for s in rest],
                            [s.size for s in rest], ctx)
        split.cap = self.splitter.cap
        return split

    def encode(self, i: int, x: np.ndarray, rng: Callable[[], np.random.Generator]
               ) -> tuple[Codec, EncodedGroup]:
        """Phase 3: group i (``x``, its generator from ``rng()``) encoded once with its choice ->
        (the fixed codec, the encoding); the last group again with cheaper options should the
        message still exceed the budget."""
        o = self.choice(i)
        last = i == len(self.summaries) - 1
        key, guess = self._squeezed(x, o) if last else (self.summaries[i].full(o.key), o)
        codec = resolve(self.codec, key)
        enc = codec.encode_array(x, rng())
        exact = self._exact(o, key, enc)
        left = self.total - self.size([*self.written, exact]) if last else 0
        if (left < 0 or left > UNSPENT * self.total) and guess.bytes > 0 and exact.bytes != guess.bytes:
            # the estimate missed (a subsampled tensor's IDs, a zstd'd section): once more, scaled
            key2, _ = self._squeezed(x, o, exact.bytes / guess.bytes)
            codec2 = resolve(self.codec, key2)
            enc2 = codec2.encode_array(x, rng())
            exact2 = self._exact(o, key2, enc2)
            self.re_encodes += 1
            if self.size([*self.written, exact2]) <= self.total and (left < 0 or exact2.J < exact.J):
                key, codec, enc, exact = key2, codec2, enc2, exact2
        if last:
            cheaper = sorted((c for c in self.summaries[i].options if c.bytes < o.bytes), key=lambda c: -c.bytes)
            while self.size([*self.written, exact]) > self.total and cheaper:
                self.re_encodes += 1
                c = cheaper.pop(0)
                key = self.summaries[i].full(c.key)
                codec = resolve(self.codec, key)
                enc = codec.encode_array(x, rng())
                exact = self._exact(c, key, enc)
        self.written.append(exact)
        return codec, enc

    def _squeezed(self, x: np.ndarray, o: allocate.Option, scale: float = 1.0) -> tuple[Any, allocate.Option]:
        """The last group's full choice and its estimate: its step moved continuously (bisected
        between the grids around the bytes left, as the planner squeezes a single group) to fill
        what the groups written so far left, less its own estimate's margin; ``scale``: the
        estimates' bytes times this (the exact size of a first try over its estimate)."""
        if o.key.grid_step is None:
            return o.key, o
        g = _search(self.codec, x, self.ctx.zstd_level)
        g.packed_twins = o.key.coding == "packed"
        steps = sorted({c.key.grid_step for c in self.summaries[-1].options if c.key.grid_step is not None})
        k = steps.index(o.key.grid_step)
        reach = 1 if scale == 1.0 else 3  # the choice and its neighbouring grids (further after a miss)
        for step in steps[max(k - reach, 0): k + reach + 1]:
            g.grid(step)
        aim = self.total - math.ceil(MARGIN * o.bytes) - SLACK_BYTES
        fits = lambda c: self.size([*self.written, dataclasses.replace(c, bytes=math.ceil(c.bytes * scale))]) <= aim  # noqa: E731
        mine = [c for c in g.options if c.key.grid_step == o.key.grid_step and c.key.coding == o.key.coding]
        start = min((c for c in g.options if c.key.coding == o.key.coding and fits(c)), key=lambda c: c.J,
                    default=mine[0])
        best = g.refine(start, fits, lambda a, b: a.J < b.J)
        return (best.key, best) if fits(best) else (mine[0].key, mine[0])

    def _exact(self, o: allocate.Option, key: Any, enc: EncodedGroup) -> allocate.Option:
        J = enc.stats["J"]
        return allocate.Option(group_bytes(enc.sections, self.ctx.zstd_level), float(J() if callable(J) else J),
                               dataclasses.replace(key, levels=None) if key.grid_step is not None else key)

    def size(self, chosen: Sequence[allocate.Option]) -> int:
        """The message's size with these options for all groups."""
        return self.splitter.cost(chosen)
