"""DGC (Lin et al., ICLR 2018): top-k (default 1%) float32 values + positions, with momentum correction.

``positions="paper"`` is the DGC paper's wire, an int32 index per value; the default is the smallest
compact code.  The codec is the stateless part; momentum correction, momentum-factor masking, local
gradient clipping and the sparsity warm-up are its error-feedback memory (:class:`MomentumMemory`,
from :meth:`DGC.memory`), which :class:`mucsc.Compressor` drives.  Layout: spec/codecs.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from mucsc.codec.codecs.base import Codec, PaperSetup, check_memory_options, param, register
from mucsc.codec.codecs.topk import KEEP_HELP, POSITIONS_HELP, TopK, check_keep, check_positions
from mucsc.codec.codecs.memory import ArrayStateMemory, check_shape, copy, host, like
from mucsc.codec.wire import sparse
from mucsc.errors import ParameterError

DGC_WARMUP = (0.25, 0.0625, 0.015625, 0.004, 0.001)  # sparsity 75%, 93.75%, 98.4%, 99.6%, 99.9%


@register
class DGC(TopK):
    name = "dgc"
    summary = "DGC: top-k float32 values + positions (int32 with positions='paper'; Lin et al. 2018)"
    paper_positions = "int32"
    memory_options = ("momentum", "clip_norm", "warmup", "warmup_period")
    # section VI-A: DGC compresses the uplink only, keeping 1%
    paper_setup = PaperSetup(up={"keep": 0.01}, downlink=False)
    rate_variants = ({}, {"positions": "paper"})  # the library's compact positions and the paper's int32

    @dataclasses.dataclass(frozen=True)
    class Params:
        keep: float = param(0.01, KEEP_HELP + " (after the warm-up)", min=0, max=1, min_open=True)
        positions: Literal[sparse.POSITION_MODES] = param("auto", POSITIONS_HELP)

        def __post_init__(self) -> None:
            check_keep("dgc", self.keep)
            check_positions("dgc", self.positions)

    def memory(self, **options: Any) -> "MomentumMemory":
        check_memory_options(self, options)
        return MomentumMemory(keep=self.params.keep, **options)


class MomentumMemory(ArrayStateMemory):
    """DGC's client-side state (Lin et al., ICLR 2018, algorithm 1), per float tensor.

    Each round g is clipped to ``clip_norm`` (l2, if given), u = momentum u + g (momentum
    correction), v += u, and v is encoded; then u and v are zeroed where a value was sent
    (momentum-factor masking).  The warm-up sends the larger fraction ``warmup[stage]`` while
    ``stage = step // warmup_period`` is within the schedule, then ``keep``.
    """

    FIELDS = ("u", "v")

    def __init__(self, *, keep: float = 0.01, momentum: float = 0.9, clip_norm: float | None = None,
                 warmup: Sequence[float] = DGC_WARMUP, warmup_period: int = 1) -> None:
        super().__init__()
        if not 0.0 <= momentum < 1.0:
            raise ParameterError(f"momentum must be in [0, 1), got {momentum}")
        if clip_norm is not None and not clip_norm > 0:
            raise ParameterError(f"clip_norm must be positive or None, got {clip_norm}")
        if warmup_period < 1 or any(not 0.0 < w <= 1.0 for w in warmup):
            raise ParameterError("warmup fractions must be in (0, 1] and warmup_period >= 1")
        self.keep, self.momentum, self.clip_norm = keep, momentum, clip_norm
        self.warmup, self.warmup_period = tuple(warmup), int(warmup_period)

    @property
    def u(self) -> dict[str, np.ndarray]:
        return self.tables["u"]

    @property
    def v(self) -> dict[str, np.ndarray]:
        return self.tables["v"]

    @property
    def residual(self) -> dict[str, np.ndarray]:
        """The accumulated v: what has been offered but not sent yet."""
        return self.v

    def keep_at(self, stage: int) -> float:
        """The fraction sent at warm-up stage ``stage``: max(warmup[stage], keep), then ``keep``."""
        return max(self.warmup[stage], self.keep) if stage < len(self.warmup) else self.keep

    def codec_for(self, codec: Codec, step: int) -> Codec:
        keep = self.keep_at(step // self.warmup_period)
        return codec if keep == codec.params.keep else codec.replace(keep=keep)

    def compensate(self, name: str, g: np.ndarray) -> np.ndarray:
        g = copy(g)  # numpy, or a torch tensor on its device (the state then stays there)
        if self.clip_norm is not None:  # local gradient clipping
            # on the host in numpy's summation order (a copy per round from a GPU): the same bytes
            norm = float(np.linalg.norm(host(g).astype(np.float64).ravel()))
            if norm > self.clip_norm:
                g *= self.clip_norm / norm
        u = self.u.get(name)
        check_shape(name, u, g)
        u = g if u is None else self.momentum * like(u, g) + g  # momentum correction
        v = copy(u) if name not in self.v else like(self.v[name], u) + u
        self.u[name], self.v[name] = u, v
        return v

    def update(self, name: str, compensated: np.ndarray, received: np.ndarray) -> None:
        sent = received != 0  # the top-k values (a sent exact 0 leaves v = 0 there anyway)
        self.v[name][sent] = 0  # momentum-factor masking
        self.u[name][sent] = 0
