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

from mucsc.codec import bitpack, centroids, quantize, sparse
from mucsc.codec.base import (Codec, EncodedGroup, Section, array_from, param_int, param_str, register,
                              section)
from mucsc.codec.codecs.topk import header_keep
from mucsc.errors import FormatError, ParameterError

MAX_Z = 1 << 16  # FORMAT.md limits: ids at most 16 bits
POSITION_MODES = ("auto", "paper") + sparse.METHODS


def id_width(k: int) -> int:
    """ceil(log2 k) bits per cluster id for k centroids (0 for k <= 1)."""
    return max(0, int(k - 1).bit_length())


def _wire_centroids(c: np.ndarray, kept: np.ndarray) -> np.ndarray:
    """float32 wire centroids bracketing ``kept``; a single level that float32 cannot represent (a
    constant float64 vector) becomes the two float32 neighbours around it."""
    w = quantize.wire_centroids(c, kept, np.float32)
    v = float(kept[0])
    if w.size == 1 and float(w[0]) != v:
        lo = np.float32(v)
        if float(lo) > v:
            lo = np.nextafter(lo, np.float32(-np.inf))
        w = np.array([lo, np.nextafter(lo, np.float32(np.inf))], np.float32)
    return w


@register
class BMUCSC(Codec):
    name = "bmucsc"
    summary = "B-MUCSC: MUCSC on the top keep*d magnitudes, the rest sent as their mean (paper IV-E)"

    @dataclasses.dataclass(frozen=True)
    class Params:
        keep: float = 0.01
        z: int = 256
        solver: str = "optimal"
        positions: str = "auto"

        def __post_init__(self) -> None:
            if not 0.0 < self.keep <= 1.0:
                raise ParameterError(f"bmucsc.keep must be in (0, 1], got {self.keep}")
            if not 2 <= self.z <= MAX_Z:
                raise ParameterError(f"bmucsc.z must be in [2, {MAX_Z}], got {self.z}")
            if self.solver not in centroids.SOLVERS:
                raise ParameterError(f"bmucsc.solver must be one of {tuple(centroids.SOLVERS)}, got {self.solver!r}")
            if self.positions not in POSITION_MODES:
                raise ParameterError(f"bmucsc.positions must be one of {POSITION_MODES}, got {self.positions!r}")

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        n = x.size
        k = sparse.keep_count(self.params.keep, n)
        pos = sparse.top_k(x, k)  # np.argpartition on |x|: O(n), not a sort
        kept = x[pos]
        rest_sum = float(x.sum(dtype=np.float64)) - float(kept.sum(dtype=np.float64))
        mean = np.float32(rest_sum / (n - k)) if n > k else np.float32(0)
        if k:
            c = _wire_centroids(centroids.solve(kept, self.params.z, self.params.solver, rng), kept)
            ids = quantize.stochastic_round(kept, c, rng)
        else:
            c, ids = np.zeros(0, np.float32), np.zeros(0, np.uint8)
        method = "fixed" if self.params.positions == "paper" else self.params.positions
        coded = sparse.encode(pos, n, method)
        params = {"keep": self.params.keep, "z": self.params.z, "solver": self.params.solver,
                  "k": k, "centroids": int(c.size), **sparse.header_params(coded)}
        secs = (Section("CENT", c.astype("<f4").tobytes()),
                Section("IDS_", bitpack.pack(ids, id_width(c.size)), compressible=True),
                Section("INDX", coded.data, compressible=coded.method in ("fixed", "bitmap")),
                Section("SCAL", np.array([mean], "<f4").tobytes()))

        def sq_error() -> float:  # variance of the kept part (eq. 8-9) + the rest's squared bias
            rest = np.ones(n, bool)
            rest[pos] = False
            bias = float(np.sum((x[rest].astype(np.float64) - float(mean)) ** 2))
            return (centroids.variance_J(kept, c) if k else 0.0) + bias
        return EncodedGroup(params, secs, {"J": sq_error, "kept": float(k)})

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        header_keep(params)
        param_int(params, "z", 2, MAX_Z)  # informative (the requested Z), but must be well-formed
        k = param_int(params, "k", 0, n)
        kc = param_int(params, "centroids", 1 if k else 0, min(k + 1, MAX_Z) if k else 0)  # k + 1: see _wire_centroids
        param_str(params, "solver", tuple(centroids.SOLVERS))  # informative, but must be well-formed
        c = array_from(section(sections, "CENT", 4 * kc), "<f4")
        if not np.all(np.isfinite(c)) or np.any(np.diff(c) <= 0):
            raise FormatError("bmucsc: centroids must be finite and strictly increasing")
        ids = bitpack.unpack(section(sections, "IDS_"), id_width(kc), k)
        if k and int(ids.max()) >= kc:
            raise FormatError(f"bmucsc: a cluster id is >= the {kc} centroids")
        pos = sparse.decode_from_header(params, section(sections, "INDX"), n, k)
        mean = array_from(section(sections, "SCAL", 4), "<f4")[0]
        if not np.isfinite(mean):
            raise FormatError("bmucsc: the mean of the rest must be finite")
        out = np.full(n, mean, dtype)
        out[pos] = c.astype(dtype)[ids] if k else 0
        return out
