"""STC, sparse ternary compression (Sattler et al., IEEE TNNLS 2019), the stateless part.

Top-k (default 3%, the paper's x_STC) by magnitude, every kept element sent as mu * sign with
mu = mean |top-k| (one float32), positions Golomb-coded with the STC paper's
b* = 1 + floor(log2(ln(phi - 1) / ln(1 - p))) (``positions="golomb"``, default; a Golomb code with a
power-of-two parameter is the Rice code of mucsc.codec.wire.sparse).  The residual accumulation that
makes STC work (A += dW; A -= STC(A)) is error feedback in mucsc.codec.api.state.  Layout: spec/codecs.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

import numpy as np

from mucsc.codec.backends.dispatch import backend_of
from mucsc.codec.wire import bitpack, sparse
from mucsc.codec.codecs.base import (F32_MAX, Codec, EncodedGroup, PaperSetup, Section, array_from, param, param_int,
                              register, section)
from mucsc.codec.codecs.topk import (
    KEEP_HELP, KEEP_LIMITS, check_keep, check_positions, header_keep, positions_resolved, positions_size, selection,
    ScatterDecoder,
)
from mucsc.errors import FormatError


@register
class STC(ScatterDecoder, Codec):
    name = "stc"
    summary = "STC: top-k ternary mu*sign with Golomb-coded positions (Sattler et al. 2019)"
    paper_positions = "golomb"  # positions="paper": the STC paper's Golomb code
    limits = KEEP_LIMITS
    paper_setup = PaperSetup(up={"keep": 0.03}, down={"keep": 0.03})  # section VI-A: both directions
    input_limit = F32_MAX  # mu (float32) is a mean of magnitudes
    accepts_device = True  # selection, mu (summed in numpy's order) and signs on the tensor's device

    @dataclasses.dataclass(frozen=True)
    class Params:
        keep: float = param(0.03, KEEP_HELP, min=0, max=1, min_open=True)
        positions: Literal[("golomb",) + sparse.POSITION_MODES] = param(
            "golomb", "How the kept positions are coded: golomb (STC's own), or as topk's (auto, paper, fixed, "
            "int32, rice, ef, bitmap)")

        def __post_init__(self) -> None:
            check_keep("stc", self.keep)
            check_positions("stc", self.positions, ("golomb",) + sparse.POSITION_MODES)

    def section_sizes(self, n: int, *, positions_bytes: int | None = None, centroids: int | None = None,
                      estimate: bool = False) -> dict[str, int]:
        k = sparse.keep_count(self.params.keep, n)
        golomb = self.params.positions in ("golomb", "paper")
        if positions_bytes is None and golomb:  # a Rice code of the positions: data-dependent
            positions_bytes = sparse.position_bytes("rice", n, k, estimate=estimate)
        return {"SCAL": 4, "SIGN": (k + 7) // 8, "INDX": positions_size(self, n, k, positions_bytes, estimate)}

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        x, pos = selection(x, self.params.keep)
        be = backend_of(x)  # selection, mu (summed in numpy's order) and signs where x lives
        kept = be.take(x, pos)  # fewer than asked when x has fewer non-zeros
        k = pos.size
        mu = np.float32(be.sum64(be.abs(kept)) / k) if k else np.float32(0)
        neg = be.signbit(kept)

        def sq_error() -> float:
            return be.sq_norm(x) - be.sq_norm(kept) + be.sq_error(be.signed(neg, mu), kept)
        return self._encoded(be.size(x), pos, mu, be.pack_bits(neg), sq_error)

    def _encoded(self, n: int, pos: np.ndarray, mu: np.float32, signs, sq_error) -> EncodedGroup:
        """The group from the selected positions, mu and the packed sign bits."""
        if self.params.positions in ("golomb", "paper"):
            b = sparse.stc_golomb_parameter(self.params.keep) if self.params.keep < 1 else 0
            coded = sparse.encode(pos, n, "rice", rice_parameter=min(b, sparse.max_rice_parameter(n)))
        else:
            coded = sparse.encode(pos, n, self.params.positions)
        params = {"keep": self.params.keep, "k": pos.size, **sparse.header_params(coded)}
        secs = (Section("SCAL", np.array([mu], "<f4").tobytes()), Section("SIGN", signs), Section("INDX", coded.data))
        return EncodedGroup(params, secs, {"J": sq_error}, positions_resolved(self.params.positions, coded.method))

    @classmethod
    def _sent(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview]):
        """(positions, values +-mu) of the sent elements, checked."""
        header_keep(params)
        k = param_int(params, "k", 0, n)
        mu = float(array_from(section(sections, "SCAL", 4), "<f4")[0])
        if not np.isfinite(mu) or mu < 0:
            raise FormatError("stc: mu must be finite and non-negative")
        sign = np.frombuffer(section(sections, "SIGN", (k + 7) // 8), np.uint8)
        bitpack.check_padding(sign, k, "stc signs")
        pos = sparse.decode_from_header(params, section(sections, "INDX"), n, k)
        return pos, np.where(np.unpackbits(sign, count=k, bitorder="little").astype(bool), -mu, mu)
