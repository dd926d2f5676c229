"""DGC (Lin et al., ICLR 2018), the stateless part: top-k (default 1%) float32 values + positions.

``positions="paper"`` is the DGC paper's wire, an int32 index per value; the default is the smallest
compact code.  Momentum correction, factor masking, local gradient clipping and the sparsity
warm-up are stateful and live in :class:`mucsc.codec.state.DGCCompressor`.  Layout: spec/codecs.md.
"""

from __future__ import annotations

import dataclasses

from mucsc.codec.base import register
from mucsc.codec.codecs.topk import TopK, check_keep, check_positions


@register
class DGC(TopK):
    name = "dgc"
    summary = "DGC: top-k float32 values + positions (int32 with positions='paper'; Lin et al. 2018)"
    paper_positions = "int32"

    @dataclasses.dataclass(frozen=True)
    class Params:
        keep: float = 0.01
        positions: str = "auto"

        def __post_init__(self) -> None:
            check_keep("dgc", self.keep)
            check_positions("dgc", self.positions)
