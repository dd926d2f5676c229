"""QSGD (Alistarh et al., NeurIPS 2017): unbiased stochastic quantisation to s levels per bucket.

Per bucket v of ``bucket`` elements: ||v|| (float32, rounded up), and for each element a sign and a
level l in 0..s with E[l] = s |v_i| / ||v||, so E[decode] = v.  Wire: ``fixed`` packs (l << 1 | sign)
in 1 + ceil(log2(s+1)) bits; ``elias`` sends only the non-zeros: Elias-gamma gaps, Elias-gamma
levels and one sign bit each (the paper's coding).  Layouts: spec/codecs.md "qsgd".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import numpy as np

from mucsc.codec.wire import bitpack
from mucsc.codec.codecs.base import (F32_MAX, Codec, EncodedGroup, PaperSetup, Section, array_from, check_range, param,
                              joined, param_int, param_str, register, scattered_runs, section)
from mucsc.errors import FormatError, ParameterError, SizeError

MAX_S = (1 << 15) - 1  # fixed width 1 + ceil(log2(s + 1)) <= 16 bits (bitpack's limit)
MAX_BUCKET = 1 << 30


def round_up_f32(v: np.ndarray | float) -> np.ndarray:
    """The smallest float32 >= v (elementwise): a scale that still bounds |x| after rounding to float32."""
    v64 = np.asarray(v, np.float64)
    f = v64.astype(np.float32)
    low = f.astype(np.float64) < v64
    with np.errstate(over="ignore"):  # nextafter(FLT_MAX) is evaluated, never selected (v <= FLT_MAX)
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
    rate_variants = ({"s": 15}, {"s": 255})

    @dataclasses.dataclass(frozen=True)
    class Params:
        s: int = param(15, "Quantization levels per sign (the paper's s)", min=1, max=MAX_S)
        bucket: int = param(512, "Elements per bucket, each with its own norm", min=1, max=MAX_BUCKET)
        coding: Literal["fixed", "elias"] = param("fixed", "Level coding: fixed width, or Elias-gamma (QSGD's own)")

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

    @property
    def input_limit(self) -> float:
        """Every bucket norm, rounded up to float32, must be finite: |x| <= FLT_MAX / sqrt(bucket)
        guarantees it (with a margin for the float64 sum and square root)."""
        return F32_MAX / float(np.sqrt(self.params.bucket)) * (1 - 2.0**-20)

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        s, bucket = self.params.s, self.params.bucket
        n = x.size
        norms = round_up_f32(np.sqrt(_bucket_squares(x, bucket)))  # ||v|| per bucket, rounded up
        scale = norms.astype(np.float64)
        # one level and sign per element, a chunk of whole buckets at a time (float64 temporaries of
        # one chunk, never of the whole vector); the uniforms are drawn in order, so the stream is the
        # same as one draw of n
        codes = np.empty(n, np.uint16)  # (level << 1) | sign: level <= s <= 2**15 - 1
        for a, b in _chunks(n, bucket):
            xa = x[a:b].astype(np.float64)
            per = _per_element(scale, bucket, b - a, a)
            r = s * np.divide(np.abs(xa), per, out=np.zeros(b - a), where=per > 0)  # in [0, s]
            lev = np.floor(r)
            lev += rng.random(b - a) < (r - lev)  # (l + 1) with probability r - l: unbiased
            neg = np.signbit(xa) & (lev > 0)
            codes[a:b] = (lev.astype(np.uint16) << 1) | neg
        params: dict[str, Any] = {"s": s, "bucket": bucket, "coding": self.params.coding}
        secs = [Section("NORM", norms.astype("<f4").tobytes())]
        if self.params.coding == "fixed":
            w = level_width(s)
            # 8 values of w bits fill w whole bytes: chunks of a multiple of 8 values pack independently
            packed = b"".join(bitpack.pack(codes[a:b], w) for a, b in _chunks(n, 8))
            del codes
            secs.append(Section("VALS", packed, compressible=True))
        else:  # the non-zeros' gaps, levels and signs, a chunk of codes at a time (no array of them all)
            secs += _elias_sections(codes, params)
            del codes
        stats = {"J": lambda: _variance(x, scale, s, bucket)}
        return EncodedGroup(params, tuple(secs), stats)

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        return joined(n, dtype, cls.decode_parts(n, params, sections, dtype))

    @classmethod
    def decode_parts(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> Iterator[np.ndarray]:
        s = param_int(params, "s", 1, MAX_S)
        bucket = param_int(params, "bucket", 1, MAX_BUCKET)
        coding = param_str(params, "coding", ("fixed", "elias"))
        nb = -(-n // bucket)
        with np.errstate(invalid="ignore"):  # a signalling NaN from untrusted bytes: refused below
            norms = array_from(section(sections, "NORM", 4 * nb), "<f4").astype(np.float64)
        if not np.all(np.isfinite(norms)) or np.any(norms < 0):
            raise FormatError("qsgd: bucket norms must be finite and non-negative")
        step = norms / s
        if coding == "fixed":
            w = level_width(s)
            buf = section(sections, "VALS", bitpack.packed_size(n, w))
            for a, b in _chunks(n, 8):  # whole bytes per chunk (a and b multiples of 8 but the last)
                vals = bitpack.unpack(buf[a * w // 8: bitpack.packed_size(b, w)], w, b - a)
                yield _levels(a, b, vals >> 1, (vals & 1).astype(bool), step, bucket, s).astype(dtype)
            return
        nnz = param_int(params, "nnz", 0, n)
        gaps = bitpack.gamma_codes(section(sections, "INDX"), nnz, n)
        if gaps.total > n:  # the last position, sum(gaps) - 1, must be < n
            raise FormatError("qsgd: non-zero positions run past the end")
        levels = bitpack.gamma_codes(section(sections, "VALS"), nnz, s)
        sign_bytes = np.frombuffer(section(sections, "SIGN", (nnz + 7) // 8), np.uint8)
        bitpack.check_padding(sign_bytes, nnz, "qsgd signs")
        yield from scattered_runs(n, _elias_runs(gaps, levels, sign_bytes, step, bucket), 0.0, dtype)


CHUNK = 1 << 18  # elements per chunk of the encoder's and decoder's float64 temporaries


ELIAS_CHUNK = 1 << 14  # non-zeros of an Elias-coded group decoded at a time (a multiple of 8)


def _elias_runs(gaps: bitpack.GammaCodes, levels: bitpack.GammaCodes, sign_bytes: np.ndarray, step: np.ndarray,
                bucket: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The checked non-zeros of an Elias-coded group as runs (positions, float64 values), ELIAS_CHUNK
    at a time: the two gamma streams are read front to back, never whole (FORMAT.md 3.2)."""
    g, lev = bitpack.GammaReader(gaps), bitpack.GammaReader(levels)
    last = -1
    for a in range(0, gaps.k, ELIAS_CHUNK):
        pos = np.cumsum(g.read(ELIAS_CHUNK)) + last
        last = int(pos[-1])
        neg = np.unpackbits(sign_bytes[a // 8: (a + ELIAS_CHUNK) // 8], count=pos.size, bitorder="little").astype(bool)
        vals = step[pos // bucket] * lev.read(ELIAS_CHUNK)
        np.negative(vals, out=vals, where=neg)
        yield pos, vals


def _elias_sections(codes: np.ndarray, params: dict[str, Any]) -> list[Section]:
    """INDX (Elias-gamma gaps between the non-zeros, the first from -1), VALS (their levels) and SIGN
    (their sign bits, LSB first) of the level codes ``codes``, with ``params["nnz"]`` set: two passes
    over chunks of ``codes`` (the streams' totals, then the streams), so the encode holds the codes,
    the sections and one chunk's temporaries (arrays of all the non-zeros peaked at ~7x the input)."""
    def chunks() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        last = -1
        for a, b in _chunks(codes.size, 8):
            nz = np.flatnonzero(codes[a:b] >> 1) + a
            if nz.size:
                yield np.diff(nz, prepend=last), codes[nz]
                last = int(nz[-1])

    totals = np.zeros((2, 2), np.int64)  # (values, sum of N) of the gaps and of the levels
    for gaps, c in chunks():
        totals += [bitpack.gamma_totals((gaps,)), bitpack.gamma_totals(((c >> 1).astype(np.int64),))]
    nnz = int(totals[0, 0])
    params["nnz"] = nnz
    gw, vw = (bitpack.GammaWriter(int(count), int(ones)) for count, ones in totals)
    signs = np.zeros((nnz + 7) // 8, np.uint8)
    sw = bitpack.BitStream(signs)
    for gaps, c in chunks():
        gw.put(gaps)
        vw.put((c >> 1).astype(np.int64))
        sw.put((c & 1).astype(np.uint8))
    sw.close()
    return [Section("INDX", gw.close()), Section("VALS", vw.close()), Section("SIGN", signs.tobytes())]


def _chunks(n: int, unit: int) -> list[tuple[int, int]]:
    """[a, b) ranges covering 0..n, each a multiple of ``unit`` long (but the last), about CHUNK long."""
    step = max(unit, CHUNK // unit * unit)
    return [(a, min(a + step, n)) for a in range(0, n, step)]


def _bucket_squares(x: np.ndarray, bucket: int) -> np.ndarray:
    """sum of x^2 per bucket in float64, a chunk at a time (each bucket summed exactly as one
    ``np.add.reduceat`` over the whole vector would; buckets longer than a chunk accumulate)."""
    n = x.size
    sq = np.zeros(-(-n // bucket))
    if bucket <= CHUNK:
        for a, b in _chunks(n, bucket):
            xa = x[a:b].astype(np.float64)
            sq[a // bucket: -(-b // bucket)] = np.add.reduceat(xa * xa, np.arange(0, b - a, bucket))
    else:
        for a in range(0, n, CHUNK):
            xa = x[a: a + CHUNK].astype(np.float64)
            first = a // bucket
            cuts = np.arange((first + 1) * bucket, a + xa.size, bucket) - a  # bucket starts inside
            parts = np.add.reduceat(xa * xa, np.concatenate(([0], cuts)))
            sq[first: first + parts.size] += parts
    return sq


def _levels(a: int, b: int, lev: np.ndarray, neg: np.ndarray, step: np.ndarray, bucket: int, s: int) -> np.ndarray:
    """Elements a..b-1: -+ (norm / s) * level (float64), checking the levels (canonical: no sign on a
    zero level)."""
    if lev.size and int(lev.max()) > s:
        raise FormatError(f"qsgd: a level exceeds s = {s}")
    if np.any(neg & (lev == 0)):
        raise FormatError("qsgd: a zero level carries a sign bit")  # canonical encoding
    v = _per_element(step, bucket, b - a, a) * lev
    return np.negative(v, out=v, where=neg)


def _per_element(per_bucket: np.ndarray, bucket: int, n: int, start: int = 0) -> np.ndarray:
    """The bucket values of elements start..start+n-1 (never allocates n_buckets * bucket)."""
    return per_bucket[np.arange(start, start + n) // bucket] if n else np.zeros(0)


def _variance(x: np.ndarray, scale: np.ndarray, s: int, bucket: int) -> float:
    """Exact E||Q(v) - v||^2 = sum (norm/s)^2 (r - l)(l + 1 - r), r = s |v_i| / norm (chunked)."""
    total = 0.0
    for a, b in _chunks(x.size, bucket):
        step = _per_element(scale / s, bucket, b - a, a)
        r = np.divide(np.abs(x[a:b]), step, out=np.zeros(b - a), where=step > 0)
        frac = r - np.floor(r)
        total += float(np.sum(step * step * frac * (1.0 - frac)))
    return total
