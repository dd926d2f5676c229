"""Stateful compression kept by a sender between rounds: a codec plus its error-feedback memory.

:class:`Compressor` encodes one update per round with a codec and drives the codec's
:class:`~mucsc.codec.codecs.memory.Memory` (GRACE's Compressor/Memory split): the vector encoded is
``memory.compensate(input)``, and the memory then learns from what the receiver decodes.  Biased
codecs get a residual (EF-SGD, EF-SignSGD, STC's A += dW; A -= T(A)) by default; DGC's memory is
its momentum correction, masking, clipping and warm-up (:mod:`mucsc.codec.codecs.dgc`).

Everything goes through the public API (:func:`mucsc.encode` / :func:`mucsc.decode`), so what the
memory subtracts is exactly what the receiver reconstructs from the bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mucsc.codec import kernels, parallel
from mucsc.codec.backends.tensors import is_torch_tensor
from mucsc.codec.api.messages import decode, encode, encode_decoded
from mucsc.codec.api.settings import Settings
from mucsc.codec.codecs.base import Codec
from mucsc.codec.codecs.memory import Memory
from mucsc.errors import MucscError, ParameterError, SettingsError


def _to_array(t: Any) -> Any:
    """A numpy array from an array or a torch tensor (bfloat16 widened to float32), without importing
    torch.  A float tensor the torch backend encodes where it lives (on a GPU, or any tensor with
    ``MUCSC_BACKEND=torch``) stays a tensor there, so the memory's state stays on its device too."""
    if is_torch_tensor(t):
        t = t.detach()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        if t.is_floating_point() and (t.device.type != "cpu" or kernels.TORCH):
            return t
        return t.cpu().numpy()
    return np.asarray(t)


def _split(update: Any) -> tuple[dict[str, Any], bool]:
    """(tensors by name, was it a mapping); a bare array is the single tensor named ""."""
    if isinstance(update, Mapping):
        return {str(k): _to_array(v) for k, v in update.items()}, True
    return {"": _to_array(update)}, False


def _is_float(a: Any) -> bool:
    return a.is_floating_point() if is_torch_tensor(a) else a.dtype.kind == "f"


def _device(tensors: Mapping[str, Any]) -> Any:
    """The device of the first tensor kept on one (None: all on the host)."""
    return next((a.device for a in tensors.values() if is_torch_tensor(a)), None)


def _round_seed(seed: int, rounds: int) -> int:
    """A distinct, reproducible encoder seed per round."""
    return int(np.random.SeedSequence([seed, rounds]).generate_state(1, np.uint32)[0])


class Compressor:
    """Encode one update per round with ``codec`` (a name or a :class:`~mucsc.Codec`), keeping the
    codec's error-feedback memory if enabled.

    ``error_feedback=None`` enables it for biased codecs (``codec.biased``); ``memory`` gives a
    memory explicitly.  ``params`` are the codec's parameters (when ``codec`` is a name) and the
    options of its memory (``codec.memory_options``, e.g. DGC's ``momentum``).  ``seed`` seeds round
    r's encoding as ``SeedSequence([seed, r])`` unless ``compress`` is given an explicit ``seed``.
    ``shared``, ``compress`` and ``threads`` are passed to :func:`mucsc.encode` (``threads`` also to
    the memory's :func:`mucsc.decode`; bytes never depend on it).  ``codec`` may be a
    :class:`mucsc.Settings` holding all of these; bad settings raise :class:`mucsc.SettingsError`.
    """

    def __init__(self, codec: str | Codec | Settings, *, error_feedback: bool | None = None,
                 memory: Memory | None = None, seed: int = 0, shared: bool = True, compress: str | int = "auto",
                 threads: int = 1, **params: Any) -> None:
        if isinstance(codec, Settings):
            if params or (error_feedback, seed, shared, compress, threads) != (None, 0, True, "auto", 1):
                raise SettingsError("Compressor(settings): the codec, its parameters, error feedback, seed, shared, "
                                    "compress and threads come from the Settings; change them there")
            settings = codec
        else:
            if isinstance(codec, Codec):  # only the memory's options may come next to a codec object
                try:
                    codec.memory(**params)
                except MucscError as exc:
                    raise SettingsError(str(exc)) from None
                params = {**codec.get_config(), **params}
                codec = params.pop("codec")
            # every setting checked now (SettingsError), not at the first round
            settings = Settings(codec, params, seed=seed, compress=compress, shared=shared, threads=threads,
                                error_feedback=error_feedback)
        self.settings = settings
        self.threads = parallel.resolve(settings.threads)
        self.codec: Codec = settings.codec_object()
        own = self.codec.memory(**settings.memory_options)
        ef = settings.error_feedback
        self.error_feedback = self.codec.biased if ef is None else bool(ef)
        if memory is not None:
            self.error_feedback = True
        self.memory: Memory = memory if memory is not None else own if self.error_feedback else Memory()
        self.seed = int(settings.seed)
        self.shared = settings.shared
        self.compress_mode = settings.compress
        self.rounds = 0

    @property
    def residual(self) -> dict[str, np.ndarray]:
        """What error feedback still owes the receiver, per tensor name (empty without feedback)."""
        return self.memory.residual

    def compress(self, update: Any, seed: int | None = None, *, epoch: int | None = None) -> bytes:
        """The message for this round's ``update`` (an array or a mapping of arrays/tensors).

        ``epoch`` is the step a memory's schedule follows (DGC's warm-up); default: the round count.
        """
        return self._compress(update, seed, epoch, want_decoded=False)[0]

    def compress_decoded(self, update: Any, seed: int | None = None, *,
                         epoch: int | None = None) -> tuple[bytes, Any]:
        """:meth:`compress` (the same message, the same state afterwards) and what every receiver
        decodes from it, bit for bit ``decode(message)`` without limits: numpy arrays, or torch
        tensors on the device an error-feedback memory lives on.  Without error feedback it is read
        from the encoder's lookup where the codec kept one
        (:func:`~mucsc.codec.api.messages.encode_decoded`), else decoded; with it, it is the decode
        the memory learns from (no second decode).  For a sender that averages its own message with
        others' (the DDP hook)."""
        return self._compress(update, seed, epoch, want_decoded=True)

    def _compress(self, update: Any, seed: int | None, epoch: int | None, want_decoded: bool) -> tuple[bytes, Any]:
        s = _round_seed(self.seed, self.rounds) if seed is None else seed
        codec = self.memory.codec_for(self.codec, self.rounds if epoch is None else int(epoch))
        how = {"seed": s, "shared": self.shared, "compress": self.compress_mode, "threads": self.threads}
        out = None
        if not self.memory.stateful:
            if want_decoded:
                blob, out = encode_decoded(update, codec, **how)
            else:
                blob = encode(update, codec, **how)
        else:
            tensors, is_map = _split(update)
            sent = {n: self.memory.compensate(n, a) if _is_float(a) else a for n, a in tensors.items()}
            blob = encode(sent if is_map else sent[""], codec, **how)
            dev = _device(sent)  # received where the state lives
            # our own message, just encoded: no limits for untrusted input (a frozen model's zero
            # update is a tiny message that decodes to the whole model)
            out = decode(blob, threads=self.threads, as_torch=dev is not None, device=dev, max_elements=None,
                         max_expansion=None)
            received = out if is_map else {"": out}
            for name, a in sent.items():
                if _is_float(a):
                    self.memory.update(name, a, received[name])
        self.rounds += 1
        return blob, out

    def reset(self) -> None:
        """Forget the error-feedback state (e.g. when the model is re-initialised)."""
        self.memory.reset()

    def state_dict(self) -> dict[str, Any]:
        """The state to persist between rounds: the round count and the memory's arrays."""
        return {"rounds": self.rounds, "memory": self.memory.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output (the codec and options are the constructor's)."""
        rounds = state.get("rounds") if isinstance(state, Mapping) else None
        if isinstance(rounds, bool) or not isinstance(rounds, (int, np.integer)) or rounds < 0:
            raise ParameterError(f"Compressor state needs a non-negative 'rounds', got {rounds!r}")
        self.memory.load_state_dict(state.get("memory", {}))
        self.rounds = int(rounds)
