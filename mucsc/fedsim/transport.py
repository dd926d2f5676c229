"""Where model updates become bytes and back: the only module of the simulator that calls the codec.

Every update crosses the public API (``mucsc.encode`` / ``mucsc.decode``) as one message whose
length is what the simulator counts.  Biased codecs keep the part they did not send (error
feedback, section IV-E baselines): ``residual += update; send C(residual); residual -= sent``.
That minimal residual accumulation lives here until the codec package's stateful wrapper
(``mucsc.codec.state``) is available; :class:`Sender` is the one place to switch.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

import mucsc
from mucsc.codec.base import codec_class


@dataclasses.dataclass(frozen=True)
class LinkCodec:
    """A codec and its parameters for one direction of one endpoint."""

    codec: str
    params: tuple[tuple[str, Any], ...] = ()
    error_feedback: bool | None = None  # None: on for biased (lossy, not unbiased) codecs
    compress: str = "auto"              # container zstd of compressible sections ("off": fixed width)

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(self.params)

    def uses_error_feedback(self) -> bool:
        if self.error_feedback is not None:
            return self.error_feedback
        return is_biased(self.codec)

    def label(self) -> str:
        args = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.codec}({args})" if args else self.codec


# Exact for the float32 updates the simulator sends, though the registry does not flag it lossless.
_EXACT_FOR_FLOAT32 = frozenset({"none"})


def is_biased(codec: str) -> bool:
    """True when decode(encode(x)) is not an unbiased estimate of x (and the codec is lossy)."""
    if codec in _EXACT_FOR_FLOAT32:
        return False
    cls = codec_class(codec)
    return not (cls.unbiased or cls.lossless)


def check_codec(link: LinkCodec) -> None:
    """Fail early (UnknownCodecError / ParameterError) on a bad codec name or parameter."""
    mucsc.get_codec(link.codec, **link.kwargs)


class Sender:
    """One endpoint's encoder for one direction, with its error-feedback residual when enabled."""

    def __init__(self, link: LinkCodec) -> None:
        self.link = link
        self.error_feedback = link.uses_error_feedback()
        self.residual: dict[str, np.ndarray] | None = None

    def send(self, update: Mapping[str, np.ndarray], seed: int) -> tuple[bytes, float]:
        """Encode ``update`` (name -> float32 array) -> (message bytes, encode wall seconds).

        With error feedback the residual is added before encoding and what was sent (decoded from
        the same bytes) is subtracted after; that decode is part of the sender's encode cost.
        """
        t0 = time.perf_counter()
        if self.error_feedback:
            if self.residual is None:
                self.residual = {k: np.zeros_like(v) for k, v in update.items()}
            for k, v in update.items():
                self.residual[k] += v
            payload = self.residual
        else:
            payload = update
        blob = mucsc.encode(payload, codec=self.link.codec, seed=seed, shared=True,
                            compress=self.link.compress, **self.link.kwargs)
        if self.error_feedback:
            sent = mucsc.decode(blob)
            for k in self.residual:
                self.residual[k] -= sent[k]
        return blob, time.perf_counter() - t0


def receive(blob: bytes) -> tuple[dict[str, np.ndarray], float]:
    """Decode a message -> (name -> array, decode wall seconds)."""
    t0 = time.perf_counter()
    out = mucsc.decode(blob)
    return out, time.perf_counter() - t0
