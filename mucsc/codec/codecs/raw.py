"""``raw``: lossless storage of a tensor's little-endian bytes (any record dtype).  The API uses it for
non-float tensors; it is also a lossless reference codec for floats."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from mucsc.codec.codecs.base import Codec, EncodedGroup, Section, register, section_array


@register
class Raw(Codec):
    name = "raw"
    lossless = True
    unbiased = True
    draws = False
    summary = "lossless: the tensor's bytes, zstd-compressed when smaller"

    @dataclasses.dataclass(frozen=True)
    class Params:
        pass

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        data = np.ascontiguousarray(x).astype(x.dtype.newbyteorder("<"), copy=False)
        return EncodedGroup({}, (Section("DATA", data.view(np.uint8), compressible=True),), {"J": 0.0})

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        return section_array(sections, "DATA", n * dtype.itemsize).view(dtype)
