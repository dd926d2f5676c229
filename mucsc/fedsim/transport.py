"""Where model updates become bytes and back: the only module of the simulator that calls the codec.

Every update crosses the public API as one message whose length is what the simulator counts.
Encoding goes through :class:`mucsc.Compressor`, which keeps the codec's error-feedback memory
(a residual for biased codecs; DGC's momentum correction, masking, clipping and warm-up are DGC's
memory).  Decoding is ``mucsc.decode``; the server sums the uplink with ``mucsc.Aggregator``.  With ``mucsc sim --auth`` every message also carries an
authentication tag (:class:`Authenticator`) that the receiver checks before decoding.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

import mucsc


@dataclasses.dataclass(frozen=True)
class LinkCodec:
    """A codec and its parameters for one direction of one endpoint.

    ``params`` hold the codec's parameters and the options of its error-feedback memory (the codec
    class's ``memory_options``, e.g. DGC's momentum), told apart by the codec class.
    """

    codec: str
    params: tuple[tuple[str, Any], ...] = ()
    error_feedback: bool | None = None  # None: on for biased (lossy, not unbiased) codecs
    compress: str = "auto"              # container zstd of compressible sections ("off": fixed width)

    @property
    def kwargs(self) -> dict[str, Any]:
        """Codec parameters (the memory's options removed)."""
        options = mucsc.codec_class(self.codec).memory_options
        return {k: v for k, v in self.params if k not in options}

    @property
    def memory_options(self) -> dict[str, Any]:
        options = mucsc.codec_class(self.codec).memory_options
        return {k: v for k, v in self.params if k in options}

    def settings(self) -> mucsc.Settings:
        """This link as :class:`mucsc.Settings` (validated: a :class:`mucsc.SettingsError` when bad)."""
        return mucsc.Settings(self.codec, self.params, compress=self.compress, error_feedback=self.error_feedback)

    def codec_object(self) -> mucsc.Codec:
        """The codec (UnknownCodecError / ParameterError on a bad name or parameter)."""
        return mucsc.get_codec(self.codec, **self.kwargs)

    def uses_error_feedback(self) -> bool:
        if self.error_feedback is not None:
            return self.error_feedback
        return self.codec_object().biased

    def label(self) -> str:
        args = ",".join(f"{k}={v}" for k, v in self.params)
        return f"{self.codec}({args})" if args else self.codec


def check_codec(link: LinkCodec) -> None:
    """Fail early (UnknownCodecError / ParameterError) on a bad codec name, parameter or option."""
    Sender(link)


class Sender:
    """One endpoint's encoder for one direction, with its error-feedback state."""

    def __init__(self, link: LinkCodec) -> None:
        self.link = link
        self._compressor = mucsc.Compressor(link.settings())
        self.error_feedback = self._compressor.error_feedback

    def send(self, update: Mapping[str, np.ndarray], seed: int, rnd: int = 0) -> tuple[bytes, float]:
        """Encode ``update`` (name -> float32 array) in global round ``rnd`` -> (bytes, encode seconds).

        Error feedback decodes the message to learn what was sent; that decode is part of the
        sender's encode cost.  A memory's schedule (DGC's warm-up) follows the global round.
        """
        t0 = time.perf_counter()
        blob = self._compressor.compress(update, seed, epoch=rnd)
        return blob, time.perf_counter() - t0

    @property
    def residual(self) -> dict[str, np.ndarray] | None:
        """What error feedback still owes the receiver (DGC: its accumulated v), or None."""
        return self._compressor.residual if self.error_feedback else None


class Authenticator:
    """``mucsc sim --auth``: every endpoint (``client-<i>``, ``server``) has its own key; each message
    is tagged by its sender and verified by its receiver against the sender's key only, with a context
    binding the run, the round and the direction (so a message replayed elsewhere fails).

    Keys are derived from the run seed so that runs are reproducible -- simulation keys, not secrets.
    """

    def __init__(self, algorithm: str, seed: int, run_id: str) -> None:
        self.algorithm, self.seed, self.run_id = algorithm, seed, run_id
        self._keys: dict[str, object] = {}

    def key(self, endpoint: str) -> object:
        if endpoint not in self._keys:
            material = hashlib.blake2b(f"mucsc-sim-key/{self.seed}/{endpoint}".encode(), digest_size=32).digest()
            self._keys[endpoint] = mucsc.generate_key(self.algorithm, seed=material)
        return self._keys[endpoint]

    def context(self, rnd: int, direction: str) -> bytes:
        return f"mucsc-sim/{self.run_id}/round-{rnd}/{direction}".encode()

    def seal(self, blob: bytes, endpoint: str, rnd: int, direction: str) -> Sealed:
        """``endpoint`` tags its message for round ``rnd`` and ``direction`` ("up" or "down")."""
        t0 = time.perf_counter()
        ctx = self.context(rnd, direction)
        out = mucsc.sign(blob, self.key(endpoint), endpoint, ctx)
        # the receiver accepts only this endpoint's tag, in this round and direction
        check = {"keys": {endpoint: mucsc.public_key(self.key(endpoint))}, "context": ctx}
        return Sealed(out, time.perf_counter() - t0, len(out) - len(blob), check)


@dataclasses.dataclass(frozen=True)
class Sealed:
    """A message as sent: its bytes, the seconds and bytes its tag added, and the receiver's check."""

    blob: bytes
    seconds: float = 0.0
    added_bytes: int = 0
    check: Mapping[str, object] = dataclasses.field(default_factory=dict)


def seal(auth: Authenticator | None, blob: bytes, endpoint: str, rnd: int, direction: str) -> Sealed:
    """``auth.seal(...)``, or the message unchanged when the run is not authenticated."""
    return Sealed(blob) if auth is None else auth.seal(blob, endpoint, rnd, direction)


def receive(blob: bytes, device: Any = None, **auth: object) -> tuple[dict[str, Any], float]:
    """Decode a message (verifying its tag when given ``keys``/``context``) -> (name -> array, seconds).

    ``device`` (a torch device): the values come back as tensors there, unpacked and gathered on it
    by codecs with a torch decoder; the seconds then include waiting for the device."""
    t0 = time.perf_counter()
    if device is None:
        out = mucsc.decode(blob, **auth)
    else:
        out = mucsc.decode(blob, as_torch=True, device=device, **auth)
        if getattr(device, "type", "cpu") == "cuda":
            import torch  # a device was given, so the caller runs torch

            torch.cuda.synchronize(device)
    return out, time.perf_counter() - t0



class ServerSum:
    """The server's running sum of a round's uplink messages (:class:`mucsc.Aggregator`: O(d) memory
    whatever the number of clients): sum_i q_i U~_i in float64, in the order the messages are added."""

    def __init__(self) -> None:
        self._agg = mucsc.Aggregator()

    def add(self, blob: bytes, weight: float, **auth: object) -> float:
        """Add ``weight`` times a message (verifying its tag when given ``keys``/``context``, as
        :func:`receive`) -> seconds."""
        t0 = time.perf_counter()
        self._agg.add(blob, weight=weight, **auth)
        return time.perf_counter() - t0

    def total(self) -> dict[str, np.ndarray]:
        """The weighted sum (the weights are normalised: no division), name -> float32 array."""
        return self._agg.weighted_sum()
