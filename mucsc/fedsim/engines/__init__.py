"""The simulator's engines: what runs a sweep's runs, behind one small protocol (:class:`Engine`).

``builtin`` (module ``builtin``): this process and worker processes (``--workers``); ``flower``
(module ``flower``): each run a ``flwr run`` of the Flower app in ``flower_app`` on Flower's simulation
runtime (Ray), every update a real Flower Message.  Both
train and evaluate with :mod:`mucsc.fedsim.training` and produce the same
:class:`~mucsc.fedsim.simulation.RunResult`; ``mucsc sim`` picks one with ``--engine``.
Imports: the simulator's modules below it (simulation, parallel, training), and mucsc.flower.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

ENGINES = ("builtin", "flower")


class Engine(Protocol):
    """Runs the runs of a sweep; every result depends only on its run's settings and seed."""

    name: str
    workers: int       # processes of ours that train clients
    reason: str        # why that many (one line for the run header and summary.json)
    concurrent: int    # runs in flight at once

    def sweep_runs(self, specs: Sequence[Any], *, on_start: Callable[[int, str], None] | None = None,
                   on_round: Callable[[int, Any], None] | None = None,
                   on_done: Callable[[int, Any], None] | None = None) -> list[Any]:
        """Run ``specs`` (:class:`~mucsc.fedsim.simulation.RunSpec`), calling back with each run's
        index; a failing run raises :class:`~mucsc.fedsim.simulation.RunFailed`."""

    def close(self) -> None:
        """Release workers (idempotent)."""


def start(name: str, cfg: Any, setups: Sequence[Any], runs: int, device: str) -> Engine:
    """The engine ``name`` for a sweep of ``runs`` runs on ``setups``."""
    if name == "flower":
        from mucsc.fedsim.engines.flower import FlowerEngine

        return FlowerEngine(device)
    from mucsc.fedsim.engines.builtin import BuiltinEngine

    return BuiltinEngine(cfg, setups, runs)
