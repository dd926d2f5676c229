"""The stateful compressor the integrations (Flower, DDP) drive, with ``state_dict`` /
``load_state_dict`` to persist it between rounds or processes.

``mucsc.Compressor`` (issue 8: a codec plus its error-feedback memory, DGC's momentum included) when
this mucsc has it; otherwise the same interface over :class:`mucsc.codec.state.Compressor` (residual
error feedback; DGC's momentum options are then refused).  Remove this module once every supported
mucsc has ``mucsc.Compressor``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import mucsc


def new_compressor(codec: str, *, error_feedback: bool | None = None, shared: bool = True,
                   compress: str | int = "auto", **params: Any) -> Any:
    """A compressor with ``compress(update, seed, epoch=)``, ``error_feedback``, ``residual``,
    ``state_dict()`` and ``load_state_dict()``; raises ParameterError/UnknownCodecError now."""
    if hasattr(mucsc, "Compressor"):
        return mucsc.Compressor(codec, error_feedback=error_feedback, shared=shared, compress=compress, **params)
    return _ResidualCompressor(codec, error_feedback, shared, compress, params)


class _ResidualCompressor:
    """:class:`mucsc.codec.state.Compressor` with a state dict ``{"rounds", "memory": {"residual"}}``."""

    def __init__(self, codec: str, error_feedback: bool | None, shared: bool, compress: str | int,
                 params: Mapping[str, Any]) -> None:
        from mucsc.codec.state import Compressor

        self._c = Compressor(codec, error_feedback=error_feedback, shared=shared, compress=compress, **params)
        self.error_feedback = self._c.error_feedback

    @property
    def residual(self) -> dict[str, np.ndarray]:
        return self._c.residual if self.error_feedback else {}

    def compress(self, update: Any, seed: int | None = None, *, epoch: int | None = None) -> bytes:
        return self._c.compress(update, seed)

    def state_dict(self) -> dict[str, Any]:
        memory = {"residual": {k: v.copy() for k, v in self._c.residual.items()}} if self.error_feedback else {}
        return {"rounds": self._c.rounds, "memory": memory}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        rounds = state.get("rounds") if isinstance(state, Mapping) else None
        if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 0:
            raise mucsc.ParameterError(f"compressor state needs a non-negative 'rounds', got {rounds!r}")
        memory = state.get("memory", {})
        if set(memory) - {"residual"} or (memory and not self.error_feedback):
            raise mucsc.ParameterError(f"unexpected compressor state {sorted(memory)}")
        self._c.rounds = int(rounds)
        self._c.residual.clear()
        self._c.residual.update({k: np.array(v, copy=True) for k, v in memory.get("residual", {}).items()})
