"""Error-feedback state of a sender, separate from the stateless codecs (GRACE's Compressor/Memory split).

A :class:`Memory` sits around a codec for one sender and one direction, per tensor name:
``compensate`` turns this round's input into what is encoded (e.g. input + residual), ``update``
learns from what the receiver decodes (e.g. residual = encoded - decoded).  A codec names the memory
it needs (:meth:`mucsc.Codec.memory`); :class:`mucsc.Compressor` drives it.  ``state_dict`` /
``load_state_dict`` persist it across rounds or processes (numpy arrays and plain numbers only).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mucsc.codec.backends.dispatch import backend_of
from mucsc.errors import InputError, ParameterError


class Memory:
    """No state: what is sent is the input.  Subclasses override the hooks they need."""

    def compensate(self, name: str, x: np.ndarray) -> np.ndarray:
        """The vector to encode for float tensor ``name`` given this round's input ``x``."""
        return x

    def update(self, name: str, compensated: np.ndarray, received: np.ndarray) -> None:
        """Learn from one round: ``compensated`` was encoded, the receiver decoded ``received``."""

    def codec_for(self, codec: Any, step: int) -> Any:  # a mucsc.Codec (base imports this module)
        """The codec to use at round (or epoch) ``step``; a schedule (DGC's warm-up) changes it."""
        return codec

    @property
    def residual(self) -> dict[str, np.ndarray]:
        """What the sender still owes the receiver, per tensor (empty for a stateless memory)."""
        return {}

    @property
    def stateful(self) -> bool:
        """Whether this memory keeps anything between rounds (a stateless one needs no decode)."""
        return type(self).update is not Memory.update

    def state_dict(self) -> dict[str, Any]:
        """The state as plain data: {field: {tensor name: numpy array}}."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (arrays are copied)."""
        if state:
            raise ParameterError(f"{type(self).__name__} has no state, got keys {sorted(state)}")

    def reset(self) -> None:
        """Forget the state (e.g. when the model is re-initialised)."""



class ArrayStateMemory(Memory):
    """A memory whose state is a few tables {tensor name: array}, one per entry of ``FIELDS``."""

    FIELDS: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.tables: dict[str, dict[str, np.ndarray]] = {f: {} for f in self.FIELDS}

    def state_dict(self) -> dict[str, Any]:
        return {f: {k: host(v) for k, v in t.items()} for f, t in self.tables.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        what = type(self).__name__
        if not isinstance(state, Mapping) or set(state) != set(self.FIELDS):
            got = sorted(state) if isinstance(state, Mapping) else type(state).__name__
            raise ParameterError(f"{what} state needs the keys {list(self.FIELDS)}, got {got}")
        loaded = {}
        for f in self.FIELDS:
            table = state[f]
            if not isinstance(table, Mapping):
                raise ParameterError(f"{what} state {f!r} must map tensor names to arrays")
            arrays = {str(k): np.array(v) for k, v in table.items()}
            if any(a.dtype.kind != "f" for a in arrays.values()):
                raise ParameterError(f"{what} state {f!r} must hold float arrays")
            loaded[f] = arrays
        self.tables = loaded

    def reset(self) -> None:
        for t in self.tables.values():
            t.clear()


def like(a: Any, ref: Any) -> Any:
    """``a`` as ``ref``'s kind of array and dtype: a numpy array, or a torch tensor on ``ref``'s device
    (state loaded from a state_dict is numpy; a sender encoding on a GPU keeps it there)."""
    return backend_of(ref).like(a, ref)


def copy(a: Any) -> Any:
    """A copy of a numpy array or a torch tensor."""
    return backend_of(a).copy(a)


def host(a: Any) -> np.ndarray:
    """``a`` as a numpy array (state_dicts hold numpy arrays only)."""
    return backend_of(a).host_copy(a)


def check_shape(name: str, old: np.ndarray | None, new: np.ndarray) -> None:
    """InputError when a tensor's shape differs from the state kept for it."""
    if old is not None and tuple(old.shape) != tuple(new.shape):
        raise InputError(f"tensor {name!r} changed shape between rounds: {tuple(old.shape)} -> "
                         f"{tuple(new.shape)}")


class ResidualMemory(ArrayStateMemory):
    """Error feedback by residual accumulation (EF-SGD, EF-SignSGD, STC's A += dW; A -= T(A)): the
    vector encoded is input + residual; the new residual is that minus what the receiver decodes."""

    FIELDS = ("residual",)

    @property
    def residual(self) -> dict[str, np.ndarray]:
        return self.tables["residual"]

    def compensate(self, name: str, x: np.ndarray) -> np.ndarray:
        r = self.residual.get(name)
        if r is None:
            return x
        check_shape(name, r, x)
        return like(x + like(r, x), x)

    def update(self, name: str, compensated: np.ndarray, received: np.ndarray) -> None:
        self.residual[name] = compensated - like(received, compensated)
