"""The goals' search over one group's encodings (docs/codecs.md "Rate control"): the Z ladder with
packed or rANS-coded IDs, a grid of Lagrange multipliers for entropy-constrained levels (ecsq), uniform
levels, then bisections around the goal.  Every option is measured by a trial encoding (the codec's
measuring protocol, :class:`~mucsc.codec.codecs.clusters.ClusterTrials`): bytes as the container
stores them, exact J.  The planner (:mod:`mucsc.codec.ratecontrol.planner`) chooses among them."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from mucsc.codec.codecs.base import Section
from mucsc.codec.codecs.clusters import CENTROID_DTYPES, MAX_Z, MIN_Z, ClusterTrials, Rounded, rounding_of
from mucsc.codec.numerics import allocate, ecsq, nearest
from mucsc.codec.wire import container
from mucsc.codec import meter

# Numbers of centroids tried by the rate-controlled modes (bits=, size=, max_error=): every Z up to 8,
# then about 4 steps per doubling (J falls roughly like 1/Z^2, the ID entropy grows like log2 Z).
Z_LADDER = tuple(sorted({*range(2, 9), *(m << e for e in range(1, 14) for m in (4, 5, 6, 7) if m << e <= MAX_Z),
                         MAX_Z}))
# Lagrange multipliers tried by the goals, as mu = lambda * d / ||x||^2 (J per bit, relative to the
# mean square): from ~0.05 bits per element (mu = 1e4) to ~8 bits (mu = 1e-5).
MU_GRID = tuple(float(v) for v in 10.0 ** np.linspace(4, -5, 28))
REFINE_STEPS = 6  # bisection steps on mu between the two grid points around a single group's goal
# The grid sweep solves over this many interior candidates (the DP is cubic in them); the
# bisection around the goal over ecsq.INTERIOR_CANDIDATES.
SWEEP_CANDIDATES = 96


# at most 2^15.5 steps: with the two ends, fewer levels than the format's limit of 65536 centroids
UNIFORM_STEPS = tuple(int(v) for v in np.unique(np.round(2.0 ** np.arange(2, 15.51, 0.5))))


def uniform_levels(lo: float, hi: float, steps: int) -> np.ndarray:
    """Levels k * delta, delta = (hi - lo) / steps, for the k that bracket [lo, hi] (0 is a level)."""
    delta = (hi - lo) / steps
    k = np.arange(math.floor(lo / delta), math.ceil(hi / delta) + 1)
    return k * delta


@dataclasses.dataclass(frozen=True)
class Choice:
    """How one group is encoded under a goal: J-optimal levels for ``z``, or the entropy-constrained
    ``levels`` (ecsq); the IDs ``coding``; the header params it produces (an option key)."""

    z: int
    levels: tuple[float, ...] | None
    coding: str
    mu: float | None
    params: tuple
    steps: int | None = None  # uniform levels: this many steps of the data's span, a level at 0
    grid_step: float | None = None  # uniform levels k * grid_step (summary_search's grids; informative)
    by: str | None = None  # who chose given levels when neither ecsq nor uniform steps did ("optimal")

    @property
    def levels_by(self) -> str:
        """Who chose the levels, as the header's solver records it."""
        return self.by or ("ecsq" if self.steps is None else "uniform")

    def settings(self) -> dict[str, Any]:
        """The codec parameters that fix this choice (what the planner resolves a goal to)."""
        return {"z": self.z, "levels": self.levels, "levels_by": self.levels_by,
                "id_coding": "rans" if self.coding == "rans" else "packed"}


NORM_CHUNK = 1 << 20  # squared_norm sums larger vectors in chunks of this many elements (8 MiB of float64)


def squared_norm(x: np.ndarray) -> float:
    """|x|^2 in float64: the float64 copy squared in place and summed (numpy's pairwise sum).  Not
    np.dot: its threaded BLAS took ~4 ms per small tensor on a loaded 2-core machine (a goal's search
    of a 10-tensor state_dict spent 40 ms there), and np.dot of float32 with float64 takes a slow
    mixed-type path (~3 ms at d = 1e5)."""
    if not x.size:
        return 0.0
    if x.size > NORM_CHUNK:  # a large group a chunk at a time: no float64 copy of the whole of it
        return math.fsum(squared_norm(x[a:a + NORM_CHUNK]) for a in range(0, x.size, NORM_CHUNK))
    xd = x.astype(np.float64)
    return float(np.square(xd, out=xd).sum())


class ClusterSearch:
    """One group's options under a goal, measured by trial encodings of its clustering
    (:class:`~mucsc.codec.codecs.clusters.ClusterTrials`): bytes as the container stores them, exact J."""

    def __init__(self, trials: ClusterTrials, rng: Callable[[], np.random.Generator], zstd_level: int | None):
        self.trials, self.rng, self.level = trials, rng, zstd_level
        self.x = x = trials.x
        self.p = trials.p
        self.norm2 = squared_norm(x)
        self._prepared: dict[int, ecsq.Prepared] = {}
        self.lo, self.hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
        self.options: list[allocate.Option] = []
        self._stash: dict[tuple[int, str], allocate.Option] = {}  # (Z, ID coding) -> measured, not yet asked
        self._sample: nearest.SortedSample | None = None  # an error goal's predictor (nearest rounding)

    def measure(self, choice_z: int | None = None, mu: float | None = None, coding: str = "packed",
                fine: bool = False, steps: int | None = None) -> allocate.Option:
        """Encode with Z-ladder levels (``choice_z``), ecsq levels for ``mu`` (over the coarse
        candidate set, or the fine one) or ``steps`` uniform steps; record the option."""
        meter.tick()
        z = choice_z or MIN_Z
        levels = None if steps is None else uniform_levels(self.lo, self.hi, steps)
        if mu is not None:
            m = ecsq.INTERIOR_CANDIDATES if fine else SWEEP_CANDIDATES
            if m not in self._prepared:
                self._prepared[m] = ecsq.prepare(self.x, m)
            lam = mu * self.norm2 / max(self.x.size, 1)
            levels = ecsq.solve(self._prepared[m], lam,
                                8.0 * np.dtype(CENTROID_DTYPES[self.p.centroid_dtype]).itemsize + 16.0)[0]
        ladder = levels is None  # J-optimal levels for a Z: measured with both ID codings (sweep)
        if ladder and (z, coding) in self._stash:
            o = self._stash.pop((z, coding))
            self.options.append(o)
            return o
        by = "ecsq" if steps is None else "uniform"
        r = self.trials.round(z, levels, self.rng())
        o = self._option(z, r, levels, coding, mu, steps, by)
        if ladder and coding == "packed" and self.p.id_coding == "auto":
            # The sweep's rANS pass measures this Z again, from a fresh copy of the same generator:
            # the same levels and rounding, so the same option -- coded from these IDs now instead
            # of solving and rounding again (and recorded when the sweep asks for it).
            self._stash[(z, "rans")] = self._option(z, dataclasses.replace(r, J=o.J), levels, "rans", mu, steps, by)
        self.options.append(o)
        return o

    def _option(self, z: int, r: Rounded, levels, coding: str, mu, steps, by: str) -> allocate.Option:
        params, sections, J = self.trials.message(r, z, levels, coding, by)
        key = Choice(params["z"], None if levels is None else tuple(map(float, levels)), coding, mu,
                     tuple(sorted(params.items())), steps)
        return allocate.Option(group_bytes(sections, self.level), float(J()), key)

    def exact(self, o: allocate.Option) -> allocate.Option:
        """``o`` with its exact size (rANS-coded IDs are searched with an estimate)."""
        if o.key.coding != "rans":
            return o
        levels = None if o.key.levels is None else np.array(o.key.levels)
        _, sections, _ = self.trials.encode(o.key.z, levels, "rans", o.key.levels_by, self.rng())
        return dataclasses.replace(o, bytes=group_bytes(sections, self.level))

    def unreachable(self, max_error: float) -> str:
        """The error message when no option meets ``max_error``."""
        best = min(self.options, key=lambda o: o.J)
        return (f"max_error={max_error:g} is out of reach: the best relative error is "
                f"{allocate.relative_error(best.J, self.norm2):.3g} (Z = {best.key.z})")

    def floor_note(self, o: allocate.Option) -> str:
        """What the smallest message is made of, beyond the framing (nothing to add for mucsc)."""
        return ""

    def sweep(self, stop: Callable[[allocate.Option], bool], goal: str = "budget") -> None:
        """The Z ladder (packed IDs, unless id_coding="rans") and the mu grid (rANS-coded IDs, unless
        id_coding="packed"), each from the fewest bits up until ``stop``."""
        p = self.p
        if self.x.size == 0 or self.x.min() == self.x.max():
            self.measure(MIN_Z)
            return
        # An error goal under nearest rounding: the sorted sample predicts each ladder point's error,
        # so each ladder starts just below the predicted crossing instead of at the fewest bits.
        self._sample = sample = (nearest.SortedSample(self.x) if goal == "error" and rounding_of(p) == "nearest"
                                 else None)
        # J-optimal levels: packed IDs (a 1.0 message) and, unless restricted, rANS-coded IDs (at
        # high rates entropy-coded J-optimal levels are close to the ecsq ones and cheaper to find)
        for coding in {"auto": ("packed", "rans"), "packed": ("packed",), "rans": ("rans",)}[p.id_coding]:
            _ladder(Z_LADDER, lambda z, coding=coding: self.measure(z, coding=coding), stop,
                    lambda o, z: dict(o.key.params)["centroids"] < z or o.J == 0.0,
                    sample and (lambda z: sample.J(sample.levels(z))))
        if p.id_coding != "packed":
            for mu in MU_GRID if rounding_of(p) == "stochastic" else ():  # ecsq levels are for eq. 7's J
                o = self.measure(mu=mu, coding="rans")
                if stop(o) or o.J == 0.0:
                    break
            # uniform levels (a level at 0) with rANS-coded IDs: near-optimal at high rates
            # (Gish-Pierce), where the candidate sets of ecsq get too coarse for many levels
            _ladder(UNIFORM_STEPS, lambda steps: self.measure(steps=steps, coding="rans"), stop,
                    lambda o, steps: o.J == 0.0,
                    sample and (lambda steps: sample.J(uniform_levels(self.lo, self.hi, steps))))

    def refine(self, best: allocate.Option, ok: Callable[[allocate.Option], bool],
               better: Callable[[allocate.Option, allocate.Option], bool]) -> allocate.Option:
        """Bisect mu (fine candidates) between the two neighbouring grid points where ``ok`` changes
        (the goal lies between them); returns the best option (``better(a, b)``: a preferred)."""
        grid = sorted((o for o in self.options if o.key.mu in MU_GRID), key=lambda o: -o.key.mu)
        pair = next(((a, b) for a, b in zip(grid, grid[1:]) if ok(a) != ok(b)), None)
        if pair is not None:
            good, bad = (pair[0].key.mu, pair[1].key.mu) if ok(pair[0]) else (pair[1].key.mu, pair[0].key.mu)
        elif grid and ok(grid[-1]):
            # every grid point is ok (a byte budget the coarse solver cannot fill): walk on with
            # the fine solver towards more bits until a point is not ok, then bisect
            good, bad = grid[-1].key.mu, None
            for mu in MU_GRID[MU_GRID.index(good):]:
                o = self.measure(mu=mu, coding="rans", fine=True)
                if not ok(o):
                    bad = mu
                    break
                good = mu
                if better(o, best):
                    best = o
            if bad is None:
                return best
        else:
            return best
        return bisect(good, bad, REFINE_STEPS, lambda g, b: math.sqrt(g * b),
                       lambda mu: self.measure(mu=mu, coding="rans", fine=True), ok, better, best)

    def refine_z(self, best: allocate.Option, ok: Callable[[allocate.Option], bool],
                 better: Callable[[allocate.Option, allocate.Option], bool]) -> allocate.Option:
        """Bisect Z (J-optimal levels, rANS-coded IDs) and the number of uniform steps between the
        two points of their ladders where ``ok`` changes: at high rates the ladders' steps are
        coarser than a budget."""
        for knob in ("z", "steps"):
            if knob == "z":
                pts = [o for o in self.options if o.key.mu is None and o.key.steps is None and o.key.coding == "rans"]
            else:
                pts = [o for o in self.options if o.key.steps is not None]
            pts.sort(key=lambda o: getattr(o.key, knob))
            pair = next(((a, b) for a, b in zip(pts, pts[1:]) if ok(a) != ok(b)), None)
            if pair is None:
                continue
            a, b = getattr(pair[0].key, knob), getattr(pair[1].key, knob)
            good, bad = (a, b) if ok(pair[0]) else (b, a)
            measure = ((lambda m: self.measure(m, coding="rans")) if knob == "z"
                       else (lambda m: self.measure(steps=m, coding="rans")))
            midpoint = lambda g, b: None if abs(g - b) <= 1 else (g + b) // 2  # noqa: E731
            if self._sample is not None:  # probe the predicted crossing first, then bisect
                s = self._sample
                levels = s.levels if knob == "z" else (lambda m: uniform_levels(self.lo, self.hi, m))
                predicted = _crossing(bad, good, lambda m: ok(allocate.Option(0, s.J(levels(m)), None)))
                midpoint = _guided(midpoint, predicted[::-1])
            best = bisect(good, bad, 12, midpoint, measure, ok, better, best)
        return best


def _ladder(settings: Sequence, measure: Callable[[Any], allocate.Option], stop: Callable[[allocate.Option], bool],
            done: Callable[[allocate.Option, Any], bool], predict: Callable[[Any], float] | None) -> None:
    """Measure ``settings`` (fewest bits first) until ``stop`` (or ``done``: nothing more to gain).
    ``predict`` (a setting's J, known without a trial encode): start at the last setting predicted
    not to stop, walking down instead while a measured one already stops, so the measured points
    still hold the pair around the goal that an exhaustive ladder would give."""
    start = 0
    if predict is not None:  # the first setting predicted to stop (J falls along the ladder): bisected
        start = _crossing(-1, len(settings) - 1, lambda i: stop(allocate.Option(0, predict(settings[i]), None)))[0]
        start = max(0, start)
    o = measure(settings[start])
    if stop(o):
        for s in reversed(settings[:start]):
            if not stop(measure(s)):
                break
        return
    i = start
    while not done(o, settings[i]) and i + 1 < len(settings):
        i += 1
        o = measure(settings[i])
        if stop(o):
            break


def _crossing(bad: int, good: int, ok: Callable[[int], bool]) -> tuple[int, int]:
    """(last not ok, first ok) between integers ``bad`` (not ok) and ``good`` (ok), either order,
    by bisection of ``ok`` (a prediction: monotone enough)."""
    while abs(good - bad) > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return bad, good


def _guided(midpoint: Callable, guesses: Sequence[int]) -> Callable:
    """``midpoint`` of a bisection, except that it first tries ``guesses`` that fall strictly inside."""
    queue = list(guesses)

    def mid(good, bad):
        while queue:
            s = queue.pop(0)
            if min(good, bad) < s < max(good, bad):
                return s
        return midpoint(good, bad)
    return mid


def bisect(good, bad, steps: int, midpoint: Callable, measure: Callable[[Any], allocate.Option],
           ok: Callable[[allocate.Option], bool],
           better: Callable[[allocate.Option, allocate.Option], bool],
           best: allocate.Option, setting: Callable[[allocate.Option], Any] | None = None) -> allocate.Option:
    """Up to ``steps`` bisections between a setting that meets the goal (``good``) and one that does
    not (``bad``); ``midpoint`` returns None when the two are adjacent.  ``setting``: the setting an
    option was measured at, where ``measure`` may move the one asked for (a grid step as sent), so
    the next midpoint starts from it.  Returns the best option seen."""
    for _ in range(steps):
        mid = midpoint(good, bad)
        if mid is None:
            break
        o = measure(mid)
        at = mid if setting is None else setting(o)
        if ok(o):
            good = at
            if better(o, best):
                best = o
        else:
            bad = at
    return best


def group_bytes(sections: Sequence[Section], zstd_level: int | None) -> int:
    """What a group's sections add to a message, stored as the container stores them."""
    return sum(container.section_bytes(s.tobytes(), s.compressible, zstd_level) for s in sections)
