"""The step "elementwise arithmetic a codec's wire values need": casts to a wire dtype (float16 rounded
once, to nearest even), sign masks, and the squared errors its statistics report.

``Host`` and ``Torch`` hold the same names (see :mod:`mucsc.codec.backends.dispatch`).  The casts
and masks reach the wire: the two forms give the same values bit for bit.  The squared errors are
statistics (never sent), each summed in float64 in its backend's own order."""

from __future__ import annotations

from typing import Any

import numpy as np

from mucsc.codec import kernels
from mucsc.codec.backends.tensors import torch_module


class Host:
    """numpy arrays."""

    @staticmethod
    def cast(x: np.ndarray, wire: str, limit: float | None = None) -> np.ndarray:
        """``x`` in the wire dtype ``wire`` (no copy when it is already), clipped to +-``limit``
        first when given (fp16 saturates instead of overflowing)."""
        if limit is not None:
            return np.clip(x, -limit, limit).astype(wire)
        return x.astype(wire, copy=False)

    @staticmethod
    def negative(x: np.ndarray) -> np.ndarray:
        """Where x < 0 (-0.0 is not: signSGD sends it as +)."""
        return np.signbit(x) & (x != 0)

    @staticmethod
    def signbit(x: np.ndarray) -> np.ndarray:
        return np.signbit(x)

    @staticmethod
    def abs(x: np.ndarray) -> np.ndarray:
        return np.abs(x)

    @staticmethod
    def signed(neg: np.ndarray, mag: float) -> np.ndarray:
        """-mag where ``neg``, else +mag, in float64."""
        return np.where(neg, -float(mag), float(mag))

    @staticmethod
    def sq_error(a: np.ndarray, b: np.ndarray) -> float:
        """sum((a - b)^2) in float64."""
        return float(np.sum((a.astype(np.float64) - b) ** 2))

    @staticmethod
    def sq_norm(x: np.ndarray) -> float:
        """sum(x^2) in float64, in the fixed order of :func:`mucsc.codec.kernels.dot`."""
        return kernels.dot(x, x)

    @staticmethod
    def all_finite(v: np.ndarray) -> bool:
        return bool(np.all(np.isfinite(v)))

    @staticmethod
    def astype(v: np.ndarray, dtype: Any) -> np.ndarray:
        return v.astype(dtype)


class Torch:
    """torch tensors, on their device."""

    @staticmethod
    def cast(x: Any, wire: str, limit: float | None = None):
        torch = torch_module()
        if limit is not None:
            x = x.clamp(-limit, limit)
        if np.dtype(wire) == np.float16:
            return to_float16(x)  # numpy's single rounding (torch rounds float64 twice)
        return x.to(getattr(torch, np.dtype(wire).name))

    @staticmethod
    def negative(x: Any):
        return torch_module().signbit(x) & (x != 0)

    @staticmethod
    def signbit(x: Any):
        return torch_module().signbit(x)

    @staticmethod
    def abs(x: Any):
        return x.abs()

    @staticmethod
    def signed(neg: Any, mag: float):
        torch = torch_module()
        return torch.where(neg, -float(mag), float(mag)).to(torch.float64)

    @staticmethod
    def sq_error(a: Any, b: Any) -> float:
        torch = torch_module()
        return float(((a.to(torch.float64) - b.to(torch.float64)) ** 2).sum())

    @staticmethod
    def sq_norm(x: Any) -> float:
        x64 = x.to(torch_module().float64)
        return float(x64 @ x64)

    @staticmethod
    def all_finite(v: Any) -> bool:
        return bool(torch_module().isfinite(v).all())

    @staticmethod
    def astype(v: Any, dtype: Any):
        torch = torch_module()
        return v.to(getattr(torch, np.dtype(dtype).name))


# ---- the torch form's float16 cast ------------------------------------------------------------------

def to_float16(x):
    """``x.astype(np.float16)`` (round to nearest even, once) for a float32/float64 tensor.

    torch converts float64 to float16 through float32, rounding twice; a value just off a float16 tie
    would then land on the tie and round to even where numpy's direct conversion does not.  Rounding
    to float32 *to odd* first (truncate, then set the last bit when inexact) keeps the single
    rounding's result: float32 has more than two extra bits over float16 at every float16 exponent."""
    torch = torch_module()
    if x.dtype != torch.float64:
        return x.to(torch.float16)
    y = x.to(torch.float32)
    inexact = y.to(torch.float64) != x
    bits = y.view(torch.int32)
    away = inexact & (y.to(torch.float64).abs() > x.abs())  # rounded away from zero: step back
    bits = torch.where(away, bits - 1, bits)  # sign-magnitude: -1 shrinks |y| for either sign
    bits = torch.where(inexact, bits | 1, bits)
    return bits.view(torch.float32).to(torch.float16)
