"""Where model updates become bytes and back: the only module of the simulator that calls the codec.

Every update crosses the public API as one message whose length is what the simulator counts.
Encoding goes through the codec package's stateful wrappers (:mod:`mucsc.codec.state`):
``Compressor`` keeps the error-feedback residual of biased codecs (``residual += update; send
C(residual); residual -= sent``), ``DGCCompressor`` adds DGC's momentum correction, masking, clipping
and sparsity warm-up.  Decoding is ``mucsc.decode``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

import mucsc
from mucsc.codec.base import codec_class
from mucsc.codec.state import DGC_WARMUP, Compressor, DGCCompressor

# DGC's stateful options (not codec parameters): momentum, clip_norm, warmup_period (in rounds).
DGC_STATE_KEYS = ("momentum", "clip_norm", "warmup_period")


@dataclasses.dataclass(frozen=True)
class LinkCodec:
    """A codec and its parameters for one direction of one endpoint."""

    codec: str
    params: tuple[tuple[str, Any], ...] = ()
    error_feedback: bool | None = None  # None: on for biased (lossy, not unbiased) codecs
    compress: str = "auto"              # container zstd of compressible sections ("off": fixed width)

    @property
    def kwargs(self) -> dict[str, Any]:
        """Codec parameters (DGC's state options removed)."""
        return {k: v for k, v in self.params if not (self.codec == "dgc" and k in DGC_STATE_KEYS)}

    @property
    def dgc_state(self) -> dict[str, Any]:
        return {k: v for k, v in self.params if self.codec == "dgc" and k in DGC_STATE_KEYS}

    def uses_error_feedback(self) -> bool:
        if self.error_feedback is not None:
            return self.error_feedback
        return is_biased(self.codec)

    def label(self) -> str:
        args = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.codec}({args})" if args else self.codec


def is_biased(codec: str) -> bool:
    """True when decode(encode(x)) is not an unbiased estimate of x (and the codec is lossy)."""
    cls = codec_class(codec)
    return not (cls.unbiased or cls.lossless)


def check_codec(link: LinkCodec) -> None:
    """Fail early (UnknownCodecError / ParameterError) on a bad codec name or parameter."""
    mucsc.get_codec(link.codec, **link.kwargs)
    Sender(link)  # the stateful wrapper validates its own options


class Sender:
    """One endpoint's encoder for one direction, with its state (error feedback, DGC momentum)."""

    def __init__(self, link: LinkCodec) -> None:
        self.link = link
        self.error_feedback = link.uses_error_feedback()
        self._dgc = self._compressor = None
        if link.codec == "dgc" and self.error_feedback:
            st = link.dgc_state
            self._dgc = DGCCompressor(momentum=st.get("momentum", 0.9), clip_norm=st.get("clip_norm"),
                                      warmup=DGC_WARMUP, warmup_period=int(st.get("warmup_period", 1)),
                                      compress=link.compress, **link.kwargs)
        else:
            self._compressor = Compressor(link.codec, error_feedback=self.error_feedback,
                                          compress=link.compress, **link.kwargs)

    def send(self, update: Mapping[str, np.ndarray], seed: int, rnd: int = 0) -> tuple[bytes, float]:
        """Encode ``update`` (name -> float32 array) in global round ``rnd`` -> (bytes, encode seconds).

        Error feedback decodes the message to learn what was sent; that decode is part of the
        sender's encode cost.  DGC's warm-up stage follows the global round.
        """
        t0 = time.perf_counter()
        if self._dgc is not None:
            blob = self._dgc.compress(update, seed, epoch=rnd)
        else:
            blob = self._compressor.compress(update, seed)
        return blob, time.perf_counter() - t0

    @property
    def residual(self) -> dict[str, np.ndarray] | None:
        """What error feedback still owes the receiver (DGC: its accumulated v), or None."""
        if self._dgc is not None:
            return self._dgc.v
        return self._compressor.residual if self.error_feedback else None


def receive(blob: bytes) -> tuple[dict[str, np.ndarray], float]:
    """Decode a message -> (name -> array, decode wall seconds)."""
    t0 = time.perf_counter()
    out = mucsc.decode(blob)
    return out, time.perf_counter() - t0
