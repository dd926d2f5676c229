"""bmucsc's goals: the search of :mod:`mucsc.codec.ratecontrol.search` over the kept values, for
every keep fraction tried (positions and the rest's mean measured once per keep, from the codec's
measuring protocol :class:`~mucsc.codec.codecs.bmucsc.KeptTrials`), minimising
J = J_kept + ||rest - mean||^2 within a budget, or the smallest message within an error bound."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from mucsc.codec.codecs.bmucsc import KeptPart, KeptTrials
from mucsc.codec.numerics import allocate
from mucsc.codec.ratecontrol.search import Choice, ClusterSearch, group_bytes, squared_norm

# Keep fractions a goal tries when ``keep`` is not given: about three per decade from 0.1% to all
# (at keep = 1 nothing is replaced by a mean: J is the kept set's variance alone).
KEEP_LADDER = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)
# A budget sweep of one keep stops once the kept set's J is this small against the rest's bias:
# more bytes on the kept values could lower the total J by at most this fraction.
NEGLIGIBLE = 1e-3


@dataclasses.dataclass(frozen=True)
class KeepChoice:
    """How a goal encodes one bmucsc group: the keep fraction, the kept set's coding (a mucsc
    goal's :class:`Choice`) and the group's header params (an option key)."""

    keep: float
    sub: Choice
    params: tuple

    @property
    def z(self) -> int:
        return self.sub.z

    def settings(self) -> dict[str, Any]:
        """The codec parameters that fix this choice (what the planner resolves a goal to)."""
        return {"keep": self.keep, **self.sub.settings()}


class KeptSearch:
    """One keep fraction of a goal: the kept set's positions and the rest's mean (fixed bytes and
    bias for every coding of the kept values), and the kept values' options (a :class:`ClusterSearch`)."""

    def __init__(self, part: KeptPart, rng: Callable[[], np.random.Generator], zstd_level: int | None):
        self.keep, self.k, self.bias, self.header = part.keep, part.k, part.bias, part.header
        self.indx = group_bytes(part.sections[:1], zstd_level)
        self.fixed = self.indx + group_bytes(part.sections[1:], zstd_level)  # INDX and SCAL as stored
        self.sub = ClusterSearch(part.trials, rng, zstd_level)
        self.seen = 0  # sub.options already translated

    def joint(self, o: allocate.Option) -> allocate.Option:
        """A kept-set option as an option of the whole group."""
        params = tuple(sorted({**self.header, **dict(o.key.params)}.items()))
        return allocate.Option(self.fixed + o.bytes, self.bias + o.J, KeepChoice(self.keep, o.key, params))


class SparseSearch:
    """One bmucsc group's options under a goal (the interface the planner drives): every keep
    fraction tried, each with the kept values' options measured as the mucsc goals measure them."""

    def __init__(self, trials: KeptTrials, rng: Callable[[], np.random.Generator], zstd_level: int | None):
        self.trials, self.rng, self.level = trials, rng, zstd_level
        self.x, self.p = x, p = trials.x, trials.p
        self.norm2 = squared_norm(x)
        self.keeps = KEEP_LADDER if p.keep is None else (p.keep,)
        self.parts: dict[float, KeptSearch] = {}
        self.options: list[allocate.Option] = []
        self._sub: dict[allocate.Option, tuple[KeptSearch, allocate.Option]] = {}  # joint option -> kept-set option

    def part(self, keep: float) -> KeptSearch:
        if keep not in self.parts:
            self.parts[keep] = KeptSearch(self.trials.part(keep), self.rng, self.level)
        return self.parts[keep]

    def _sync(self, part: KeptSearch) -> None:
        """Translate the kept-set options measured since the last call."""
        for o in part.sub.options[part.seen:]:
            j = part.joint(o)
            self._sub[j] = (part, o)
            self.options.append(j)
        part.seen = len(part.sub.options)

    def _joint_of(self, part: KeptSearch, o: allocate.Option) -> allocate.Option:
        self._sync(part)
        return part.joint(o)

    def sweep(self, stop: Callable[[allocate.Option], bool], goal: str) -> None:
        """Each keep fraction from the smallest: the kept set's sweep until ``stop``.  A budget stops
        at the first keep whose positions and mean alone exceed it (larger keeps cost more); an error
        bound skips keeps whose mean replacement alone misses it and stops at the first keep whose
        positions and mean cost more than the cheapest option meeting it."""
        cheapest_ok = math.inf
        for keep in self.keeps:
            part = self.part(keep)
            floor = allocate.Option(part.fixed, part.bias, None)
            if goal == "budget":
                if stop(floor) and self.options:
                    break
                sub_stop = lambda o, part=part: stop(part.joint(o)) or o.J <= NEGLIGIBLE * part.bias  # noqa: E731
            else:
                if part.fixed >= cheapest_ok:
                    break
                if part.bias > 0 and not stop(allocate.Option(part.fixed, part.bias * (1 - 1e-12), None)):
                    continue  # the mean replacement alone misses the bound
                sub_stop = lambda o, part=part: stop(part.joint(o))  # noqa: E731
            part.sub.sweep(sub_stop, goal)
            self._sync(part)
            if goal == "error":
                cheapest_ok = min([cheapest_ok] + [o.bytes for o in self.options if stop(o)])

    def _delegate(self, method: str, best: allocate.Option, ok: Callable, better: Callable) -> allocate.Option:
        part, sub_best = self._sub[best]
        sub_ok = lambda o: ok(part.joint(o))  # noqa: E731
        sub_better = lambda a, b: better(part.joint(a), part.joint(b))  # noqa: E731
        return self._joint_of(part, getattr(part.sub, method)(sub_best, sub_ok, sub_better))

    def refine(self, best: allocate.Option, ok: Callable, better: Callable) -> allocate.Option:
        """The kept set's mu bisection at ``best``'s keep fraction."""
        return self._delegate("refine", best, ok, better)

    def refine_z(self, best: allocate.Option, ok: Callable, better: Callable) -> allocate.Option:
        """The kept set's Z / uniform-steps bisection at ``best``'s keep fraction."""
        return self._delegate("refine_z", best, ok, better)

    def exact(self, o: allocate.Option) -> allocate.Option:
        part, sub = self._sub[o]
        e = part.joint(part.sub.exact(sub))
        self._sub[e] = (part, sub)
        return e

    def unreachable(self, max_error: float) -> str:
        if self.p.keep is not None:
            part = self.part(self.p.keep)
            floor = allocate.relative_error(part.bias, self.norm2)
            if floor >= max_error:
                return (f"max_error={max_error:g} is out of reach for bmucsc with keep={self.p.keep:g}: replacing "
                        f"the other {self.x.size - part.k} elements by their mean alone gives relative error "
                        f"{floor:.3g} (raise keep, or leave it unset so that max_error chooses it)")
        if not self.options:
            part = self.part(self.keeps[-1])
            return (f"max_error={max_error:g} is out of reach for bmucsc: the mean replacement alone gives "
                    f"relative error {allocate.relative_error(part.bias, self.norm2):.3g} at keep={part.keep:g}")
        best = min(self.options, key=lambda o: o.J)
        return (f"max_error={max_error:g} is out of reach for bmucsc: the best relative error is "
                f"{allocate.relative_error(best.J, self.norm2):.3g} (keep = {best.key.keep:g}, Z = {best.key.z})")

    def floor_note(self, o: allocate.Option) -> str:
        part, sub = self._sub[o]
        return (f"; at keep={part.keep:g} (k = {part.k}): positions {part.indx} bytes, the mean 4 bytes, the "
                f"kept values' cheapest coding {sub.bytes} bytes, the rest framing")
