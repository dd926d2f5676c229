"""A goal: what a message must meet instead of a fixed encoding (docs/codecs.md "Rate control").

A user asks for one through the goal parameters of a codec that supports them (mucsc, bmucsc:
``bits=``, ``size=``, ``max_error=``); the planner takes it out of the codec and resolves it to fixed
codecs, which carry no goal."""

from __future__ import annotations

import dataclasses
import math

from mucsc.codec.codecs.base import Codec
from mucsc.codec.codecs.clusters import TARGETS

GOALS = tuple(t for t in TARGETS if t != "z")  # the parameters that set a goal instead of a fixed Z


@dataclasses.dataclass(frozen=True)
class Goal:
    """What a message must meet: ``bits`` per element or ``size`` bytes of the whole message (a
    budget), or ``max_error``, a bound on each group's relative error sqrt(J) / ||x||."""

    kind: str
    value: float

    @classmethod
    def of(cls, codec: Codec) -> "Goal | None":
        """The goal set in ``codec``'s parameters (None: a fixed encoding)."""
        kind = getattr(codec.params, "target", "z")
        return None if kind not in GOALS else cls(kind, getattr(codec.params, kind))

    def budget(self, elements: int) -> int:
        """The byte budget of a message of ``elements`` elements."""
        return int(self.value) if self.kind == "size" else math.floor(self.value * elements / 8)

    def __str__(self) -> str:
        return f"size={int(self.value)}" if self.kind == "size" else f"{self.kind}={self.value:g}"
