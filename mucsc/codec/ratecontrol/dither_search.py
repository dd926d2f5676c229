"""The goals' search for ``mucsc`` with ``rounding="dithered"`` (bits= / size= / max_error=): the
grid step is the only knob.  A ladder of steps relative to the data's spread, then bisections of
log(step) around the goal; every option measured by a trial encoding (the codec's measuring protocol,
:class:`~mucsc.codec.codecs._dithered.DitherTrials`): estimated index bytes as the container stores
them, and the exact J = n step^2 / 12.  The planner (:mod:`mucsc.codec.ratecontrol.planner`) chooses."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from mucsc.codec.codecs._dithered import DitherTrials, Grid, fixed_grid, min_step
from mucsc.codec.codecs.base import EncodedGroup
from mucsc.codec.numerics import allocate
from mucsc.codec.numerics.centroids import FULL_SORT_MAX
from mucsc.codec import meter
from mucsc.codec.ratecontrol.search import bisect, group_bytes, squared_norm

LADDER = tuple(2.0 ** (7 - j / 2) for j in range(72))  # steps relative to the spread: 128 .. 2^-28.5
REFINE_STEPS = 14  # bisections of log(step) between the two ladder points around a goal
# Groups of at least this many elements are searched on their summary (:class:`DitherSummarySearch`);
# smaller ones by trial encodes, which are cheap there and see the tables' exact bytes.
MIN_ELEMENTS = 1 << 15
# An estimated J (subsampled summary) is taken this much larger, so that the exact J of an error
# goal's choice rarely misses the bound (as summary_search.SAMPLED_J_MARGIN)
SAMPLED_J_MARGIN = 3e-3
SUMMARY_PRECISION = 5e-5  # their bisections stop at steps this close: ~7e-5 bits per element
# ... except a budget's first bisection, before any exact check: it only places the exact encode that
# calibrates the estimates, which err by ~1 % of the bytes before it (a hundred times what the fine
# precision resolves), and the bisection after the calibration is the fine one
FIRST_PRECISION = 2e-3  # (1e-2 measured: two more exact encodes at bits=2, 3 on a FEMNIST update)
# After a calibration (:meth:`DitherSummarySearch.calibrate`) aim 8 + n / SLACK_ELEMENTS bytes below
# a budget: about 0.07 % of J at any rate (J ~ 2^(-2 bits)), and more than the estimates still err by
SLACK_ELEMENTS = 1 << 14


class DitherSearch:
    """One group's dithered options under a goal (the planner's search interface): each a step,
    measured with the estimated index bytes and the exact J = n step^2 / 12."""

    precision = 0.0  # bisections stop at steps this close (relative); 0: after REFINE_STEPS
    ladder = LADDER

    def __init__(self, trials: DitherTrials, rng: Callable[[], np.random.Generator], zstd_level: int | None):
        self.trials, self.rng, self.level = trials, rng, zstd_level
        self.x = x = trials.x
        self.n = x.size
        self.norm2 = squared_norm(x)
        lo, hi = trials.bounds() or (0.0, 0.0)
        self.constant = lo == hi
        mean = float(np.mean(x, dtype=np.float64)) if x.size else 0.0
        self.spread = math.sqrt(max(self.norm2 / max(self.n, 1) - mean * mean, 0.0)) or (hi - lo) or 1.0
        self.floor = min_step(x, 0.0, (lo, hi))
        self.options: list[allocate.Option] = []

    def measure(self, step: float, estimate: bool = True) -> allocate.Option:
        """Encode on a grid of this ``step`` (not below the escape-free floor); record the option
        when its size is estimated (the search's)."""
        meter.tick()
        grid = fixed_grid(self.x, 2) if self.constant else Grid(max(step, self.floor), 0.0)
        params, sections, J = self.trials.encode(grid, self.rng(), estimate)
        key = dataclasses.replace(grid, params=tuple(sorted(params.items())))
        o = allocate.Option(group_bytes(sections, self.level), J(), key)
        if estimate:
            self.options.append(o)
        return o

    def sweep(self, stop: Callable[[allocate.Option], bool], goal: str = "budget") -> None:
        """The ladder of steps from the coarsest (fewest bytes) until ``stop``; for an error goal
        also the step that meets it exactly (J = n step^2 / 12 is known in advance)."""
        if self.constant or self.n == 0:
            self.measure(1.0)
            return
        for r in self.ladder:
            if stop(self.measure(r * self.spread)):
                break

    def refine(self, best: allocate.Option, ok: Callable[[allocate.Option], bool],
               better: Callable[[allocate.Option, allocate.Option], bool]) -> allocate.Option:
        """Bisect log(step) between the two neighbouring measured steps where ``ok`` changes."""
        pts = sorted(self.options, key=lambda o: -o.key.step)
        pair = next(((a, b) for a, b in zip(pts, pts[1:]) if ok(a) != ok(b)), None)
        if pair is None:
            return best
        good, bad = (pair[0], pair[1]) if ok(pair[0]) else (pair[1], pair[0])
        def midpoint(g: float, b: float) -> float | None:
            return math.sqrt(g * b) if max(g, b) > min(g, b) * (1.0 + self.precision) else None

        return bisect(good.key.step, bad.key.step, REFINE_STEPS, midpoint, self.measure, ok, better, best,
                      setting=lambda o: o.key.step)

    def refine_z(self, best: allocate.Option, ok, better) -> allocate.Option:
        """Nothing more to search (the step is the only knob)."""
        return best

    def exact(self, o: allocate.Option) -> allocate.Option:
        """``o`` with its exact size (the search used estimated index bytes)."""
        return dataclasses.replace(o, bytes=self.measure(o.key.step, estimate=False).bytes)

    def unreachable(self, max_error: float) -> str:
        return f"max_error={max_error:g} is out of reach for rounding='dithered' on this input"

    def floor_note(self, o: allocate.Option) -> str:
        return ""


def summarised(trials: object) -> bool:
    """True when the dithered group ``trials`` is searched on its summary (:class:`DitherSummarySearch`)."""
    return isinstance(trials, DitherTrials) and trials.x.size >= MIN_ELEMENTS


class DitherSummarySearch(DitherSearch):
    """The same search with every option measured on the group's sorted summary (the indices'
    expected histogram per context: :meth:`DitherTrials.expected`) instead of a trial encode; the
    chosen option is then encoded once (:meth:`exact`, the encoding the message keeps) and the
    planner corrects by a step when the exact size or J misses the goal (``estimates``)."""

    estimates = True
    precision = SUMMARY_PRECISION
    ladder = LADDER[::2]  # octaves: the bisections, which stop at SUMMARY_PRECISION, do the rest

    def __init__(self, trials: DitherTrials, rng: Callable[[], np.random.Generator], zstd_level: int | None):
        super().__init__(trials, rng, zstd_level)
        self.encoded: dict[Grid, EncodedGroup] = {}  # the exact checks' encodings (what the message keeps)
        self.margin = 1.0 + (SAMPLED_J_MARGIN if self.n > FULL_SORT_MAX else 0.0)
        self.modelled: dict[Grid, int] = {}  # the summary's size estimate of each option it measured
        self.scale = 1.0  # exact / estimated size at the last exact check (:meth:`calibrate`)

    def sweep(self, stop: Callable[[allocate.Option], bool], goal: str = "budget") -> None:
        self.precision = FIRST_PRECISION if goal == "budget" else SUMMARY_PRECISION
        super().sweep(stop, goal)

    def measure(self, step: float, estimate: bool = True) -> allocate.Option:
        """The option of a grid of this ``step`` from the summary, recorded (a trial encode where
        the summary's model does not apply: a constant group, a grid finer than it handles)."""
        grid = Grid(max(step, self.floor), 0.0)
        got = None if self.constant or not estimate else self.trials.expected(grid)
        if got is None:
            return super().measure(step, estimate)
        meter.tick()
        params, sections, J = got
        key = dataclasses.replace(grid, params=tuple(sorted(params.items())))
        self.modelled[key] = raw = group_bytes(sections, self.level)
        o = allocate.Option(round(raw * self.scale), J * self.margin, key)
        self.options.append(o)
        return o

    def exact(self, o: allocate.Option) -> allocate.Option:
        """``o`` encoded (kept for the message): its exact bytes, J and header params."""
        if o.key not in self.encoded:  # the resolved codec's encoding (grid=(step, offset)), the stream kept
            params, sections, J = self.trials.encode(Grid(o.key.step, o.key.offset), self.rng(), estimate=False)
            self.encoded[o.key] = EncodedGroup(params, sections, {"J": J})
        enc = self.encoded[o.key]
        return dataclasses.replace(o, bytes=group_bytes(enc.sections, self.level), J=float(enc.stats["J"]()),
                                   key=dataclasses.replace(o.key, params=tuple(sorted(enc.params.items()))))

    def calibrate(self, o: allocate.Option, exact: allocate.Option) -> int:
        """Scale every estimated size by what the exact check of ``o`` measured (the summary's
        estimates err by up to ~1.5 %, either way: tables at 2^15 elements, a subsample's bulk;
        the ratio varies little between neighbouring steps) -> the bytes a calibrated choice
        should stay below the budget by: what the calibrated estimates still err by (measured on
        FEMNIST updates of 1.33 M elements: up to ~100 bytes at 0.5-4 bits) and 8-byte padding."""
        self.precision = SUMMARY_PRECISION  # the estimates are calibrated now: bisect finely
        if o.key in self.modelled:
            self.scale = exact.bytes / self.modelled[o.key]
            self.options = [dataclasses.replace(p, bytes=round(self.modelled[p.key] * self.scale))
                            if p.key in self.modelled else p for p in self.options]
        return 8 + self.n // SLACK_ELEMENTS

    def closer(self, missed: allocate.Option, J_goal: float) -> allocate.Option:
        """After an exact J above ``J_goal``: the grid whose step is scaled by the miss (J ~ step^2)."""
        return self.measure(missed.key.step * math.sqrt(J_goal / missed.J) * (1.0 - SAMPLED_J_MARGIN))
