"""Top-k sparsification: the k = ceil(keep * n) largest-magnitude elements as float32 values plus their
positions; the rest decode to 0.  Biased (use error feedback, mucsc.codec.api.state).  ``positions``
selects the position code (mucsc.codec.wire.sparse): ``auto`` (smallest of Rice / Elias-Fano / bitmap,
default), or one method by name.  Layout: spec/codecs.md "topk".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, Literal

import numpy as np

from mucsc.codec.backends.dispatch import backend_for, backend_of, backend_on
from mucsc.codec.wire import sparse
from mucsc.codec.codecs.base import (F32_MAX, Codec, EncodedGroup, PaperSetup, Section, array_from, check_range, param,
                              param_float, param_int, register, scattered, section)
from mucsc.errors import FormatError, ParameterError

KEEP_LIMITS = {"keep": (0.0, 1.0)}  # a fraction of the elements, (0, 1]


KEEP_HELP = "Fraction of the elements kept (the largest magnitudes), in (0, 1]"
POSITIONS_HELP = ("How the kept positions are coded: auto (the smallest), paper (the paper's count), or one "
                  "method: fixed, int32, rice, ef (Elias-Fano), bitmap")


def check_keep(name: str, keep: float) -> None:
    check_range(name, "keep", keep, KEEP_LIMITS, open_low=True)


def header_keep(params: Mapping[str, Any]) -> float:
    """The informative header key ``keep`` (the decoder uses ``k``), checked to be in (0, 1]."""
    keep = param_float(params, "keep")
    if not 0.0 < keep <= 1.0:
        raise FormatError(f"header parameter 'keep' must be in (0, 1], got {keep}")
    return keep


def check_positions(name: str, positions: str, modes: tuple[str, ...] = sparse.POSITION_MODES) -> None:
    if positions not in modes:
        raise ParameterError(f"{name}.positions must be one of {modes}, got {positions!r}")


def positions_resolved(requested: str, method: str) -> dict[str, str]:
    """``EncodedGroup.resolved`` of a ``positions`` parameter: the code "auto" chose for this group."""
    return {"positions": method} if requested == "auto" else {}


def selection(x: Any, keep: float) -> tuple[Any, np.ndarray]:
    """(x, the sorted positions of ``sparse.top_k``): selected where x's backend runs (x then in its
    form: a torch tensor on the torch backend), except that elements tied at the k-th magnitude are
    decided on the host (which of them are sent is the host's choice: x is then a host array)."""
    be = backend_for(x)
    x = be.vector(x)
    k = sparse.keep_count(keep, be.size(x))
    pos = be.top_k_positions(x, k)
    if pos is None:
        x = be.host_array(x)
        pos = sparse.top_k(x, k)
    return x, pos


def positions_size(codec: Codec, n: int, k: int, positions_bytes: int | None, estimate: bool) -> int:
    """Bytes of the INDX section of a top-k style codec (``paper_positions`` resolves "paper")."""
    if positions_bytes is not None:
        return positions_bytes
    method = codec.params.positions
    return sparse.position_bytes(codec.paper_positions if method == "paper" else method, n, k,
                                 estimate=estimate)


class ScatterDecoder:
    """The decoders of a codec that sends k values at k positions (its ``_sent`` reads and checks
    them): zeros elsewhere, on the host or on a device (``decode_on_device``): one scatter step."""

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        return cls.decode_on_device(n, params, sections, dtype, None)

    @classmethod
    def decode_parts(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> Iterator[np.ndarray]:
        """:meth:`decode_array` a piece at a time: the k values scattered over zeros, piece by piece."""
        yield from scattered(n, *cls._sent(n, params, sections), 0.0, dtype)

    @classmethod
    def decode_on_device(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                         dtype: np.dtype, device) -> Any:
        """The decoded vector on ``device`` (None: the host): the k positions and values are copied
        over and scattered there."""
        return backend_on(device).scatter(n, *cls._sent(n, params, sections), dtype, device)


@register
class TopK(ScatterDecoder, Codec):
    name = "topk"
    summary = "top-k: the largest-magnitude fraction as float32 values + compact positions"
    paper_positions: ClassVar[str] = "fixed"  # what positions="paper" means for this codec
    limits = KEEP_LIMITS
    paper_setup = PaperSetup(downlink=False)  # not in the paper's experiments; uplink only, as DGC
    input_limit = F32_MAX  # VALS is float32
    accepts_device = True  # the selection and the gather on the tensor's device; positions coded on the host

    @dataclasses.dataclass(frozen=True)
    class Params:
        keep: float = param(0.01, KEEP_HELP, min=0, max=1, min_open=True)
        positions: Literal[sparse.POSITION_MODES] = param("auto", POSITIONS_HELP)

        def __post_init__(self) -> None:
            check_keep("topk", self.keep)
            check_positions("topk", self.positions)

    def section_sizes(self, n: int, *, positions_bytes: int | None = None, centroids: int | None = None,
                      estimate: bool = False) -> dict[str, int]:
        k = sparse.keep_count(self.params.keep, n)
        return {"VALS": 4 * k, "INDX": positions_size(self, n, k, positions_bytes, estimate)}

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        x, pos = selection(x, self.params.keep)
        be = backend_of(x)  # the gather and the cast where x lives; only the values cross
        kept = be.take(x, pos)
        vals = be.cast(kept, "<f4")

        def sq_error() -> float:
            return be.sq_norm(x) - be.sq_norm(kept) + be.sq_error(vals, kept)
        return self._encoded(be.size(x), pos, be.host_bytes(vals), sq_error)

    def _encoded(self, n: int, pos: np.ndarray, vals, sq_error) -> EncodedGroup:
        """The group from the selected positions (fewer than asked when x has fewer non-zeros) and
        their float32 values' bytes."""
        method = self.paper_positions if self.params.positions == "paper" else self.params.positions
        coded = sparse.encode(pos, n, method)
        params = {"keep": self.params.keep, "k": pos.size, **sparse.header_params(coded)}
        secs = (Section("VALS", vals), Section("INDX", coded.data))
        return EncodedGroup(params, secs, {"J": sq_error}, positions_resolved(self.params.positions, coded.method))

    @classmethod
    def _sent(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview]):
        """(positions, float32 values) of the sent elements, checked."""
        header_keep(params)
        k = param_int(params, "k", 0, n)
        vals = array_from(section(sections, "VALS", 4 * k), "<f4")
        if not np.all(np.isfinite(vals)):
            raise FormatError(f"{cls.name}: values must be finite")
        return sparse.decode_from_header(params, section(sections, "INDX"), n, k), vals
