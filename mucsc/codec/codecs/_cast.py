"""What ``none`` and ``fp16`` share: every element stored in one float wire dtype (section VALS)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from mucsc.codec.base import Codec, EncodedGroup, Section, array_from, section
from mucsc.errors import FormatError


class CastCodec(Codec):
    """Subclasses set ``name`` and ``wire`` (a little-endian float dtype) and may override ``cast``."""

    wire: ClassVar[str]

    @dataclasses.dataclass(frozen=True)
    class Params:
        pass

    def cast(self, x: np.ndarray) -> np.ndarray:
        return x.astype(self.wire, copy=False)  # no copy when x is already in the wire dtype

    def section_sizes(self, n: int, *, positions_bytes: int | None = None, centroids: int | None = None,
                      estimate: bool = False) -> dict[str, int]:
        return {"VALS": np.dtype(self.wire).itemsize * n}

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        v = self.cast(x)
        return EncodedGroup({}, (Section("VALS", v),),  # the array itself: the container copies once
                            {"J": lambda: float(np.sum((v.astype(np.float64) - x) ** 2))})

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        v = array_from(section(sections, "VALS", np.dtype(cls.wire).itemsize * n), cls.wire)
        if not np.all(np.isfinite(v)):
            raise FormatError(f"{cls.name}: values must be finite")
        return v.astype(dtype)
