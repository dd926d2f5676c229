"""Deprecated: ``mucsc sim --engine flower`` lives in :mod:`mucsc.fedsim.engines.flower` (the launcher)
and :mod:`mucsc.fedsim.engines.flower_app` (the Flower app it runs); this alias goes in the next release.
The client's SGD and the server's evaluation are the simulator's own (:mod:`mucsc.fedsim.training`);
nothing here trains or evaluates."""

from __future__ import annotations

import warnings

from mucsc.fedsim.engines.flower import run, sweep_runs
from mucsc.fedsim.engines.flower_app import FedsimStrategy, FlowerRoundRecord

warnings.warn("mucsc.flower.sim moved to mucsc.fedsim.engines.flower", DeprecationWarning, stacklevel=2)

__all__ = ["FedsimStrategy", "FlowerRoundRecord", "run", "sweep_runs"]
