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
from mucsc.codec.numerics import allocate
from mucsc.codec import meter
from mucsc.codec.ratecontrol.search import bisect, group_bytes, squared_norm

LADDER = tuple(2.0 ** (7 - j / 2) for j in range(72))  # steps relative to the spread: 128 .. 2^-28.5
REFINE_STEPS = 14  # bisections of log(step) between the two ladder points around a goal


class DitherSearch:
    """One group's dithered options under a goal (the planner's search interface): each a step,
    measured with the estimated index bytes and the exact J = n step^2 / 12."""

    def __init__(self, trials: DitherTrials, rng: Callable[[], np.random.Generator], zstd_level: int | None):
        self.trials, self.rng, self.level = trials, rng, zstd_level
        self.x = x = trials.x
        self.n = x.size
        self.norm2 = squared_norm(x)
        lo, hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
        self.constant = lo == hi
        mean = float(np.mean(x, dtype=np.float64)) if x.size else 0.0
        self.spread = math.sqrt(max(self.norm2 / max(self.n, 1) - mean * mean, 0.0)) or (hi - lo) or 1.0
        self.floor = min_step(x, 0.0)
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
        for r in LADDER:
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
        return bisect(good.key.step, bad.key.step, REFINE_STEPS, lambda g, b: math.sqrt(g * b), self.measure,
                      ok, better, best, setting=lambda o: o.key.step)

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
