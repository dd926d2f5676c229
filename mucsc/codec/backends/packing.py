"""The step "IDs and bits to bytes and back" (spec/FORMAT.md 4.2: LSB-first, ``width`` bits an element),
and the decoder's lookup of values by ID.

``Host`` packs with :mod:`mucsc.codec.parallel` / :mod:`mucsc.codec.wire.bitpack` (the compiled kernels
where built: :mod:`mucsc.codec.kernels` chose); ``Torch`` packs on the IDs' device and leaves the bytes
there (``torch_transfer.DeviceBytes``: the message writer copies them once), the fused Triton round +
pack kernel where it runs (``device_rounding.Rounding.packed``).  Both give the same bytes."""

from __future__ import annotations

from typing import Any

import numpy as np

from mucsc.codec import parallel
from mucsc.codec.backends import device_rounding
from mucsc.codec.backends.tensors import CHUNK, torch_module
from mucsc.codec.backends import torch_packing, torch_transfer
from mucsc.codec.wire import bitpack

SIGN_CHUNK = 1 << 20  # sign bits expanded per pass on the host (a multiple of 8: whole bytes)


class Host:
    @staticmethod
    def pack(ids: np.ndarray, width: int) -> Any:
        """IDS_'s payload of ``ids`` packed ``width`` bits wide (packed when the message is written)."""
        return parallel.pack(ids, width)

    @staticmethod
    def pack_bits(mask: np.ndarray) -> bytes:
        """One bit per element of the bool ``mask``, LSB-first."""
        return np.packbits(mask, bitorder="little").tobytes()

    @staticmethod
    def unpack(buf: memoryview, width: int, n: int, device: Any = None) -> np.ndarray:
        """``n`` IDs from IDS_ bytes (length and padding checked by the caller: ``bitpack.check_packed``)."""
        return bitpack.unpack(buf, width, n).astype(np.int64)

    @staticmethod
    def gather(values: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """values[ids]: the decoder's lookup."""
        return values[ids]

    @staticmethod
    def expand_signs(bits: np.ndarray, n: int, mag: float, dtype: Any, device: Any = None) -> np.ndarray:
        """``n`` values of ``dtype``: -mag where the LSB-first bit is set, else +mag (chunk by chunk:
        output-size memory only)."""
        out = np.full(n, mag, dtype)
        for a in range(0, n, SIGN_CHUNK):
            b = min(a + SIGN_CHUNK, n)
            neg = np.unpackbits(bits[a // 8: -(-b // 8)], count=b - a, bitorder="little").view(bool)
            np.negative(out[a:b], out=out[a:b], where=neg)
        return out


class Torch:
    @staticmethod
    def pack(ids: Any, width: int) -> torch_transfer.DeviceBytes:
        if isinstance(ids, device_rounding.Rounding):  # rounded and packed on the device now
            return ids.packed(width)
        return torch_packing.pack(ids, width)

    @staticmethod
    def pack_bits(mask: Any) -> torch_transfer.DeviceBytes:
        return torch_packing.pack(mask, 1)

    @staticmethod
    def unpack(buf: memoryview, width: int, n: int, device: Any = None):
        return torch_packing.unpack(buf, width, n, device)

    @staticmethod
    def gather(values: np.ndarray, ids: Any):
        return torch_packing.gather(values, ids)

    @staticmethod
    def expand_signs(bits: np.ndarray, n: int, mag: float, dtype: Any, device: Any = None):
        torch = torch_module()
        pos = torch.tensor(mag, dtype=getattr(torch, np.dtype(dtype).name), device=device)
        out = torch.empty(n, dtype=pos.dtype, device=device)
        if n == 0:
            return out
        dbits = torch_transfer.to_device(bits, device)
        step = CHUNK  # a multiple of 8: chunks of whole bytes, bounded bool temporaries
        for a in range(0, n, step):
            b = min(a + step, n)
            out[a:b] = torch.where(torch_packing.unpack_bits(dbits[a // 8: -(-b // 8)], b - a), -pos, pos)
        return out
