"""Adapting user data (numpy arrays, torch tensors, mappings of them) to named records and back.

torch is never imported here unless the caller already passed torch tensors or asked for them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from mucsc.codec import kernels, parallel
from mucsc.codec.wire.container import FLOAT_DTYPES, INT_DTYPES
from mucsc.errors import InputError, ParameterError
from mucsc.optional import require_torch

AS_TORCH = "as_torch=True"  # what needs torch when a caller asks for torch tensors back
# elements per device chunk of the torch forms: bounds the int64 temporaries (~8 bytes x a few per element)
CHUNK = 1 << 22

_NUMPY_TO_NAME = {np.dtype(n): n for n in ("float16", "float32", "float64", *INT_DTYPES)}


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One input tensor as numpy: ``array`` holds bfloat16 data as uint16 bit patterns."""

    name: str
    dtype: str  # one of format.RECORD_DTYPES
    array: np.ndarray

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOAT_DTYPES

    @property
    def size(self) -> int:
        """Number of elements (``array`` may be a device tensor, see :func:`_from_torch`)."""
        a = self.array
        return a.size if isinstance(a, np.ndarray) else int(np.prod(a.shape, dtype=np.int64))

    @property
    def on_device(self) -> bool:
        """True when ``array`` is a torch tensor left on its (non-CPU) device."""
        return not isinstance(self.array, np.ndarray)

    def as_float(self) -> np.ndarray:
        """The values as float32/float64 (bfloat16 widened exactly to float32)."""
        if self.dtype == "bfloat16":
            wide = self.array.astype(np.uint32)
            wide <<= 16  # in place: one float32-sized array, not two
            return wide.view(np.float32)
        return self.array


def is_torch_tensor(x: Any) -> bool:
    """True for a torch tensor (without importing torch)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "dtype")


def torch_module():
    """torch, or a ParameterError saying the torch backend needs it (the torch forms' one import)."""
    return require_torch("the torch backend (MUCSC_BACKEND=torch or a device tensor)")


def to_tensor(name: str, value: Any) -> Tensor:
    """Convert one array-like to a :class:`Tensor`, rejecting dtypes the format cannot carry."""
    if not isinstance(value, np.ndarray) and is_torch_tensor(value):
        return _from_torch(name, value)
    if not isinstance(value, np.ndarray):
        if isinstance(value, (list, tuple, int, float, np.generic)):
            try:
                value = np.asarray(value)
            except (ValueError, TypeError, OverflowError) as exc:  # ragged lists, ...
                raise InputError(f"{name_label(name)}: cannot be read as an array ({exc})") from None
        else:
            raise InputError(f"{name_label(name)}: expected a numpy array or torch tensor, got {type(value).__name__}")
    dt = np.dtype(value.dtype)
    name_of = _NUMPY_TO_NAME.get(dt) if dt.byteorder != ">" else None  # native (the usual case)
    if name_of is not None:
        return Tensor(name, name_of, value)
    if dt.newbyteorder("=") in _NUMPY_TO_NAME and dt.byteorder != ">":
        return Tensor(name, _NUMPY_TO_NAME[dt.newbyteorder("=")], value)
    if dt.byteorder == ">" and dt.newbyteorder("<") in _NUMPY_TO_NAME:
        return Tensor(name, _NUMPY_TO_NAME[dt.newbyteorder("<")], value.astype(dt.newbyteorder("<")))
    raise InputError(f"{name_label(name)}: dtype {dt} cannot be encoded (floats, integers and bool only)")


_TORCH_FLOAT_NAMES = ("float16", "bfloat16", "float32", "float64")


def on_host(t: Tensor) -> Tensor:
    """``t`` with its values on the host as numpy (a no-op unless it was left on a device)."""
    return _from_torch(t.name, t.array, keep_device=False) if t.on_device else t


def _from_torch(name: str, t: Any, keep_device: bool = True) -> Tensor:
    import torch  # the caller passed a torch tensor, so torch is already imported

    if t.layout != torch.strided:
        raise InputError(f"{name_label(name)}: a {t.layout} tensor; convert it with .to_dense() first")
    if t.is_meta:
        raise InputError(f"{name_label(name)}: a tensor on the meta device has no data to encode")
    if t.is_quantized:
        raise InputError(f"{name_label(name)}: quantized tensors cannot be encoded; .dequantize() it first")
    try:
        if t.requires_grad:  # detach() is an op of its own (one per tensor of a message): only when needed
            t = t.detach()
        t = t.resolve_conj().resolve_neg()  # lazy conj/neg views: materialised where they live
        # MUCSC_BACKEND=torch keeps CPU tensors as torch too, which is how the device path is tested here
        stays = keep_device and (t.device.type != "cpu" or kernels.TORCH)
        if stays:
            dname = str(t.dtype).removeprefix("torch.")
            if dname in _TORCH_FLOAT_NAMES:  # a float tensor on a GPU stays there: the torch backend
                return Tensor(name, dname, t.contiguous())  # encodes it where it lives
        t = t.cpu().contiguous()
        if t.dtype == torch.bfloat16:
            return Tensor(name, "bfloat16", t.view(torch.int16).numpy().view(np.uint16))
        arr = t.numpy()
    except (TypeError, RuntimeError, NotImplementedError) as exc:
        raise InputError(f"{name_label(name)}: torch tensor of dtype {t.dtype} cannot be encoded ({exc})") from None
    return to_tensor(name, arr)


def to_tensors(data: Any) -> tuple[str, list[Tensor]]:
    """(container kind, tensors) for a bare array/tensor ("tensor") or a mapping of them ("dict")."""
    if type(data) is not np.ndarray and isinstance(data, Mapping):  # (no ABC check for an array)
        out = []
        for key, value in data.items():
            if not isinstance(key, str):
                raise InputError(f"tensor names must be strings, got {key!r}")
            out.append(to_tensor(key, value))
        return "dict", out
    return "tensor", [to_tensor("", data)]


def to_device(value: Any, device: Any) -> Any:
    """A decoded torch tensor moved to ``device`` (None: left where it is)."""
    return value if device is None else value.to(device)


def from_record(array: np.ndarray, dtype: str, shape: tuple[int, ...], as_torch: bool) -> Any:
    """Give a decoded flat array its record's shape and dtype (numpy, or torch on request; ``array``
    may already be a torch tensor, decoded on a device)."""
    if not isinstance(array, np.ndarray):
        torch = require_torch(AS_TORCH)
        big = FLOAT_MAX.get(dtype)
        if big is not None and array.is_floating_point() and torch.finfo(array.dtype).max > big:
            array = array.clamp(-big, big)
        return (array if tuple(array.shape) == tuple(shape) else array.reshape(shape)).to(getattr(torch, dtype))
    if dtype != "bfloat16" and np.dtype(dtype).kind == "f" and array.dtype.kind == "f" \
            and np.dtype(dtype).itemsize < array.dtype.itemsize:  # narrowed a chunk at a time, no full copy
        out = saturate_into(array, np.empty(array.shape, np.dtype(dtype)), dtype).reshape(shape)
        return require_torch(AS_TORCH).from_numpy(np.require(out, requirements="C")) if as_torch else out
    array = saturate(array, dtype)
    if dtype == "bfloat16":
        if as_torch:
            torch = require_torch(AS_TORCH)

            return torch.from_numpy(np.require(np.asarray(array, np.float32).reshape(shape), requirements="C")
                                    ).to(torch.bfloat16)
        return np.asarray(array, np.float32).reshape(shape)
    out = np.asarray(array).astype(np.dtype(dtype), copy=False).reshape(shape)
    if as_torch:
        return require_torch(AS_TORCH).from_numpy(np.require(out, requirements="C"))  # keeps 0-d arrays 0-d
    return out


# the largest finite value of each float record dtype (bfloat16: 0x7F7F)
FLOAT_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38,
             "float32": float(np.finfo(np.float32).max), "float64": float(np.finfo(np.float64).max)}


def saturate(array: np.ndarray, dtype: str) -> np.ndarray:
    """``array`` clipped to the finite range of record dtype ``dtype`` where that range is narrower
    (FORMAT.md 2.4: a finite group value never decodes to +-inf, e.g. a QSGD level of a float16
    record above 65504); unchanged (no copy) otherwise."""
    big = FLOAT_MAX.get(dtype)
    if big is None or array.dtype.kind != "f" or np.finfo(array.dtype).max <= big:
        return array
    if array.size and -big <= np.min(array) and np.max(array) <= big:  # two reductions, no copy
        return array
    return np.clip(array, -big, big)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (to nearest, ties to even, as torch's ``.to(bfloat16)``),
    as uint16 bit patterns; NaN stays NaN (its quiet bit set).  In chunks of ``parallel.CHUNK``
    elements on the threads of ``parallel.current()`` (it runs on every decoded element of a bfloat16
    checkpoint): the temporaries are one chunk, not the tensor."""
    shape = np.shape(x)
    x = np.ascontiguousarray(x, np.float32).reshape(-1)
    out = np.empty(x.size, np.uint16)

    def span(a: int, b: int) -> None:
        u = x[a:b].view(np.uint32)
        r = u >> 16
        r &= 1
        r += 0x7FFF
        r += u  # no overflow for non-NaN patterns: u <= 0xFF7FFFFF (the largest finite) + 0x8000
        r >>= 16
        out[a:b] = r
        if not np.isfinite(np.max(np.abs(x[a:b]))):
            nan = np.isnan(x[a:b])
            out[a:b][nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)

    if x.size:
        parallel.run_spans(span, x.size)
    return out.reshape(shape)


def bf16_round_trip(x: np.ndarray) -> np.ndarray:
    """float32 values as a bfloat16 record stores them (rounded to nearest even), back in float32."""
    return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


SATURATE_CHUNK = 1 << 18  # elements clipped and narrowed at a time by saturate_into


def saturate_into(array: np.ndarray, out: np.ndarray, dtype: str) -> np.ndarray:
    """:func:`saturate` of ``array`` cast to ``out``'s (narrower) dtype, written into ``out`` a chunk
    at a time: the same values as ``saturate(array, dtype).astype(out.dtype)`` without a full-size
    copy of ``array`` (a decoder's scratch stays fixed whatever the record's size)."""
    flat_in, flat_out = array.reshape(-1), out.reshape(-1)
    for a in range(0, flat_in.size, SATURATE_CHUNK):
        flat_out[a: a + SATURATE_CHUNK] = saturate(flat_in[a: a + SATURATE_CHUNK], dtype)
    return out


def name_label(name: str) -> str:
    """How errors name a tensor: by its name, or "input" for unnamed data."""
    return f"tensor {name!r}" if name else "input"
