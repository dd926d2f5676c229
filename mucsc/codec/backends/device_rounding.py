"""Eq. 7's rounding on a torch device, done lazily: fused with the IDS_ packing by the Triton kernel
where it runs (:mod:`mucsc.codec.backends.triton_round`), else the torch backend's rounding then packing.

It sits above both so that neither imports the other."""

from __future__ import annotations

import numpy as np

from mucsc.codec.backends.tensors import torch_module

from mucsc.codec.backends import torch_packing

from mucsc.codec.backends import torch_rounding

from mucsc.codec.backends import torch_transfer, triton_round


class Rounding:
    """Eq. 7's rounding of ``x`` to wire centroids ``c`` with stream ``key``, done when first needed:
    :meth:`packed` goes straight to IDS_ bytes with the fused Triton kernel where it runs
    (:mod:`mucsc.codec.backends.triton_round`: the IDs are never written), anything else reads :meth:`ids`
    (:func:`~mucsc.codec.backends.torch_rounding.stochastic_round`, computed once).  Both give the same bytes."""

    def __init__(self, x, c: np.ndarray, key: int):
        self.x, self.c, self.key = x, c, key
        self._ids = None

    def __len__(self) -> int:
        return self.x.numel()

    def ids(self):
        """The cluster ids as a tensor on x's device (:func:`~mucsc.codec.backends.torch_rounding.stochastic_round`)."""
        if self._ids is None:
            self._ids = torch_rounding.round_ids(self.x, self.c, self.key)  # int64, as the rounding made them
        return self._ids

    def sample(self, step: int):
        """``ids()[::step]`` (for an estimate of the ids' entropy), rounding only those elements
        while the ids are not computed."""
        if self._ids is not None:
            return self._ids[::step]
        idx = torch_module().arange(0, len(self), step, dtype=torch_module().int64, device=self.x.device)
        return torch_rounding.round_at(self.x, self.c, self.key, idx)

    def fused(self, width: int):
        """The ids packed ``width`` bits wide by the fused Triton round + pack kernel (a uint8 tensor),
        while the ids are not computed and where the kernel runs; else None."""
        return None if self._ids is not None else triton_round.round_pack(self.x, self.c, self.key, width)

    def packed(self, width: int) -> torch_transfer.DeviceBytes:
        """The ids packed ``width`` bits wide (FORMAT.md 4.2), left on x's device as
        :func:`~mucsc.codec.backends.torch_packing.pack` leaves them."""
        if self._ids is None:
            fused = triton_round.round_pack(self.x, self.c, self.key, width)
            if fused is not None:
                return torch_transfer.DeviceBytes(fused)
        return torch_packing.pack(self.ids(), width)
