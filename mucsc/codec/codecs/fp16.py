"""fp16: every element rounded to IEEE half precision (round to nearest even), 2 bytes each.

Values beyond the float16 range saturate at +-65504 (instead of becoming infinite).  Deterministic
rounding: biased (slightly), so error feedback applies by default in mucsc.codec.state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from mucsc.codec.base import Codec, EncodedGroup, Section, array_from, register, section
from mucsc.errors import FormatError

F16_MAX = 65504.0


@register
class FP16(Codec):
    name = "fp16"
    summary = "fp16: raw IEEE float16 (saturating at +-65504)"

    @dataclasses.dataclass(frozen=True)
    class Params:
        pass

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        h = np.clip(x, -F16_MAX, F16_MAX).astype("<f2")
        return EncodedGroup({}, (Section("VALS", h.tobytes()),),
                            {"J": lambda: float(np.sum((h.astype(np.float64) - x) ** 2))})

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        h = array_from(section(sections, "VALS", 2 * n), "<f2")
        if not np.all(np.isfinite(h)):
            raise FormatError("fp16: values must be finite")
        return h.astype(dtype)
