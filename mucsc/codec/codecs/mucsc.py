"""``mucsc``: Model Update Compression by Soft Clustering (paper section IV-A).

The vector is sent as Z sorted centroids (CENT) and one ceil(log2 Z)-bit cluster ID per element
(IDS_; 4 or 8 bits for 3- and 5..7-bit IDs when the section is zstd-compressed, see ``id_packing``).  Each element is rounded at random to one of its two neighbouring centroids with eq. 7's
probabilities, so decoding is unbiased; the centroids minimise the variance J of eq. 8-9.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from mucsc.codec import bitpack, centroids, kernels, quantize
from mucsc.codec.base import (Codec, EncodedGroup, Section, array_from, param_int, param_str, register,
                              section)
from mucsc.errors import FormatError, ParameterError

MIN_Z, MAX_Z = 2, 65536
CENTROID_DTYPES = {"float16": "<f2", "float32": "<f4", "float64": "<f8"}


ID_PACKINGS = ("auto", "tight", "aligned")
# zstd's entropy stage codes bytes: IDs that straddle byte boundaries (3, 5, 6, 7 bits) compress far
# worse than the same IDs packed 4 or 8 bits wide (measured, Gaussian d = 1.3e6, Z = 8: 2.81 bits per
# ID tight vs 2.46 aligned, entropy 2.43; docs/codecs.md).  Wider IDs (9..15 bits) stay tight: as
# 16-bit words their two bytes mix into one byte alphabet and compress worse than tight packing.
ALIGNED_WIDTH = {3: 4, 5: 8, 6: 8, 7: 8}
ALIGN_MARGIN_BITS = 0.25  # aligned only if the sampled entropy is this far below the tight width


def id_width(k: int) -> int:
    """Bits per cluster ID for ``k`` centroids: ceil(log2 k), 0 for a single centroid."""
    return max(0, math.ceil(math.log2(k))) if k > 1 else 0


def packed_width(ids: np.ndarray, k: int, packing: str) -> int:
    """The IDS_ width: ceil(log2 k), or its byte-aligned widening when ``packing`` is "aligned" and
    the IDs' entropy (estimated on a sample) leaves room for zstd to win the extra bits back."""
    w = id_width(k)
    if packing != "aligned" or w not in ALIGNED_WIDTH or ids.size == 0:
        return w
    sample = ids[:: max(1, ids.size // 65536)]
    p = np.bincount(sample, minlength=k) / sample.size
    p = p[p > 0]
    entropy = float(-(p * np.log2(p)).sum())
    return ALIGNED_WIDTH[w] if entropy < w - ALIGN_MARGIN_BITS else w


@dataclasses.dataclass(frozen=True)
class MucscParams:
    """z: number of centroids (2..65536); solver: how centroids are chosen; centroid_dtype: wire
    dtype; id_packing: "tight" (ceil(log2 z) bits), "aligned" (byte-aligned widths when the entropy
    allows, for a zstd-compressed IDS_) or "auto" (aligned exactly when the container compresses)."""

    z: int = 16
    solver: str = "optimal"
    centroid_dtype: str = "float32"
    id_packing: str = "auto"

    def __post_init__(self) -> None:
        if not MIN_Z <= self.z <= MAX_Z:
            raise ParameterError(f"z must be in {MIN_Z}..{MAX_Z}, got {self.z}")
        if self.solver not in centroids.SOLVERS:
            raise ParameterError(f"unknown solver {self.solver!r}; choose from {', '.join(centroids.SOLVERS)}")
        if self.centroid_dtype not in CENTROID_DTYPES:
            raise ParameterError(f"centroid_dtype must be one of {', '.join(CENTROID_DTYPES)}")
        if self.id_packing not in ID_PACKINGS:
            raise ParameterError(f"id_packing must be one of {', '.join(ID_PACKINGS)}")


def resolve_id_packing(codec: Codec, compressing: bool) -> Codec:
    """``for_container`` of codecs with an ``id_packing`` parameter: resolve "auto"."""
    if codec.params.id_packing != "auto":
        return codec
    packing = "aligned" if compressing else "tight"
    return type(codec)(**{**dataclasses.asdict(codec.params), "id_packing": packing})


def encode_clusters(x: np.ndarray, p: MucscParams, rng: np.random.Generator) -> tuple[dict, tuple, Any]:
    """Shared by ``mucsc`` and ``bmucsc``: (header params, (CENT, IDS_) sections, J as a callable)."""
    if x.size == 0:
        wire = np.zeros(0, CENTROID_DTYPES[p.centroid_dtype])
        ids = np.zeros(0, np.uint8)
        J = 0.0
    else:
        bounds = (float(x.min()), float(x.max()))  # once, not once per stage
        c = centroids.solve(x, p.z, p.solver, rng, bounds=bounds)
        wire = quantize.wire_centroids(c, x, np.dtype(p.centroid_dtype), bounds=bounds)
        # The C kernel accumulates J (float64) in the rounding pass for ~5 ms per 1e7 elements; in
        # the numpy fallback that costs ~40% of the rounding, so there J is computed only on demand.
        if kernels.use_c():
            ids, J = quantize.stochastic_round(x, wire, rng, bounds=bounds, return_J=True)
        else:
            ids = quantize.stochastic_round(x, wire, rng, bounds=bounds)
            J = None
    k = int(wire.size)
    bits = packed_width(ids, k, p.id_packing)
    params = {"centroids": k, "centroid_dtype": p.centroid_dtype, "id_bits": bits, "solver": p.solver,
              "z": p.z}
    sections = (Section("CENT", np.ascontiguousarray(wire, CENTROID_DTYPES[p.centroid_dtype])),
                Section("IDS_", bitpack.pack(ids, bits), compressible=True))

    def exact_J() -> float:  # eq. 8-9, with the wire centroids the decoder sees
        if J is not None:
            return float(J)
        return float(centroids.variance_J(x, np.asarray(wire, np.float64)))

    return params, sections, exact_J


def decode_clusters(n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                    dtype: np.dtype) -> np.ndarray:
    """Inverse of :func:`encode_clusters`, validating the untrusted header and sections."""
    cdtype = param_str(params, "centroid_dtype", tuple(CENTROID_DTYPES))
    k = param_int(params, "centroids", 0, MAX_Z)
    if (k == 0) != (n == 0):
        raise FormatError(f"{k} centroids for {n} elements")
    cent = array_from(section(sections, "CENT"), CENTROID_DTYPES[cdtype], k)
    if k and not (np.all(np.isfinite(cent)) and np.all(np.diff(cent) > 0)):
        raise FormatError("centroids must be finite and strictly increasing")
    width = param_int(params, "id_bits", 0, bitpack.MAX_WIDTH)
    if (width == 0) != (k <= 1) or width < id_width(k):
        raise FormatError(f"id_bits {width} cannot address {k} centroids")
    ids = bitpack.unpack(section(sections, "IDS_"), width, n)  # checks the length before allocating
    if k and width and int(ids.max(initial=0)) >= k:
        raise FormatError(f"cluster id {int(ids.max())} out of range for {k} centroids")
    if n == 0:
        return np.zeros(0, dtype)
    return quantize.dequantize(ids, cent, dtype, check=False)  # ids checked above


@register
class Mucsc(Codec):
    """MUCSC: Z centroids minimising J, unbiased stochastic rounding, fixed-width cluster IDs."""

    name = "mucsc"
    unbiased = True
    summary = "soft clustering to z centroids, unbiased; ceil(log2 z) bits per element"
    Params = MucscParams

    def for_container(self, compressing: bool) -> Codec:
        return resolve_id_packing(self, compressing)

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        params, sections, J = encode_clusters(x, self.params, rng)
        return EncodedGroup(params, sections, {"J": J})

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        return decode_clusters(n, params, sections, dtype)
