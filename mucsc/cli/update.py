"""``--base``: turn a checkpoint into an update NEW - OLD and back, in place where possible.

Float tensors become differences (computed in their own dtype, in place, so compressing an update needs
no third copy of the model); non-float tensors (step counters, int buffers) are carried unchanged,
as the NEW values, and are not touched when the update is added back.  NEW and OLD must have the same
names, shapes and dtypes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mucsc.tensorfiles import TensorFileError

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
META_KEY = "mucsc.update"  # message meta: the message holds NEW - OLD (value: OLD's file name)
BASE_KEY = "mucsc.base_fingerprint"  # message meta: mucsc.fingerprint(OLD) (spec/FORMAT.md 2.4.1)


def dtype_name(t: Any) -> str:
    """'float32', 'bfloat16', 'int64', ... for a numpy array or torch tensor."""
    if isinstance(t, np.ndarray):
        return t.dtype.name
    return str(t.dtype).removeprefix("torch.")


def shape_of(t: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape)


def layout(tensors: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype name)."""
    return {k: (shape_of(v), dtype_name(v)) for k, v in tensors.items()}


def check_same_layout(new: Mapping[str, tuple[tuple[int, ...], str]],
                      old: Mapping[str, tuple[tuple[int, ...], str]], new_name: str, old_name: str) -> None:
    """TensorFileError naming OLD unless both layouts (see :func:`layout`) have the same names, shapes
    and dtypes."""
    missing = [k for k in new if k not in old]
    extra = [k for k in old if k not in new]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"{_few(missing)} only in {new_name}")
        if extra:
            parts.append(f"{_few(extra)} only in {old_name}")
        raise TensorFileError(f"{old_name}: does not match {new_name}: tensors {'; '.join(parts)}")
    for k, (shape, dt) in new.items():
        old_shape, old_dt = old[k]
        if shape != old_shape:
            raise TensorFileError(f"{old_name}: tensor {k!r} has shape {list(old_shape)}, "
                                  f"{new_name} has {list(shape)}")
        if dt != old_dt:
            raise TensorFileError(f"{old_name}: tensor {k!r} is {old_dt}, {new_name} has {dt}")


def subtract_base(new: dict[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    """NEW - OLD for float tensors (in place when NEW is writable); others unchanged."""
    return {k: _combine(v, old[k], subtract=True) for k, v in new.items()}


def add_base(update: dict[str, Any], old: Mapping[str, Any]) -> dict[str, Any]:
    """OLD + update for float tensors (the update's values are rounded to OLD's dtype); others unchanged."""
    return {k: _combine(v, old[k], subtract=False) for k, v in update.items()}


def _combine(a: Any, b: Any, subtract: bool) -> Any:
    if dtype_name(b) not in FLOAT_DTYPES:
        return a
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        op = np.subtract if subtract else np.add
        if a.flags.writeable and a.dtype == b.dtype:
            return op(a, b, out=a)
        return op(a, b, dtype=b.dtype)
    import torch  # bfloat16 values are torch tensors (numpy has no bfloat16)

    ta = a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))
    tb = b if isinstance(b, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(b))
    if ta.dtype == tb.dtype:
        return ta - tb if subtract else ta + tb
    out = ta.float() - tb.float() if subtract else ta.float() + tb.float()
    return out.to(tb.dtype)


def squared_norm(tensors: Mapping[str, Any]) -> float:
    """sum of x^2 over the float tensors, accumulated in float64 in 1M-element chunks (no full copy)."""
    total = 0.0
    for t in tensors.values():
        if dtype_name(t) not in FLOAT_DTYPES:
            continue
        flat = t.reshape(-1)
        for i in range(0, int(flat.shape[0]), 1 << 20):
            c = _float64(flat[i: i + (1 << 20)])
            total += float(np.dot(c, c))
    return total


def _float64(chunk: Any) -> np.ndarray:
    if isinstance(chunk, np.ndarray):
        return chunk.astype(np.float64)
    return chunk.double().numpy()  # a torch tensor (bfloat16)


def _few(names: list[str]) -> str:
    shown = ", ".join(map(repr, names[:3]))
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")
