"""fp16: every element rounded to IEEE half precision (round to nearest even), 2 bytes each.

Values beyond the float16 range saturate at +-65504 (instead of becoming infinite).  Deterministic
rounding: biased (slightly), so error feedback applies by default in mucsc.codec.api.state.
"""

from __future__ import annotations

from mucsc.codec.codecs.base import register
from mucsc.codec.codecs._cast import CastCodec

F16_MAX = 65504.0


@register
class FP16(CastCodec):
    name = "fp16"
    summary = "fp16: raw IEEE float16 (saturating at +-65504)"
    wire = "<f2"
    limit = F16_MAX  # saturates instead of overflowing to infinity
