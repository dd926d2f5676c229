"""The step "where the values live": a codec's vector in its backend's form, its values or raw bytes
on the host, a section payload, and host values moved to the decoder's device.

``Host`` (numpy arrays) and ``Torch`` (torch tensors on any device) hold the same names;
:func:`mucsc.codec.backends.dispatch.backend_for` picks one per array.  The torch form's staged,
pinned copies are :mod:`mucsc.codec.backends.torch_transfer`'s; torch is imported only when it runs."""

from __future__ import annotations

from typing import Any

import numpy as np

from mucsc.codec.backends import device_rounding
from mucsc.codec.backends.tensors import is_torch_tensor, torch_module
from mucsc.codec.backends import torch_transfer


class Host:
    """numpy arrays: every step a no-op or a plain numpy operation."""

    @staticmethod
    def vector(x: Any) -> np.ndarray:
        """``x`` as this backend encodes it (a host array as it is)."""
        return x

    @staticmethod
    def size(x: Any) -> int:
        return int(x.size)

    @staticmethod
    def host_array(x: Any) -> np.ndarray:
        """``x``'s values as a numpy array (no copy)."""
        return x

    @staticmethod
    def payload(v: np.ndarray) -> np.ndarray:
        """A section payload of the values ``v`` (the array itself: the container copies once)."""
        return v

    @staticmethod
    def host_bytes(v: np.ndarray) -> bytes:
        """``v``'s raw (little-endian) bytes, on the host now."""
        return v.tobytes()

    @staticmethod
    def from_host(a: np.ndarray, device: Any = None) -> np.ndarray:
        """Decoded host values where this backend returns them (the host: as they are)."""
        return a

    @staticmethod
    def wire_values(raw: memoryview, wire: str, n: int, device: Any = None) -> np.ndarray:
        """``n`` values of the little-endian dtype ``wire`` from a section's bytes."""
        return np.frombuffer(raw, wire, n)

    @staticmethod
    def like(a: Any, ref: np.ndarray) -> np.ndarray:
        """``a`` (an array or a tensor) as ``ref``'s kind of array and dtype: here a numpy array."""
        return np.asarray(a.cpu().numpy() if is_torch_tensor(a) else a).astype(ref.dtype, copy=False)

    @staticmethod
    def copy(a: np.ndarray) -> np.ndarray:
        return a.copy()

    @staticmethod
    def host_copy(a: np.ndarray) -> np.ndarray:
        """A numpy copy of ``a`` (state_dicts hold numpy arrays only)."""
        return a.copy()


class Torch:
    """torch tensors (CPU tensors under ``MUCSC_BACKEND=torch``): the values stay on their device; only
    the wire bytes cross, in the counted copies."""

    @staticmethod
    def vector(x: Any):
        return torch_transfer.as_tensor(x)

    @staticmethod
    def size(x: Any) -> int:
        return x.numel() if is_torch_tensor(x) else int(x.size)

    @staticmethod
    def host_array(x: Any) -> np.ndarray:
        if isinstance(x, device_rounding.Rounding):
            x = x.ids()
        return x.cpu().numpy() if is_torch_tensor(x) else x

    @staticmethod
    def payload(v: Any) -> torch_transfer.DeviceBytes:
        return torch_transfer.DeviceBytes(v)

    @staticmethod
    def host_bytes(v: Any) -> np.ndarray:
        return torch_transfer.bytes_to_host(v)

    @staticmethod
    def from_host(a: np.ndarray, device: Any = None):
        return torch_module().from_numpy(a).to(device)

    @staticmethod
    def wire_values(raw: memoryview, wire: str, n: int, device: Any = None):
        torch = torch_module()
        if n == 0:
            return torch.zeros(0, dtype=getattr(torch, np.dtype(wire).name), device=device)
        return torch_transfer.to_device(raw, device).view(getattr(torch, np.dtype(wire).name))

    @staticmethod
    def like(a: Any, ref: Any):
        return torch_module().as_tensor(a, device=ref.device).to(ref.dtype)

    @staticmethod
    def copy(a: Any):
        return a.clone()

    @staticmethod
    def host_copy(a: Any) -> np.ndarray:
        return a.detach().cpu().numpy().copy()
