"""none: no compression, the paper's NC baseline: every element as IEEE float32, 4 bytes each.

Exact for float32 (and float16/bfloat16) input; a float64 group is stored as float32, as NC's
h = 4 bytes per parameter does (for bit-exact float64 use the lossless ``raw`` codec).
"""

from __future__ import annotations

from mucsc.codec.codecs.base import F32_MAX, register
from mucsc.codec.codecs._cast import CastCodec


@register
class NoCompression(CastCodec):
    name = "none"
    summary = "none: uncompressed float32 (the paper's NC)"
    wire = "<f4"
    input_limit = F32_MAX  # VALS is float32
    # Exact for float32/float16/bfloat16 input, so error feedback has nothing to carry (float64 is
    # rounded to nearest float32, as NC's h = 4 bytes does).
    unbiased = True
