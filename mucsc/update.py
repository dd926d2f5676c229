"""Model updates between two checkpoints of one model: ``update = new - base``, and back.

The one sign convention of mucsc's command line (``mucsc compress NEW --base OLD``), its Flower
integration and every saved message that carries :data:`META_KEY`: an update is what is *added* to
its base, ``new = base + update``.  (The paper's client update U_i = w - w_i, eq. 5, is a descent
step, the negative of this; the simulator keeps that form internally for its FedAvg arithmetic,
w <- w - D~, eq. 12, and never hands it to a user as an "update".)

Float tensors (float16, bfloat16, float32, float64) become differences computed in their own dtype;
other tensors (step counters, int buffers) are carried as the NEW values and replace the base's on
:func:`apply_update`.  Both sides must have the same names, shapes and dtypes (:func:`check_layout`).
A message made from an update records the base's :func:`mucsc.fingerprint` under :data:`BASE_KEY`,
which :func:`apply_update` checks (``expect=``) before adding it to a base.

Tensors are numpy arrays or torch tensors; bfloat16 (which numpy lacks) is handled with torch,
imported only then.  Only the public ``mucsc`` API is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

import mucsc
from mucsc.errors import InputError
from mucsc.optional import require_torch

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
META_KEY = "mucsc.update"  # message meta: the message holds NEW - OLD (value: OLD's file name)
BASE_KEY = "mucsc.base_fingerprint"  # message meta: mucsc.fingerprint(OLD) (spec/FORMAT.md 2.4.1)

Layout = Mapping[str, tuple[tuple[int, ...], str]]


class UpdateError(InputError):
    """An update and a base that do not belong together (names, shapes or dtypes differ)."""


class BaseMismatchError(UpdateError):
    """The base's fingerprint differs from the one the update was made from (same layout, other values)."""

    def __init__(self, got: str, expected: str) -> None:
        super().__init__(f"base fingerprint {got} differs from the expected {expected}")
        self.got, self.expected = got, expected


def dtype_name(t: Any) -> str:
    """'float32', 'bfloat16', 'int64', ... for a numpy array or torch tensor."""
    if isinstance(t, np.ndarray):
        return t.dtype.name
    return str(t.dtype).removeprefix("torch.")


def is_float(t: Any) -> bool:
    """Whether a tensor takes part in an update as a difference (a float dtype)."""
    return dtype_name(t) in FLOAT_DTYPES


def layout(tensors: Mapping[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype name)."""
    return {k: (tuple(int(s) for s in v.shape), dtype_name(v)) for k, v in tensors.items()}


def check_layout(new: Layout, base: Layout, new_name: str = "new", base_name: str = "base") -> None:
    """:class:`UpdateError` naming the base unless both layouts (see :func:`layout`) have the same
    names, shapes and dtypes."""
    missing = [k for k in new if k not in base]
    extra = [k for k in base if k not in new]
    if missing or extra:
        parts = [f"{_few(names)} only in {who}" for names, who in ((missing, new_name), (extra, base_name)) if names]
        raise UpdateError(f"{base_name}: does not match {new_name}: tensors {'; '.join(parts)}")
    for k, (shape, dt) in new.items():
        base_shape, base_dt = base[k]
        if shape != base_shape:
            raise UpdateError(f"{base_name}: tensor {k!r} has shape {list(base_shape)}, "
                              f"{new_name} has {list(shape)}")
        if dt != base_dt:
            raise UpdateError(f"{base_name}: tensor {k!r} is {base_dt}, {new_name} has {dt}")


def make_update(new: Mapping[str, Any], base: Mapping[str, Any], *, in_place: bool = False,
                names: tuple[str, str] = ("new", "base")) -> dict[str, Any]:
    """``new - base`` for float tensors, the NEW values for the others, in NEW's order; the layouts
    must match (``names`` name both sides in the error).  ``in_place``: write the differences into
    NEW's writable numpy arrays (no third copy of a model; NEW's values are lost)."""
    check_layout(layout(new), layout(base), *names)
    return {k: _combine(v, base[k], subtract=True, in_place=in_place) for k, v in new.items()}


def apply_update(base: Mapping[str, Any], update: Mapping[str, Any], *, expect: str | None = None,
                 update_layout: Layout | None = None, names: tuple[str, str] = ("update", "base"),
                 in_place: bool = False) -> dict[str, Any]:
    """``base + update`` for float tensors (rounded to the base's dtype), the update's values for the
    others, in the update's order.

    ``expect``: the fingerprint the update was made from (a message's ``meta[BASE_KEY]``);
    :class:`BaseMismatchError` when the base's differs.  ``update_layout``: the update's layout when
    its tensors do not show it (a message's records: bfloat16 decodes as float32 numpy).
    ``in_place``: add into the update's writable numpy arrays."""
    check_layout(update_layout if update_layout is not None else layout(update), layout(base), *names)
    if expect is not None:
        got = mucsc.fingerprint(base)
        if got != expect:
            raise BaseMismatchError(got, expect)
    return {k: _combine(v, base[k], subtract=False, in_place=in_place) for k, v in update.items()}


def _combine(a: Any, b: Any, subtract: bool, in_place: bool) -> Any:
    """a - b or a + b in b's dtype for float b; a itself otherwise."""
    if not is_float(b):
        return a
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        op = np.subtract if subtract else np.add
        if in_place and a.flags.writeable and a.dtype == b.dtype:
            return op(a, b, out=a)
        return op(a, b, dtype=b.dtype)
    torch = require_torch("bfloat16 tensors", InputError)  # numpy has no bfloat16
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
        if not is_float(t):
            continue
        flat = t.reshape(-1)
        for i in range(0, int(flat.shape[0]), 1 << 20):
            c = _float64(flat[i: i + (1 << 20)])
            total += float(np.square(c, out=c).sum())  # not np.dot: threaded BLAS, ~2x slower under load
    return total


def widen_bfloat16(tensors: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The tensors with every bfloat16 one as a float32 numpy array (exact), and the names widened:
    for formats without bfloat16 (.npz, .npy)."""
    out, widened = {}, []
    for k, v in tensors.items():
        if dtype_name(v) == "bfloat16":
            v = v.float().numpy()
            widened.append(k)
        out[k] = v
    return out, widened


def _float64(chunk: Any) -> np.ndarray:
    if isinstance(chunk, np.ndarray):
        return chunk.astype(np.float64)
    return chunk.double().numpy()  # a torch tensor (bfloat16)


def _few(names: list[str]) -> str:
    shown = ", ".join(map(repr, names[:3]))
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


__all__ = ["BASE_KEY", "FLOAT_DTYPES", "META_KEY", "BaseMismatchError", "UpdateError", "apply_update",
           "check_layout", "dtype_name", "layout", "make_update", "squared_norm", "widen_bfloat16"]
