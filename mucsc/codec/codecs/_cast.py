"""What ``none`` and ``fp16`` share: every element stored in one float wire dtype (section VALS)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import numpy as np

from mucsc.codec.backends import torch_backend
from mucsc.codec.codecs.base import PART, Codec, EncodedGroup, Section, array_from, section
from mucsc.errors import FormatError


class CastCodec(Codec):
    """Subclasses set ``name`` and ``wire`` (a little-endian float dtype) and may override ``cast``."""

    wire: ClassVar[str]
    accepts_torch = True  # a cast is elementwise: done on the tensor's device, only the wire bytes cross

    @dataclasses.dataclass(frozen=True)
    class Params:
        pass

    def cast(self, x: np.ndarray) -> np.ndarray:
        return x.astype(self.wire, copy=False)  # no copy when x is already in the wire dtype

    def cast_torch(self, x):
        """:meth:`cast` of a torch tensor, on its device, with the same values."""
        torch = torch_backend._torch()
        return x.to(getattr(torch, np.dtype(self.wire).name))

    def section_sizes(self, n: int, *, positions_bytes: int | None = None, centroids: int | None = None,
                      estimate: bool = False) -> dict[str, int]:
        return {"VALS": np.dtype(self.wire).itemsize * n}

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        if torch_backend.applies(x):
            return self._encode_torch(torch_backend.as_tensor(x))
        v = self.cast(x)
        return EncodedGroup({}, (Section("VALS", v),),  # the array itself: the container copies once
                            {"J": lambda: float(np.sum((v.astype(np.float64) - x) ** 2))})

    def _encode_torch(self, x) -> EncodedGroup:
        """The cast on x's device; only the wire bytes are copied to the host, by the writer straight
        into the message."""
        torch = torch_backend._torch()
        v = self.cast_torch(x)
        return EncodedGroup({}, (Section("VALS", torch_backend.DeviceBytes(v)),),
                            {"J": lambda: float(((v.to(torch.float64) - x.to(torch.float64)) ** 2).sum())})

    @classmethod
    def decode_torch(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype, device) -> Any:
        """:meth:`decode_array` on ``device``: the wire values are copied over and widened there."""
        torch = torch_backend._torch()
        size = np.dtype(cls.wire).itemsize
        raw = section(sections, "VALS", size * n)
        wire = getattr(torch, np.dtype(cls.wire).name)
        if n == 0:
            return torch.zeros(0, dtype=getattr(torch, np.dtype(dtype).name), device=device)
        v = torch_backend.to_device(raw, device).view(wire)
        if not bool(torch.isfinite(v).all()):
            raise FormatError(f"{cls.name}: values must be finite")
        return v.to(getattr(torch, np.dtype(dtype).name))

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        return cls._wire_values(n, sections).astype(dtype)

    @classmethod
    def decode_parts(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> Iterator[np.ndarray]:
        v = cls._wire_values(n, sections)  # a view of the section: only the pieces are new
        for a in range(0, n, PART):
            yield v[a: a + PART].astype(dtype)

    @classmethod
    def _wire_values(cls, n: int, sections: Mapping[str, memoryview]) -> np.ndarray:
        v = array_from(section(sections, "VALS", np.dtype(cls.wire).itemsize * n), cls.wire)
        if not np.all(np.isfinite(v)):
            raise FormatError(f"{cls.name}: values must be finite")
        return v
