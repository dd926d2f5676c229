"""TernGrad (Wen et al., NeurIPS 2017): unbiased ternary s * sign(g) * Bernoulli(|g| / s).

g is first clipped to [-c sigma, c sigma] (c = ``clip``, default 2.5 as in the paper; 0 disables
clipping), then s = max |g| (one float32, rounded up so |g| / s <= 1).  Unbiased for the clipped
vector (exactly unbiased when nothing is clipped).  Trits are packed 2 bits each (``packing="2bit"``,
default) or 5 per byte (``"base3"``, 1.6 bits).  Layout: spec/codecs.md "terngrad".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import numpy as np

from mucsc.codec import kernels
from mucsc.codec.wire import bitpack
from mucsc.codec.codecs.base import (F32_MAX, Codec, EncodedGroup, PaperSetup, Section, array_from, param, param_float,
                              joined, param_str, register, section)
from mucsc.codec.codecs.qsgd import round_up_f32
from mucsc.errors import FormatError, ParameterError

_POW3 = np.array([1, 3, 9, 27, 81], np.int64)
_BASE3_TABLE = (np.arange(243)[:, None] // _POW3[None, :]) % 3  # byte -> its 5 trits


CHUNK = 5 << 16  # elements per chunk of the encoder's temporaries and the decoder's (a multiple of 20: whole base-3 and 2-bit bytes)


def clip_sigma(x: np.ndarray, clip: float) -> np.ndarray:
    """x clipped to [-clip * std(x), clip * std(x)] (TernGrad's gradient clipping); clip 0: unchanged."""
    c = clip_bound(x, clip)
    return x if c is None else np.clip(x, -c, c)


def clip_bound(x: np.ndarray, clip: float) -> float | None:
    """clip * std(x) in float64 (None: no clipping).  np.std for inputs up to a chunk (the reference
    value); larger ones in two chunked passes (mean, then squared deviations), never a full copy."""
    if clip == 0 or x.size == 0:
        return None
    if x.size <= CHUNK:
        return clip * float(np.std(x, dtype=np.float64))
    mean = sum(float(x[a: a + CHUNK].sum(dtype=np.float64)) for a in range(0, x.size, CHUNK)) / x.size
    ss = 0.0
    for a in range(0, x.size, CHUNK):
        d = x[a: a + CHUNK].astype(np.float64) - mean
        ss += kernels.dot(d, d)
    return clip * float(np.sqrt(ss / x.size))


@register
class TernGrad(Codec):
    name = "terngrad"
    unbiased = True  # for the clipped vector; exactly so with clip=0
    summary = "TernGrad: unbiased ternary with 2.5-sigma clipping (Wen et al. 2017)"
    limits = {"clip": (0.0, 1e6)}  # 0: no clipping
    paper_setup = PaperSetup(downlink=False)  # not in the paper's experiments; uplink only, as QSGD
    input_limit = F32_MAX  # s = max |g| rounded up to float32

    @dataclasses.dataclass(frozen=True)
    class Params:
        clip: float = param(2.5, "Gradient clipping at this many standard deviations (0: off)", min=0, max=1e6)
        packing: Literal["2bit", "base3"] = param("2bit", "Ternary packing: 2 bits per element, or 5 per byte (base 3)")

        def __post_init__(self) -> None:
            if not (self.clip == 0 or 0 < self.clip <= 1e6):
                raise ParameterError(f"terngrad.clip must be 0 (off) or positive, got {self.clip}")
            if self.packing not in ("2bit", "base3"):
                raise ParameterError(f"terngrad.packing must be '2bit' or 'base3', got {self.packing!r}")

    def section_sizes(self, n: int, *, positions_bytes: int | None = None, centroids: int | None = None,
                      estimate: bool = False) -> dict[str, int]:
        trits = bitpack.packed_size(n, 2) if self.params.packing == "2bit" else -(-n // 5)
        return {"SCAL": 4, "VALS": trits}

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        n = x.size
        c = clip_bound(x, self.params.clip)
        # max |clip(x)| = min(max |x|, c): the scale without a clipped copy of x
        top = max(abs(float(x.max())), abs(float(x.min()))) if n else 0.0
        s = round_up_f32(top if c is None else min(top, c)) if n else np.float32(0)
        sf = float(s)
        # one trit per element, a chunk at a time (float64 temporaries of one chunk); the uniforms are
        # drawn in order, so the stream is the same as one draw of n
        trits = np.empty(n, np.uint8)  # 0: 0, 1: +s, 2: -s
        for a, g in _clipped_chunks(x, c):
            p = np.abs(g) / sf if sf > 0 else np.zeros(g.size)
            b = rng.random(g.size) < p
            t = trits[a: a + g.size]
            t[:] = 0
            t[b] = np.where(np.signbit(g[b]), 2, 1)
        if self.params.packing == "base3":
            data = b"".join(pack_trits(trits[a: a + CHUNK]) for a in range(0, n, CHUNK))
        else:
            data = bitpack.pack(trits, 2)
        del trits
        secs = (Section("SCAL", np.array([s], "<f4").tobytes()), Section("VALS", data, compressible=True))

        def sq_error() -> float:  # E||Q(g) - x||^2 = sum s|g| - g^2 (variance) + (g - x)^2 (clipping)
            total = 0.0
            for a, g in _clipped_chunks(x, c):
                ag = np.abs(g)
                total += float(np.sum(sf * ag - ag * ag) + np.sum((g - x[a: a + g.size]) ** 2))
            return total
        return EncodedGroup({"packing": self.params.packing, "clip": self.params.clip}, secs, {"J": sq_error})

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        return joined(n, dtype, cls.decode_parts(n, params, sections, dtype))

    @classmethod
    def decode_parts(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> Iterator[np.ndarray]:
        packing = param_str(params, "packing", ("2bit", "base3"))
        if param_float(params, "clip") < 0:  # informative (how the encoder clipped), but well-formed
            raise FormatError("terngrad: header parameter 'clip' must be >= 0")
        s = float(array_from(section(sections, "SCAL", 4), "<f4")[0])
        if not np.isfinite(s) or s < 0:
            raise FormatError("terngrad: the scale must be finite and non-negative")
        base3 = packing == "base3"
        vals = section(sections, "VALS", -(-n // 5) if base3 else bitpack.packed_size(n, 2))
        lut = np.array([0.0, s, -s], dtype)
        for a in range(0, n, CHUNK):  # whole bytes of either packing a chunk (CHUNK: a multiple of 20)
            b = min(a + CHUNK, n)
            if base3:
                trits = unpack_trits(vals[a // 5: -(-b // 5)], b - a)
            else:
                trits = bitpack.unpack(vals[a // 4: bitpack.packed_size(b, 2)], 2, b - a)
                if np.any(trits == 3):
                    raise FormatError("terngrad: trit code 3 is invalid")
            yield lut[trits]


def _clipped_chunks(x: np.ndarray, c: float | None):
    """(start, x[start:start+CHUNK] in float64, clipped to [-c, c] when c is not None) over x."""
    for a in range(0, x.size, CHUNK):
        g = x[a: a + CHUNK].astype(np.float64)
        yield a, (g if c is None else np.clip(g, -c, c, out=g))


def pack_trits(t: np.ndarray) -> bytes:
    """5 trits per byte: byte = t0 + 3 t1 + 9 t2 + 27 t3 + 81 t4 (<= 242); missing trits are 0."""
    n = t.size
    pad = np.zeros(-(-n // 5) * 5, np.int64)
    pad[:n] = t
    return (pad.reshape(-1, 5) @ _POW3).astype(np.uint8).tobytes()


def unpack_trits(buf: memoryview, n: int) -> np.ndarray:
    """Inverse of :func:`pack_trits`; bytes above 242 and non-zero padding trits are rejected."""
    b = np.frombuffer(buf, np.uint8)
    if b.size and int(b.max()) > 242:
        raise FormatError("terngrad: a base-3 byte exceeds 242")
    t = _BASE3_TABLE[b].reshape(-1).astype(np.uint8)
    if np.any(t[n:]):
        raise FormatError("terngrad: padding trits are not zero")
    return t[:n]
