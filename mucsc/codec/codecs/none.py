"""none: no compression, the paper's NC baseline: every element as IEEE float32, 4 bytes each.

Exact for float32 (and float16/bfloat16) input; a float64 group is stored as float32, as NC's
h = 4 bytes per parameter does (for bit-exact float64 use the lossless ``raw`` codec).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from mucsc.codec.base import Codec, EncodedGroup, Section, array_from, register, section
from mucsc.errors import FormatError


@register
class NoCompression(Codec):
    name = "none"
    summary = "none: uncompressed float32 (the paper's NC)"
    # Exact for float32/float16/bfloat16 input, so error feedback has nothing to carry (float64 is
    # rounded to nearest float32, as NC's h = 4 bytes does).
    unbiased = True

    @dataclasses.dataclass(frozen=True)
    class Params:
        pass

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        v = x.astype("<f4")
        return EncodedGroup({}, (Section("VALS", v.tobytes()),),
                            {"J": lambda: float(np.sum((v.astype(np.float64) - x) ** 2))})

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        v = array_from(section(sections, "VALS", 4 * n), "<f4")
        if not np.all(np.isfinite(v)):
            raise FormatError("none: values must be finite")
        return v.astype(dtype)
