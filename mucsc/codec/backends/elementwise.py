"""The step "elementwise arithmetic a codec's wire values need": casts to a wire dtype (float16 rounded
once, to nearest even), sign masks, and the squared errors its statistics report.

``Host`` and ``Torch`` hold the same names (see :mod:`mucsc.codec.backends.dispatch`).  The casts
and masks reach the wire: the two forms give the same values bit for bit.  The squared errors are
statistics (never sent), each summed in float64 in its backend's own order."""

from __future__ import annotations

from typing import Any

import numpy as np

from mucsc.codec import kernels
from mucsc.codec.backends import torch_backend as tb


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
        torch = tb._torch()
        if limit is not None:
            x = x.clamp(-limit, limit)
        if np.dtype(wire) == np.float16:
            return tb.to_float16(x)  # numpy's single rounding (torch rounds float64 twice)
        return x.to(getattr(torch, np.dtype(wire).name))

    @staticmethod
    def negative(x: Any):
        return tb._torch().signbit(x) & (x != 0)

    @staticmethod
    def signbit(x: Any):
        return tb._torch().signbit(x)

    @staticmethod
    def abs(x: Any):
        return x.abs()

    @staticmethod
    def signed(neg: Any, mag: float):
        torch = tb._torch()
        return torch.where(neg, -float(mag), float(mag)).to(torch.float64)

    @staticmethod
    def sq_error(a: Any, b: Any) -> float:
        torch = tb._torch()
        return float(((a.to(torch.float64) - b.to(torch.float64)) ** 2).sum())

    @staticmethod
    def sq_norm(x: Any) -> float:
        x64 = x.to(tb._torch().float64)
        return float(x64 @ x64)

    @staticmethod
    def all_finite(v: Any) -> bool:
        return bool(tb._torch().isfinite(v).all())

    @staticmethod
    def astype(v: Any, dtype: Any):
        torch = tb._torch()
        return v.to(getattr(torch, np.dtype(dtype).name))
