"""B-MUCSC, Boosted MUCSC (paper section IV-E): MUCSC on the d0 largest-magnitude elements.

Rank |U_m|, keep the top d0 = ceil(keep * d) (default 1%, the paper's 0.01 d), cluster those into at
most ``z`` centroids (default 256) and stochastically round them (eq. 7, unbiased on the kept part),
send their positions, and replace the other d - d0 elements by their mean (one float32).  Biased by
design: the rest is replaced by its mean (use error feedback, mucsc.codec.state, to carry it over).

Positions: ``auto`` (default) is the smallest of Rice / Elias-Fano / bitmap (about 8.1 bits per
position at d0 = 0.01 d); ``paper`` is the fixed ceil(log2 d) bits of eq. CompressRateB.  With
compress="off" and positions="paper" the payload equals the paper's count exactly:
(ceil(log2 Z) + ceil(log2 d)) d0 / 8 + 4 Z + 4 (up to byte rounding).  Layout: spec/codecs.md "bmucsc".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from mucsc.codec import centroids, sparse, torch_backend
from mucsc.codec.base import (F32_MAX, H, Z_RANGE, Codec, EncodedGroup, PaperSetup, Section, array_from, ceil_log2,
                              param_int, param_str, register, section)
from mucsc.codec.codecs.mucsc import (CENTROID_LIMITS, MucscParams, cluster_section_sizes, decode_clusters, encode_clusters,
                                     resolve_id_packing)
from mucsc.codec.codecs.topk import KEEP_LIMITS, check_keep, check_positions, header_keep, positions_size
from mucsc.errors import FormatError, ParameterError

MAX_Z = Z_RANGE[1]


def paper_bmucsc_bytes(d: int, d0: float, z: int, h: int = H) -> float:
    """Bytes of one B-MUCSC transfer as the paper counts them (eq. CompressRateB's per-direction
    term): (ceil(log2 Z) + ceil(log2 d)) / 8 d0 + h Z + h (fixed-width IDs and positions, the mean)."""
    return (ceil_log2(z) + ceil_log2(d)) / 8 * d0 + h * z + h


def cluster_params(p: Any) -> MucscParams:
    """The mucsc codec's parameters for the clustering of the kept elements."""
    return MucscParams(z=p.z, solver=p.solver, centroid_dtype=p.centroid_dtype, id_packing=p.id_packing)


@register
class BMUCSC(Codec):
    name = "bmucsc"
    accepts_torch = True
    summary = "B-MUCSC: MUCSC on the top keep*d magnitudes, the rest sent as their mean (paper IV-E)"
    paper_positions = "fixed"  # eq. CompressRateB: ceil(log2 d) bits per position
    limits = {**KEEP_LIMITS, "z": Z_RANGE}
    # section VI-A: both directions, d0 = 0.01 d, Z = 256
    paper_setup = PaperSetup(up={"z": 256, "keep": 0.01}, down={"z": 256, "keep": 0.01})

    @dataclasses.dataclass(frozen=True)
    class Params:
        keep: float = 0.01
        z: int = 256
        solver: str = "optimal"
        positions: str = "auto"
        centroid_dtype: str = "float32"
        id_packing: str = "auto"  # as the mucsc codec's

        def __post_init__(self) -> None:
            check_keep("bmucsc", self.keep)
            check_positions("bmucsc", self.positions)
            try:  # the clustering parameters are the mucsc codec's, validated there
                cluster_params(self)
            except ParameterError as exc:
                raise ParameterError(f"bmucsc.{exc}") from None

    @property
    def _cluster_params(self) -> MucscParams:
        return cluster_params(self.params)

    def section_sizes(self, n: int, *, positions_bytes: int | None = None, centroids: int | None = None,
                      estimate: bool = False) -> dict[str, int]:
        """``centroids`` sent default to min(z, kept elements), exact for continuous data."""
        k = sparse.keep_count(self.params.keep, n)
        kc = min(self.params.z, k) if centroids is None else centroids
        return {**cluster_section_sizes(k, kc, self._cluster_params, estimate),
                "INDX": positions_size(self, n, k, positions_bytes, estimate), "SCAL": 4}

    def paper_bytes(self, d: int, h: int = H) -> float:
        return paper_bmucsc_bytes(d, sparse.keep_count(self.params.keep, d), self.params.z, h)

    def for_container(self, compressing: bool) -> Codec:
        return resolve_id_packing(self, compressing)

    @property
    def input_limit(self) -> float:
        return min(CENTROID_LIMITS[self.params.centroid_dtype], F32_MAX)  # SCAL, the mean, is float32

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        if torch_backend.is_torch(x):
            return self._encode_torch(x, rng)
        n = x.size
        k = sparse.keep_count(self.params.keep, n)
        pos = sparse.top_k(x, k)  # np.argpartition on |x|: O(n), not a sort
        k = pos.size  # fewer than asked when x has fewer non-zeros (the rest's mean is then 0)
        kept = x[pos]
        rest_sum = float(x.sum(dtype=np.float64)) - float(kept.sum(dtype=np.float64))
        return self._encode_kept(x, n, k, pos, kept, rest_sum, rng)

    def _encode_torch(self, x, rng: np.random.Generator) -> EncodedGroup:
        """On the tensor's device: the top-k selection, the kept values' clustering and rounding.
        The same bytes as the host path, except the rest's mean on a GPU (FORMAT.md, informative
        notes: its float64 sum is reduced in another order there)."""
        n = x.numel()
        k = sparse.keep_count(self.params.keep, n)
        pos = torch_backend.top_k_positions(x, k)
        if pos is None or torch_backend.host_sums(x):  # ties at the k-th magnitude: the host's choice
            host = x.cpu().numpy()  # (on the CPU this is a view: the reference sum, no copy)
            if pos is None:
                return self.encode_array(host, rng)
            kept = host[pos]
            rest_sum = float(host.sum(dtype=np.float64)) - float(kept.sum(dtype=np.float64))
            return self._encode_kept(host, n, k, pos, torch_backend.as_tensor(kept), rest_sum, rng)
        kept = x[torch_backend.as_tensor(pos).to(x.device)]
        rest_sum = torch_backend.sum64(x) - torch_backend.sum64(kept)
        return self._encode_kept(x, n, k, pos, kept, rest_sum, rng)

    def _encode_kept(self, x, n: int, k: int, pos: np.ndarray, kept, rest_sum: float,
                     rng: np.random.Generator) -> EncodedGroup:
        """Everything after the selection: the kept values' clusters, positions and the rest's mean."""
        mean = np.float32(rest_sum / (n - k)) if n > k else np.float32(0)
        cparams, csecs, J_kept = encode_clusters(kept, self._cluster_params, rng)  # as the mucsc codec
        method = self.paper_positions if self.params.positions == "paper" else self.params.positions
        coded = sparse.encode(pos, n, method)
        params = {"keep": self.params.keep, "k": k, **cparams, **sparse.header_params(coded)}
        secs = (*csecs,
                Section("INDX", coded.data, compressible=coded.method in ("fixed", "bitmap")),
                Section("SCAL", np.array([mean], "<f4").tobytes()))

        def sq_error() -> float:  # variance of the kept part (eq. 8-9) + the rest's squared bias
            if torch_backend.is_torch(x):
                return J_kept() + torch_backend.rest_sq_bias(x, pos, float(mean))
            rest = np.ones(n, bool)
            rest[pos] = False
            bias = float(np.sum((x[rest].astype(np.float64) - float(mean)) ** 2))
            return J_kept() + bias
        return EncodedGroup(params, secs, {"J": sq_error, "kept": float(k)})

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        header_keep(params)
        param_int(params, "z", 2, MAX_Z)  # informative (requested Z, solver), but must be well-formed
        param_str(params, "solver", tuple(centroids.SOLVERS))
        k = param_int(params, "k", 0, n)
        vals = decode_clusters(k, params, sections, dtype)  # CENT + IDS_ exactly as the mucsc codec
        pos = sparse.decode_from_header(params, section(sections, "INDX"), n, k)
        mean = array_from(section(sections, "SCAL", 4), "<f4")[0]
        if not np.isfinite(mean):
            raise FormatError("bmucsc: the mean of the rest must be finite")
        out = np.full(n, mean, dtype)
        out[pos] = vals
        return out
