"""QSGD (Alistarh et al., NeurIPS 2017): unbiased stochastic quantisation to s levels per bucket.

Per bucket v of ``bucket`` elements: ||v|| (float32, rounded up), and for each element a sign and a
level l in 0..s with E[l] = s |v_i| / ||v||, so E[decode] = v.  Wire: ``fixed`` packs (l << 1 | sign)
in 1 + ceil(log2(s+1)) bits; ``elias`` sends only the non-zeros: Elias-gamma gaps, Elias-gamma
levels and one sign bit each (the paper's coding).  Layouts: spec/codecs.md "qsgd".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from mucsc.codec import bitpack, sparse
from mucsc.codec.base import (Codec, EncodedGroup, PaperSetup, Section, array_from, check_range, param_int,
                              param_str, register, section)
from mucsc.errors import FormatError, ParameterError, SizeError

MAX_S = (1 << 15) - 1  # fixed width 1 + ceil(log2(s + 1)) <= 16 bits (bitpack's limit)
MAX_BUCKET = 1 << 30


def round_up_f32(v: np.ndarray | float) -> np.ndarray:
    """The smallest float32 >= v (elementwise): a scale that still bounds |x| after rounding to float32."""
    v64 = np.asarray(v, np.float64)
    f = v64.astype(np.float32)
    low = f.astype(np.float64) < v64
    return np.where(low, np.nextafter(f, np.float32(np.inf)), f).astype(np.float32)


def level_width(s: int) -> int:
    """Bits of one fixed-width QSGD element: 1 sign bit + ceil(log2(s + 1)) level bits."""
    return 1 + int(s).bit_length()


@register
class QSGD(Codec):
    name = "qsgd"
    unbiased = True
    summary = "QSGD: s-level unbiased stochastic quantisation per bucket (Alistarh et al. 2017)"
    limits = {"s": (1, MAX_S), "bucket": (1, MAX_BUCKET)}
    paper_setup = PaperSetup(downlink=False)  # section VI-A: QSGD compresses the uplink only

    @dataclasses.dataclass(frozen=True)
    class Params:
        s: int = 15
        bucket: int = 512
        coding: str = "fixed"

        def __post_init__(self) -> None:
            check_range("qsgd", "s", self.s, QSGD.limits)
            check_range("qsgd", "bucket", self.bucket, QSGD.limits)
            if self.coding not in ("fixed", "elias"):
                raise ParameterError(f"qsgd.coding must be 'fixed' or 'elias', got {self.coding!r}")

    def section_sizes(self, n: int, *, positions_bytes: int | None = None, centroids: int | None = None,
                      estimate: bool = False) -> dict[str, int]:
        if self.params.coding != "fixed":
            raise SizeError("qsgd with coding='elias' has a data-dependent size")
        return {"NORM": 4 * (-(-n // self.params.bucket)), "VALS": bitpack.packed_size(n, level_width(self.params.s))}

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        s, bucket = self.params.s, self.params.bucket
        n = x.size
        x64 = x.astype(np.float64, copy=False)
        sq = np.add.reduceat(x64 * x64, np.arange(0, n, bucket)) if n else np.zeros(0)
        norms = round_up_f32(np.sqrt(sq))  # ||v|| per bucket, rounded up to float32
        scale = norms.astype(np.float64)
        per = _per_element(scale, bucket, n)
        ratio = np.divide(np.abs(x64), per, out=np.zeros(n), where=per > 0)
        r = s * ratio  # in [0, s]: |v_i| <= ||v|| <= float32 norm
        lev = np.floor(r)
        lev += rng.random(n) < (r - lev)  # (l + 1) with probability r - l: unbiased
        lev = lev.astype(np.int64)
        neg = np.signbit(x) & (lev > 0)
        params: dict[str, Any] = {"s": s, "bucket": bucket, "coding": self.params.coding}
        secs = [Section("NORM", norms.astype("<f4").tobytes())]
        if self.params.coding == "fixed":
            vals = (lev << 1) | neg
            secs.append(Section("VALS", bitpack.pack(vals, level_width(s)), compressible=True))
        else:
            nz = np.flatnonzero(lev)
            params["nnz"] = int(nz.size)
            secs += [Section("INDX", sparse.gamma_encode(np.diff(nz, prepend=-1))),
                     Section("VALS", sparse.gamma_encode(lev[nz])),
                     Section("SIGN", np.packbits(neg[nz], bitorder="little").tobytes())]
        stats = {"J": lambda: _variance(x, scale, s, bucket)}
        return EncodedGroup(params, tuple(secs), stats)

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        s = param_int(params, "s", 1, MAX_S)
        bucket = param_int(params, "bucket", 1, MAX_BUCKET)
        coding = param_str(params, "coding", ("fixed", "elias"))
        nb = -(-n // bucket)
        norms = array_from(section(sections, "NORM", 4 * nb), "<f4").astype(np.float64)
        if not np.all(np.isfinite(norms)) or np.any(norms < 0):
            raise FormatError("qsgd: bucket norms must be finite and non-negative")
        if coding == "fixed":
            w = level_width(s)
            vals = bitpack.unpack(section(sections, "VALS", bitpack.packed_size(n, w)), w, n).astype(np.int64)
            lev, neg = vals >> 1, (vals & 1).astype(bool)
            if lev.size and int(lev.max()) > s:
                raise FormatError(f"qsgd: a level exceeds s = {s}")
            if np.any(neg & (lev == 0)):
                raise FormatError("qsgd: a zero level carries a sign bit")  # canonical encoding
        else:
            nnz = param_int(params, "nnz", 0, n)
            gaps = sparse.gamma_decode(section(sections, "INDX"), nnz, n)
            if float(gaps.sum(dtype=np.float64)) > n:
                raise FormatError("qsgd: non-zero positions run past the end")
            pos = np.cumsum(gaps) - 1
            if nnz and int(pos[-1]) >= n:
                raise FormatError("qsgd: non-zero positions run past the end")
            levels = sparse.gamma_decode(section(sections, "VALS"), nnz, s)
            sign_mv = section(sections, "SIGN", (nnz + 7) // 8)
            sign_bytes = np.frombuffer(sign_mv, np.uint8)
            sparse.check_padding(sign_bytes, nnz)
            lev = np.zeros(n, np.int64)
            neg = np.zeros(n, bool)
            lev[pos] = levels
            neg[pos] = np.unpackbits(sign_bytes, count=nnz, bitorder="little").astype(bool)
        out = _per_element(norms / s, bucket, n) * lev
        np.negative(out, out=out, where=neg)
        return out.astype(dtype)


def _per_element(per_bucket: np.ndarray, bucket: int, n: int) -> np.ndarray:
    """Each element's bucket value (n values: never allocates n_buckets * bucket)."""
    return per_bucket[np.arange(n) // bucket] if n else np.zeros(0)


def _variance(x: np.ndarray, scale: np.ndarray, s: int, bucket: int) -> float:
    """Exact E||Q(v) - v||^2 = sum (norm/s)^2 (r - l)(l + 1 - r), r = s |v_i| / norm."""
    step = _per_element(scale / s, bucket, x.size)
    r = np.divide(np.abs(x), step, out=np.zeros(x.size), where=step > 0)
    frac = r - np.floor(r)
    return float(np.sum(step * step * frac * (1.0 - frac)))
