"""The built-in engine: the runs of a sweep in this process, clients trained by an executor (this
process, or ``--workers`` processes: :mod:`mucsc.fedsim.parallel`), up to one run per worker at a time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mucsc.fedsim import parallel, simulation


class BuiltinEngine:
    """:class:`mucsc.fedsim.engines.Engine` over :func:`mucsc.fedsim.simulation.sweep_runs`."""

    name = "builtin"

    def __init__(self, cfg: Any, setups: Sequence[Any], runs: int) -> None:
        self.executor, choice = parallel.start_executor(cfg, setups, runs=runs)
        self.workers, self.reason = choice.workers, choice.reason
        self.concurrent = 1 if self.workers == 1 else min(self.workers, runs)

    def sweep_runs(self, specs: Sequence[Any], **callbacks: Any) -> list[Any]:
        return simulation.sweep_runs(specs, self.executor, concurrent=self.concurrent, **callbacks)

    def close(self) -> None:
        self.executor.close()
