"""The goals' search for ``mucsc`` with rANS-coded IDs allowed, without trial encodes: every option
is measured on the vector's sorted summary (:class:`~mucsc.codec.numerics.summary.Summary`): J
exactly from the levels (eq. 8-9 for stochastic rounding, the midpoint cells' squared error for
nearest rounding, by prefix sums), the IDs' size from their expected counts (the order-0 code length
the rANS coder reaches, :func:`~mucsc.codec.wire.rans.expected_size`; under an error bound the same
levels with packed IDs too) and the framing of the sections as the container stores them.  The
chosen option is then encoded once (:meth:`SummarySearch.exact`, the encoding the message keeps); the
planner corrects by one step when the exact size or J misses the goal.

The options: uniform grids k * step (a level at 0; under stochastic rounding the ends bracketing the
data) for any step -- near-optimal with entropy-coded IDs (Gish-Pierce), and continuous in the step,
so a goal is met closely -- and, for data with few distinct values, those values themselves (J = 0).
An error bound is aimed at (:meth:`SummarySearch.aim`): a few grids, not a sweep and a bisection."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from mucsc.codec.codecs.base import EncodedGroup
from mucsc.codec.codecs.clusters import CENTROID_DTYPES, MAX_Z, MIN_Z, ClusterTrials, id_width, rounding_of
from mucsc.codec.numerics import allocate, centroids, nearest, quantize
from mucsc.codec.numerics.summary import Summary
from mucsc.codec.ratecontrol.goal import Goal
from mucsc.codec.ratecontrol.search import Choice, ClusterSearch, bisect, group_bytes
from mucsc.codec.wire import bitpack, container, rans

LADDER_PER_OCTAVE = 4  # steps tried per halving of the step (about 1/4 bit per element apart)
SPARSE, SPARSE_SHARE = 16.0, 16  # a grid is thinned when over 1/16 of its levels expect < 16 elements
COARSEST = 10  # a budget's grids go up to 2^10 times the data's span (~1e-3 bits per element)
REFINE_PRECISION = 2e-4  # bisect log(step) around a goal until the steps differ by this (~3e-4 bits)
REFINE_MAX_STEPS = 64  # a bound only: from any two steps 2e-4 is reached in far fewer
# An error bound's search interpolates (J ~ step^a) instead of bisecting: it stops once J is within
# this share of the bound's J, or after SECANT_STEPS grids
AIM_TOLERANCE, SECANT_STEPS = 1e-2, 4
BRACKET_MARGIN = 1e-2  # an error bound's first grids aim this share of the step past the bound
# An estimated J (subsampled summary) is taken this much larger: ~2 standard errors of the sample
# mean at 2^17 samples, so that the exact J of an error goal's choice rarely misses the bound.
SAMPLED_J_MARGIN = 3e-3
# An error bound on a small group (its summary is the data, under MIN_ELEMENTS elements) whose grid
# choice spends at least OPTIMAL_TABLE_SHARE of its bytes on the levels: J-optimal levels searched
# too, about the fewest whose J meets the bound (2-4 level counts, ~1-2 ms each at z ~ 200, ~5 ms
# at z ~ 2,000).  The grids alone sent 2-6% more bytes than the trial search's J-optimal levels
# (Gaussian 500-8,000 elements at 1%; Student-t(3) up to 14%; 8,000-30,000 at 0.1%: 4-12%); where
# the levels are a smaller share (a 25,000-element tensor at 1%: ~4%) the gain is < 1%.
OPTIMAL_TABLE_SHARE, OPTIMAL_TRIES = 0.08, 4
OPTIMAL_FIRST = 0.8  # the first count tried, of the grid's (J-optimal levels needed 70-92% as many)
OPTIMAL_CLEAR = 0.05  # estimates this much smaller need no exact comparison (rANS and zstd'd packed IDs differ less)
OPTIMAL_SLACK = 1 / 50  # done once the count that meets is this close to the fewest predicted (~1% of the bytes)


# Smaller groups under a budget keep the trial-encoding search (:class:`ClusterSearch`): there the
# levels' own bytes weigh, and J-optimal levels with packed IDs (not in this search's families) often
# win.  Under an error bound every group is searched here (a small group is its own exact summary),
# J-optimal levels among its options (OPTIMAL_TABLE_SHARE): the trial search cost 0.2-2 s per small
# tensor (its ecsq DPs) for about the same bytes (benchmarks/bench_small_goals.py: -7% to +1%).
MIN_ELEMENTS = 1 << 15


def applies(trials: Any, goal: Goal | None = None) -> bool:
    """True when ``trials`` is a clustering this search measures: rANS-coded IDs allowed (id_coding
    "auto" or "rans"), and stochastic rounding with at least ``MIN_ELEMENTS`` elements or an error
    bound (``goal``), or nearest rounding under an error bound with at least ``MIN_ELEMENTS`` (below,
    Lloyd-Max levels, which the trial search has, often win)."""
    if not isinstance(trials, ClusterTrials) or trials.p.id_coding not in ("auto", "rans"):
        return False
    error, large = goal is not None and goal.kind == "max_error", trials.x.size >= MIN_ELEMENTS
    rounding = rounding_of(trials.p)
    return (large or error) if rounding == "stochastic" else (rounding == "nearest" and error and large)


def search(trials: ClusterTrials, rng: Callable[[], np.random.Generator], zstd_level: int | None,
           encode: Callable[[Choice], EncodedGroup]) -> "SummarySearch":
    """The summary search for ``trials`` (where :func:`applies`): by its rounding."""
    cls = NearestSummarySearch if rounding_of(trials.p) == "nearest" else SummarySearch
    return cls(trials, rng, zstd_level, encode)


class SummarySearch(ClusterSearch):
    """One group's options under a goal, measured on its sorted summary (the planner's search
    interface; ``estimates``: an option's bytes and J are estimates until :meth:`exact`).  Empty and
    constant groups are measured by :class:`ClusterSearch`'s trial encodings (one option)."""

    estimates = True
    CELL_J = 1 / 6  # a fine grid's J per element / step^2: eq. 8 with x spread evenly over a cell
    ROUNDING_PARAMS: dict[str, str] = {}  # what the header adds for this rounding

    def __init__(self, trials: ClusterTrials, rng: Callable[[], np.random.Generator], zstd_level: int | None,
                 encode: Callable[[Choice], EncodedGroup]):
        super().__init__(trials, rng, zstd_level)
        self.encode = encode  # the resolved codec's encoding of a choice (what the message keeps)
        self.encoded: dict[Choice, EncodedGroup] = {}
        self.dtype = np.dtype(CENTROID_DTYPES[self.p.centroid_dtype])
        self._summary: Summary | None = None
        self.J_goal: float | None = None  # an error bound's J (:meth:`aim`)
        self._twins: dict[Choice, allocate.Option] = {}  # a packed-ID option -> its rANS-coded twin
        self.packed_twins = False  # measure packed IDs beside rANS-coded ones without an error bound too
        # A budget's summaries (:func:`mucsc.codec.ratecontrol.budget.summarize`) keep each option's
        # levels as their wire array (``wires``) instead of in its key: a tuple of Python floats per
        # option cost more than measuring it (~0.6 ms for a grid of a few thousand levels)
        self.wires: dict[Choice, np.ndarray] | None = None
        # A budget's ladder (:meth:`sweep`) steps by octaves while a grid takes fewer bits per element
        # than this (budget.summarize: the message's mean rate less its headroom)
        self.fine_from_bits = 0.0

    @property
    def summary(self) -> Summary:
        if self._summary is None:
            self._summary = Summary(self.x, self.lo, self.hi, self.trials._cache)
        return self._summary

    def grid(self, step: float) -> allocate.Option:
        """The uniform grid k * ``step`` over the data, measured; recorded.  Below a quarter of the
        data's largest magnitude the ends are the data's min and max (the levels move continuously
        with the step, so J and the size do too); from there up (a few levels, low rates) the grid
        points around the data: ends beyond it send most elements to the levels near 0."""
        k = np.arange(math.floor(self.lo / step), math.ceil(self.hi / step) + 1) * step
        if step < max(-self.lo, self.hi) / 4:
            k = np.concatenate(([self.lo], k[(k > self.lo) & (k < self.hi)], [self.hi]))
        J, counts = self.summary.stats(k)
        if np.count_nonzero(counts < SPARSE) * SPARSE_SHARE > k.size:  # sparse tails: thin them
            # the grids' own trade-off: J ~ step^2 and bytes ~ -d/8 log2(step), so a byte is
            # worth 16 ln2 J / d of J at this step
            k = self.summary.thin(k, counts, 16 * math.log(2) * J / self.x.size, self.dtype.itemsize + 1)
        return self.levels(k, step)

    def levels(self, levels: np.ndarray, step: float | None, by: str | None = None) -> allocate.Option:
        """The option of these levels (as the wire carries them: rounded to the centroid dtype,
        still bracketing the data), rANS-coded IDs; recorded.  ``by``: who chose them, when neither
        a grid (``step``) nor the distinct values did ("optimal")."""
        wire, J, counts = self._measured(levels)
        k = int(wire.size)
        if not self.summary.exact:
            J *= 1.0 + SAMPLED_J_MARGIN
        idsa = rans.expected_size(counts, self.x.size)
        cent = k * self.dtype.itemsize
        size = sum(container.SECTION.size + s + container.padding(s) for s in (cent, idsa))
        by = by or ("uniform" if step is not None else "ecsq")
        params = {"centroids": k, "centroid_dtype": self.p.centroid_dtype, "id_coding": "rans", "solver": by,
                  "z": max(MIN_Z, k), **self.ROUNDING_PARAMS}
        key = Choice(max(MIN_Z, k), None if self.wires is not None else tuple(map(float, wire)), "rans", None,
                     tuple(sorted(params.items())), None if step is None else k - 1, step,
                     None if by in ("uniform", "ecsq") else by)
        if self.wires is not None:
            self.wires[key] = wire
        o = allocate.Option(size, J, key)
        self.options.append(o)
        if (self.J_goal is None and not self.packed_twins) or k < 2:
            return o
        # An error bound (or a budget's small group): the same levels with packed IDs too (a 1.0
        # message), often smaller for a small group, where rANS's frequency table costs as much as
        # the ID bits it saves.
        width = id_width(k)
        ids = bitpack.packed_size(self.x.size, width)
        packed = dataclasses.replace(key, coding="packed", params=tuple(sorted(
            {**{k_: v for k_, v in params.items() if k_ != "id_coding"}, "id_bits": width}.items())))
        p = allocate.Option(sum(container.SECTION.size + s + container.padding(s) for s in (cent, ids)), J, packed)
        if self.wires is not None:
            self.wires[packed] = wire
        self.options.append(p)
        self._twins[packed] = o
        return p if p.bytes < o.bytes else o

    def _measured(self, levels: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
        """(the levels as the wire carries them, J, expected count per level): rounded to the
        centroid dtype, still bracketing the data (eq. 7 needs a level on each side)."""
        wire = levels.astype(self.dtype)
        if not (wire[0] <= self.lo and wire[-1] >= self.hi and np.all(wire[1:] > wire[:-1])):
            wire = quantize.wire_centroids(levels, None, self.dtype, bounds=(self.lo, self.hi))  # merged or moved
        return (wire, *self.summary.stats(wire.astype(np.float64)))

    def sweep(self, stop: Callable[[allocate.Option], bool], goal: str = "budget") -> None:
        """Grids from one step over the data's span down by 2^(1/4) (a budget: the curve a split
        across groups chooses from) or by octaves (an error bound: :meth:`refine` bisects) until
        ``stop`` (or the format's limit on levels), and the distinct values when there are few."""
        if self.x.size == 0 or self.lo == self.hi:
            super().sweep(stop, goal)
            return
        few = self.summary.distinct(min(MAX_Z, self.x.size // 2))
        if few is not None:
            self.levels(few, None)
        span = self.hi - self.lo
        limit = min(MAX_Z, 4 * self.x.size + 2) - 2  # beyond one level per element nothing is gained
        if goal == "budget":  # the fewest bits: grids beyond the data, until one fits
            for j in range(1, COARSEST + 1):
                if not stop(self.grid(span * 2.0 ** j)):
                    break
        if goal == "error" and self.J_goal is not None and self.J_goal > 0:
            self._bracket(stop, span, limit)
            return
        per = LADDER_PER_OCTAVE if goal == "budget" else 1  # an error bound: octaves, then refine
        j = 0
        while j < 64 * per:
            step = span * 2.0 ** (-j / per)
            if span / step > limit:
                break
            o = self.grid(step)
            if stop(o) or o.J == 0.0:
                break
            # the same steps, every per-th below ``fine_from_bits`` (a split gives no large group so few)
            j += per if 8 * o.bytes < self.fine_from_bits * self.x.size else 1

    def _bracket(self, stop: Callable[[allocate.Option], bool], span: float, limit: int) -> None:
        """An error bound (:meth:`aim`): the grid whose step fine grids predict to meet it, J ~
        CELL_J d step^2 (the elements spread evenly over each cell), then steps scaled by
        (J_goal / J)^(1/a) (a from the last two grids) a little past the bound (a margin doubling
        from 1% of the step) until ``stop`` changes: the pair :meth:`refine` interpolates between
        (usually 2-3 grids)."""
        fine, step = span / limit, min(span, max(span / limit, math.sqrt(self.J_goal / (self.CELL_J * self.x.size))))
        o = self.grid(step)
        first, a, prev = stop(o), 2.0, None
        for tries in range(64):
            if prev is not None and 0 < prev[1] != o.J > 0:  # J ~ step^a through the last two grids
                a = min(4.0, max(0.5, math.log(o.J / prev[1]) / math.log(step / prev[0])))
            prev = (step, o.J)
            scale = (self.J_goal / o.J) ** (1.0 / a) if o.J > 0 else 4.0
            scale *= (1.0 + BRACKET_MARGIN * 2 ** tries) if first else (1.0 - min(0.5, BRACKET_MARGIN * 2 ** tries))
            nxt = min(span, max(fine, step * min(4.0, max(0.25, scale))))
            if nxt == step or o.J == 0.0:
                break
            step = nxt
            o = self.grid(step)
            if stop(o) != first:
                break
        if not any(stop(p) for p in self.options):  # thinning keeps a tiny group's grids coarse:
            every = self.summary.distinct(MAX_Z)  # its values themselves (J = 0), where it is its summary
            if every is not None:
                near = self._optimal_beyond_grids(every.size)
                if near is None or not stop(near):
                    self.levels(every, None)

    def _optimal_beyond_grids(self, distinct: int) -> allocate.Option | None:
        """Where no grid meets an error bound (grids no finer than the span / MAX_Z: a heavy tail's
        bulk gets too few levels), J-optimal levels at the count the closest grid predicts (J ~
        1/z^2; the optimal levels' J is lower than the grid's) before the distinct values (J = 0):
        Student-t(3), 15,000 elements at 0.1%: ~28 KB instead of 86 KB.  None when that is no
        fewer levels than the distinct values."""
        grids = (o for o in self.options if o.key.grid_step is not None and o.J > 0)
        near = min(grids, key=lambda o: o.J, default=None)
        if near is None:
            return None
        z = math.ceil(dict(near.key.params)["centroids"] * math.sqrt(near.J / self.J_goal))
        if z >= min(distinct, MAX_Z):
            return None
        return self.levels(centroids.levels_on_sorted(self.summary.S, z) + self.summary.shift, None, "optimal")

    def trials_search(self) -> ClusterSearch:
        """The trial-encoding search of the same group: where no grid meets an error bound (a small
        group at a tight bound: thinning keeps its grids from going finer than the budget's slope),
        its Z ladder reaches further (up to one level per distinct value)."""
        return ClusterSearch(self.trials, self.rng, self.level)

    def aim(self, J_goal: float) -> None:
        """The J of the error bound the search is for: the search aims at it (:meth:`_bracket`,
        :meth:`_secant`): ~5 grids instead of ~20 (each ~1 ms at d ~ 1e4)."""
        self.J_goal = J_goal

    def refine(self, best: allocate.Option, ok: Callable[[allocate.Option], bool],
               better: Callable[[allocate.Option, allocate.Option], bool]) -> allocate.Option:
        """Bisect log(step) between the two neighbouring grids measured where ``ok`` changes (an
        error bound: interpolated, :meth:`_secant`)."""
        pts = sorted((o for o in self.options if o.key.grid_step is not None), key=lambda o: -o.key.grid_step)
        pair = next(((a, b) for a, b in zip(pts, pts[1:]) if ok(a) != ok(b)), None)
        if pair is None:
            return best
        good, bad = (pair[0], pair[1]) if ok(pair[0]) else (pair[1], pair[0])

        def midpoint(g: float, b: float) -> float | None:
            return math.sqrt(g * b) if max(g, b) > min(g, b) * (1.0 + REFINE_PRECISION) else None

        if self.J_goal is not None:
            midpoint = self._secant(midpoint, self.J_goal)
        return bisect(good.key.grid_step, bad.key.grid_step, REFINE_MAX_STEPS, midpoint, self.grid, ok, better,
                      best, setting=lambda o: o.key.grid_step)

    def _secant(self, halve: Callable[[float, float], float | None], J_goal: float
                ) -> Callable[[float, float], float | None]:
        """An error bound's midpoints: the step where J ~ step^a through the two ends of the bracket
        meets the bound less half ``AIM_TOLERANCE``; done once the good end is within it (a step
        ~0.5% short: ~0.007 bits per element) or after ``SECANT_STEPS`` (J moves in small jumps
        where thinning drops a level).  ~3 grids where ``halve`` took ~12."""
        calls = [0]

        def mid(g: float, b: float) -> float | None:
            calls[0] += 1
            J_at = {o.key.grid_step: o.J for o in self.options if o.key.grid_step is not None}
            Jg, Jb = J_at.get(g), J_at.get(b)
            close = Jg is not None and Jg >= J_goal * (1 - AIM_TOLERANCE)
            if halve(g, b) is None or calls[0] > SECANT_STEPS or close:
                return None
            if not (Jg and Jb and Jb > Jg):
                return halve(g, b)
            a = math.log(Jb / Jg) / math.log(b / g)
            s = g * (J_goal * (1 - AIM_TOLERANCE / 2) / Jg) ** (1.0 / a)
            lo, hi = min(g, b), max(g, b)
            return min(max(s, lo * (1.0 + REFINE_PRECISION)), hi / (1.0 + REFINE_PRECISION))
        return mid

    def refine_z(self, best: allocate.Option, ok, better) -> allocate.Option:
        """The step is continuous: nothing more to search on the grids.  An error bound on a small
        group: J-optimal levels too (:meth:`_fewest_optimal`)."""
        k = dict(best.key.params).get("centroids", 0) if best.key is not None else 0
        if (self.J_goal is None or not self.J_goal > 0 or self.x.size >= MIN_ELEMENTS or not self.summary.exact
                or self.ROUNDING_PARAMS or k <= 2 or k * self.dtype.itemsize < OPTIMAL_TABLE_SHARE * best.bytes):
            return best
        return self._fewest_optimal(best, k, ok, better)

    def _fewest_optimal(self, best: allocate.Option, k: int, ok: Callable[[allocate.Option], bool],
                        better: Callable[[allocate.Option, allocate.Option], bool]) -> allocate.Option:
        """The cheaper of ``best`` (a grid's, ``k`` levels) and J-optimal levels
        (:func:`~mucsc.codec.numerics.centroids.levels_on_sorted`) at about the fewest level count
        that meets the bound, compared by their exact encodings (a small group's packed IDs may be
        zstd'd: the estimates do not see it).  Each next count is where J ~ z^-a through the last
        two (a = 2 from the first) meets the bound; done once the count that meets is within
        OPTIMAL_SLACK of the one predicted (or of one that fails), or after OPTIMAL_TRIES DPs."""
        S, shift, J_goal, cache = self.summary.S, self.summary.shift, self.J_goal, {}
        fails, meets, found, prev = 2, None, None, None  # z = 2 (the ends) fails: the grid needed k > 2
        most = min(MAX_Z, self.x.size // 2)  # beyond, the distinct values (or the grid) do as well
        if most <= 3:
            return best
        z = min(most - 1, max(3, math.ceil(OPTIMAL_FIRST * k)))
        for _ in range(OPTIMAL_TRIES):
            o = self.levels(centroids.levels_on_sorted(S, z, cache) + shift, None, "optimal")
            if ok(o):
                meets = z
                if found is None or better(o, found):
                    found = o
            else:
                fails = z
            top = most if meets is None else meets
            a = 2.0
            if prev is not None and prev[0] != z and prev[1] > 0 and o.J > 0 and prev[1] != o.J:
                a = min(4.0, max(1.0, math.log(prev[1] / o.J) / math.log(z / prev[0])))
            prev = (z, o.J)
            guess = math.ceil(z * (o.J / J_goal) ** (1.0 / a)) if o.J > 0 else fails + 1
            slack = max(1, int(OPTIMAL_SLACK * top))
            if top - fails <= 1 or (meets is not None and top - max(fails, guess) < slack):
                break
            z = guess if fails < guess < top else (fails + top) // 2
        if found is None:
            return best
        exact_found = self.exact(self._packed_twin(found))
        if found.bytes < best.bytes * (1.0 - OPTIMAL_CLEAR) and ok(exact_found):
            return exact_found  # clearly smaller: no need to encode the grid's choice to compare
        exact_best = self.exact(best)
        return exact_found if better(exact_found, exact_best) and ok(exact_found) else exact_best

    def _packed_twin(self, o: allocate.Option) -> allocate.Option:
        """The packed-ID twin of rANS-coded option ``o`` (whose :meth:`exact` encodes both), else ``o``."""
        return next((p for p in reversed(self.options) if p.key in self._twins and self._twins[p.key].key == o.key), o)

    def exact(self, o: allocate.Option) -> allocate.Option:
        """``o`` encoded (the encoding kept for the message): its exact bytes and J.  Packed IDs
        (estimated unpacked; the container may zstd them) are encoded with rANS-coded IDs too, and
        the smaller kept: the estimates of the two are close for small groups."""
        if o.key.grid_step is None and o.key.levels is None:  # a degenerate group's trial option
            return super().exact(o)
        if o.key in self._twins:
            return min(self._exact(o), self._exact(self._twins[o.key]), key=lambda e: (e.bytes, e.key.coding))
        return self._exact(o)

    def _exact(self, o: allocate.Option) -> allocate.Option:
        if o.key not in self.encoded:
            self.encoded[o.key] = self.encode(o.key)
        enc = self.encoded[o.key]
        J = enc.stats["J"]
        return dataclasses.replace(o, bytes=group_bytes(enc.sections, self.level), J=float(J() if callable(J) else J))

    def closer(self, missed: allocate.Option, J_goal: float) -> allocate.Option:
        """After an exact J above ``J_goal``: the grid whose step is scaled by the miss (J ~ step^2)."""
        step = missed.key.grid_step
        if step is None:
            raise RuntimeError("only a grid's J is estimated")  # distinct values have J = 0 exactly
        return self.grid(step * math.sqrt(J_goal / missed.J) * (1.0 - SAMPLED_J_MARGIN))


class NearestSummarySearch(SummarySearch):
    """An error bound under nearest rounding (``rounding="nearest"``, a stored model's default in
    ``mucsc compress``): the same grids k * ``step`` (a level at 0), each element to its nearest
    level, J and counts by :meth:`~mucsc.codec.numerics.summary.Summary.nearest_stats`.  Levels
    need not bracket the data; those no element reaches are dropped (each costs its centroid and a
    table entry: on a tensor with outlier columns at 8.5 bits per element over 90% of a grid's levels
    are empty, in its sparse tails).  Where the summary is the data its empty cells are; where it is a
    subsample, those beyond its sampled bulk (the tails are kept exactly): a bulk cell without a
    sampled element may hold elements, which would go to the next level unestimated (on
    all-MiniLM-L6-v2 at 4.5 and 8.5 bits the errors came out the same either way)."""

    CELL_J = 1 / 12  # x spread evenly over a cell, to its nearest level
    ROUNDING_PARAMS = {"rounding": "nearest"}

    def grid(self, step: float) -> allocate.Option:
        """The grid k * ``step`` from below the data's min to above its max, measured; recorded."""
        return self.levels(np.arange(math.floor(self.lo / step), math.ceil(self.hi / step) + 1) * step, step)

    def _measured(self, levels: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
        wire = nearest.wire_levels(levels, self.dtype)
        J, counts = self.summary.nearest_stats(wire.astype(np.float64))
        if wire.size > 1 and not counts.all():  # no element was nearest to them: the rest keep theirs
            empty = counts == 0
            if not self.summary.exact and self.summary.bulk is not None:  # only cells beyond the bulk
                mids = 0.5 * (wire[:-1].astype(np.float64) + wire[1:])  # are surely empty in the data
                lo, hi = self.summary.bulk
                empty &= (np.append(mids, np.inf) < lo) | (np.insert(mids, 0, -np.inf) > hi)
            wire, counts = wire[~empty], counts[~empty]
        return wire, J, counts
