"""SignSGD (Bernstein et al., ICML 2018): one sign bit per element, with an optional shared scale.

``scale="l1"`` (default) decodes to ||U||_1 / d * sign(U) (the scaled sign of EF-SignSGD, Karimireddy
et al. 2019: the best single magnitude in l2 for a sign vector); ``scale="none"`` decodes to pure
+-1.  Zero elements are sent as +.  Biased: use it with error feedback (mucsc.codec.api.state).  The
server-side aggregation of the paper's SSGD is :func:`majority_vote`.  Layout: spec/codecs.md "signsgd".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal

import numpy as np

from mucsc.codec.backends.dispatch import HOST, backend_for, backend_on
from mucsc.codec.codecs.base import (F32_MAX, Codec, EncodedGroup, Section, array_from, param, param_str, register,
                              joined, section)
from mucsc.codec.wire.bitpack import check_padding
from mucsc.errors import FormatError, ParameterError

CHUNK = 1 << 20  # host decode: elements per piece (a multiple of 8: pieces start on whole bytes)


@register
class SignSGD(Codec):
    name = "signsgd"
    summary = "signSGD: 1 bit per element, scaled by ||U||_1/d (Bernstein et al. 2018)"
    input_limit = F32_MAX  # the scale (float32) is a mean of magnitudes
    accepts_device = True  # signs packed and the scale summed (in numpy's order) on the tensor's device

    @dataclasses.dataclass(frozen=True)
    class Params:
        scale: Literal["l1", "none"] = param("l1", "Magnitude sent with the signs: l1 (mean |x|, scaled signSGD) "
                                             "or none (plain signs)")

        def __post_init__(self) -> None:
            if self.scale not in ("l1", "none"):
                raise ParameterError(f"signsgd.scale must be 'l1' or 'none', got {self.scale!r}")

    def section_sizes(self, n: int, *, positions_bytes: int | None = None, centroids: int | None = None,
                      estimate: bool = False) -> dict[str, int]:
        return {"SIGN": (n + 7) // 8, **({"SCAL": 4} if self.params.scale == "l1" else {})}

    def encode_array(self, x: np.ndarray, rng: np.random.Generator) -> EncodedGroup:
        be = backend_for(x)  # the signs packed and the scale summed (in numpy's order) where x lives
        x = be.vector(x)
        n = be.size(x)
        neg = be.negative(x)  # -0.0 is sent as +
        # compressible: updates with many zeros (sent as +) give long runs of 0 bits
        secs = [Section("SIGN", be.pack_bits(neg), compressible=True)]
        if self.params.scale == "l1":
            mag = np.float32(be.sum64(be.abs(x)) / n) if n else np.float32(0)
            secs.append(Section("SCAL", np.array([mag], "<f4").tobytes()))
        else:
            mag = np.float32(1)
        stats = {"J": lambda: be.sq_error(be.signed(neg, mag), x)}
        return EncodedGroup({"scale": self.params.scale}, tuple(secs), stats)

    @classmethod
    def decode_on_device(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                         dtype: np.dtype, device) -> Any:
        """:meth:`decode_array` on ``device``: the sign bits are copied over (once) and expanded there."""
        bits, mag = cls._signs_and_scale(n, params, sections)
        return backend_on(device).expand_signs(bits, n, mag, dtype, device)

    @classmethod
    def _signs_and_scale(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview]):
        """The checked SIGN bytes and the scale (FormatError on a malformed section)."""
        scale = param_str(params, "scale", ("l1", "none"))
        bits = np.frombuffer(section(sections, "SIGN", (n + 7) // 8), np.uint8)
        check_padding(bits, n, "signsgd signs")
        if scale == "l1":
            mag = float(array_from(section(sections, "SCAL", 4), "<f4")[0])
            if not np.isfinite(mag) or mag < 0:
                raise FormatError("signsgd: the scale must be finite and non-negative")
        else:
            mag = 1.0
        return bits, mag

    @classmethod
    def decode_array(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> np.ndarray:
        return joined(n, dtype, cls.decode_parts(n, params, sections, dtype))

    @classmethod
    def decode_parts(cls, n: int, params: Mapping[str, Any], sections: Mapping[str, memoryview],
                     dtype: np.dtype) -> Iterator[np.ndarray]:
        bits, mag = cls._signs_and_scale(n, params, sections)
        for a in range(0, n, CHUNK):  # one chunk's sign bytes expanded at a time: a fixed scratch
            b = min(a + CHUNK, n)
            yield HOST.expand_signs(bits[a // 8: -(-b // 8)], b - a, mag, dtype)


def majority_vote(updates: Iterable[np.ndarray]) -> np.ndarray:
    """Server-side aggregation of signSGD with majority vote: sign(sum_i sign(u_i)).

    Each client's decoded update contributes one vote per element (its sign; the scale is ignored);
    the result is +1, -1, or 0 on a tie.  Multiply by the server's step size before applying.
    """
    total = None
    for u in updates:
        s = np.sign(np.asarray(u, np.float64)).astype(np.int64)
        total = s if total is None else total + s
    if total is None:
        raise ValueError("majority_vote needs at least one update")
    return np.sign(total).astype(np.float32)
