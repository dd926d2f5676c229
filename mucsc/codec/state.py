"""Stateful compression kept by a client or server between rounds, on top of the stateless codecs.

- :class:`Compressor`: any codec, optionally with error feedback (residual accumulation, as EF-SGD,
  EF-SignSGD and STC's A += dW; A -= T(A)): the vector encoded is input + residual, and the new
  residual is that minus what the receiver decodes, per tensor name.  On by default for biased codecs.
- :class:`DGCCompressor`: Deep Gradient Compression's client side (Lin et al., ICLR 2018): local
  gradient clipping, momentum correction (u = m u + g; v += u), top-k of v, momentum-factor masking
  (u and v zeroed where sent) and the exponential sparsity warm-up.

Both go through the public API only (:func:`mucsc.encode` / :func:`mucsc.decode`), so what the state
subtracts is exactly what the receiver reconstructs from the bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from mucsc.codec import parallel
from mucsc.codec.api import decode, encode
from mucsc.codec.base import codec_class, get_codec
from mucsc.errors import InputError, ParameterError

DGC_WARMUP = (0.25, 0.0625, 0.015625, 0.004, 0.001)  # sparsity 75%, 93.75%, 98.4%, 99.6%, 99.9%


def _to_numpy(t: Any) -> np.ndarray:
    """A numpy array from an array or a torch tensor (bfloat16 widened to float32), without importing torch."""
    if hasattr(t, "detach") and hasattr(t, "cpu"):
        t = t.detach().cpu()
        if str(t.dtype) == "torch.bfloat16":
            t = t.float()
        return t.numpy()
    return np.asarray(t)


def _split(update: Any) -> tuple[dict[str, np.ndarray], bool]:
    """(tensors by name, was it a mapping); a bare array is the single tensor named ""."""
    if isinstance(update, Mapping):
        return {str(k): _to_numpy(v) for k, v in update.items()}, True
    return {"": _to_numpy(update)}, False


def _is_float(a: np.ndarray) -> bool:
    return a.dtype.kind == "f"


def _round_seed(seed: int, rounds: int) -> int:
    """A distinct, reproducible encoder seed per round."""
    return int(np.random.SeedSequence([seed, rounds]).generate_state(1, np.uint32)[0])


class Compressor:
    """Encode one update per round with ``codec``, keeping an error-feedback residual if enabled.

    ``error_feedback=None`` enables it for biased codecs (class ``unbiased`` and ``lossless`` both
    False).  ``seed`` seeds round r's encoding as ``SeedSequence([seed, r])`` unless ``compress`` is
    given an explicit ``seed``.  ``shared``, ``compress``, ``threads`` and ``params`` are passed to
    :func:`mucsc.encode` (``threads`` also to the residual's :func:`mucsc.decode`).
    """

    def __init__(self, codec: str, *, error_feedback: bool | None = None, seed: int = 0,
                 shared: bool = True, compress: str | int = "auto", threads: int = 1, **params: Any) -> None:
        get_codec(codec, **params)  # validates the name and parameters now, not at the first round
        self.threads = parallel.resolve(threads)
        cls = codec_class(codec)
        self.codec = codec
        self.params = dict(params)
        self.error_feedback = (not (cls.unbiased or cls.lossless)) if error_feedback is None \
            else bool(error_feedback)
        self.seed = int(seed)
        self.shared = shared
        self.compress_mode = compress
        self.rounds = 0
        self.residual: dict[str, np.ndarray] = {}

    def compress(self, update: Any, seed: int | None = None) -> bytes:
        """The message for this round's ``update`` (an array or a mapping of arrays/tensors)."""
        s = _round_seed(self.seed, self.rounds) if seed is None else seed
        if not self.error_feedback:
            blob = encode(update, self.codec, seed=s, shared=self.shared, compress=self.compress_mode,
                          threads=self.threads, **self.params)
        else:
            tensors, is_map = _split(update)
            corrected = {n: self._add_residual(n, a) for n, a in tensors.items()}
            blob = encode(corrected if is_map else corrected[""], self.codec, seed=s, shared=self.shared,
                          compress=self.compress_mode, threads=self.threads, **self.params)
            out = decode(blob, threads=self.threads)
            received = out if is_map else {"": out}
            for name, a in corrected.items():
                if _is_float(a):
                    self.residual[name] = a - received[name].astype(a.dtype, copy=False)
        self.rounds += 1
        return blob

    def _add_residual(self, name: str, a: np.ndarray) -> np.ndarray:
        r = self.residual.get(name)
        if not _is_float(a) or r is None:
            return a
        if r.shape != a.shape:
            raise InputError(f"tensor {name!r} changed shape between rounds: {r.shape} -> {a.shape}")
        return (a + r).astype(a.dtype, copy=False)

    def reset(self) -> None:
        """Forget the residual (e.g. when the model is re-initialised)."""
        self.residual.clear()


class DGCCompressor:
    """DGC's client-side state (Lin et al., ICLR 2018) around the stateless ``dgc`` codec.

    Per round, per float tensor: g is clipped to ``clip_norm`` (l2, if given), u = momentum u + g,
    v += u; the message is the top-k of v (``keep`` of the elements, or the warm-up's larger fraction
    ``warmup[stage]`` while ``stage = round // warmup_period`` (or ``epoch // warmup_period`` when
    ``compress`` is given ``epoch``) is within the schedule); then u and v are zeroed where a value
    was sent (momentum-factor masking).  ``shared=True`` selects top-k over the whole update (the
    paper's flattened vector); ``shared=False`` per tensor, as the DGC paper does per layer.
    ``threads`` is passed to :func:`mucsc.encode` and :func:`mucsc.decode` (bytes never depend on it).
    """

    def __init__(self, *, keep: float = 0.01, momentum: float = 0.9, clip_norm: float | None = None,
                 warmup: Sequence[float] = DGC_WARMUP, warmup_period: int = 1, positions: str = "auto",
                 seed: int = 0, shared: bool = True, compress: str | int = "auto", threads: int = 1) -> None:
        get_codec("dgc", keep=keep, positions=positions)
        self.threads = parallel.resolve(threads)
        if not 0.0 <= momentum < 1.0:
            raise ParameterError(f"momentum must be in [0, 1), got {momentum}")
        if clip_norm is not None and not clip_norm > 0:
            raise ParameterError(f"clip_norm must be positive or None, got {clip_norm}")
        if warmup_period < 1 or any(not 0.0 < w <= 1.0 for w in warmup):
            raise ParameterError("warmup fractions must be in (0, 1] and warmup_period >= 1")
        self.keep, self.momentum, self.clip_norm = keep, momentum, clip_norm
        self.warmup, self.warmup_period = tuple(warmup), int(warmup_period)
        self.positions, self.seed, self.shared = positions, int(seed), shared
        self.compress_mode = compress
        self.rounds = 0
        self.u: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}

    def keep_at(self, stage: int) -> float:
        """The fraction sent at warm-up stage ``stage``: max(warmup[stage], keep), then ``keep``."""
        return max(self.warmup[stage], self.keep) if stage < len(self.warmup) else self.keep

    def compress(self, grad: Any, seed: int | None = None, *, epoch: int | None = None) -> bytes:
        """The message for this round's gradient (or local update) ``grad``."""
        tensors, is_map = _split(grad)
        stage = (self.rounds if epoch is None else int(epoch)) // self.warmup_period
        acc = {}
        for name, g in tensors.items():
            if not _is_float(g):
                acc[name] = g
                continue
            g = g.astype(g.dtype, copy=True)
            if self.clip_norm is not None:  # local gradient clipping
                norm = float(np.linalg.norm(g.astype(np.float64).ravel()))
                if norm > self.clip_norm:
                    g *= self.clip_norm / norm
            u = self.u.get(name)
            if u is not None and u.shape != g.shape:
                raise InputError(f"tensor {name!r} changed shape between rounds: {u.shape} -> {g.shape}")
            u = g if u is None else self.momentum * u + g  # momentum correction
            v = u.copy() if name not in self.v else self.v[name] + u
            self.u[name], self.v[name] = u, v
            acc[name] = v
        s = _round_seed(self.seed, self.rounds) if seed is None else seed
        blob = encode(acc if is_map else acc[""], "dgc", seed=s, shared=self.shared,
                      compress=self.compress_mode, keep=self.keep_at(stage), positions=self.positions,
                      threads=self.threads)
        out = decode(blob, threads=self.threads)
        received = out if is_map else {"": out}
        for name in self.v:
            sent = received[name] != 0  # the top-k values (a sent exact 0 leaves v = 0 there anyway)
            self.v[name][sent] = 0  # momentum-factor masking
            self.u[name][sent] = 0
        self.rounds += 1
        return blob
