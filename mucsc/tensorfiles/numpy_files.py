""".npy and .npz: numpy's own array files, read without pickles (object and structured dtypes are
refused) and, for .npz, with every member's declared size checked before anything inflates."""

from __future__ import annotations

import math
import zipfile
from collections.abc import Mapping
from typing import IO, Any

import numpy as np

from mucsc.tensorfiles._common import (
    _MAX_RANK, _NUMERIC_KINDS, BARE_NAME, Format, Loaded, TensorFileError, _is_torch, _native, _over_limit,
    _readinto_exact,
)
from mucsc.tensorfiles.pt import _torch_to_numpy

_NPZ_MAX_MEMBERS = 1_000_000


def sniff_npy(head: bytes) -> bool:
    """numpy's .npy magic."""
    return head.startswith(b"\x93NUMPY")


def sniff_zip(head: bytes) -> bool:
    """A zip archive: an .npz, or a torch zip checkpoint (told apart by the members)."""
    return head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06")


def load_npy(f: IO[bytes], label: str, limit: float, size: int, explicit: bool) -> Loaded:
    """Load a .npy file: one bare array, whose declared size must match the bytes present."""
    arr = _read_npy(f, label, size)
    return Loaded({BARE_NAME: arr}, "npy", bare=True)


def _read_npy(f: IO[bytes], label: str, available: int) -> np.ndarray:
    """Read one .npy array without pickles; ``available`` = bytes from the magic to the end."""
    start = f.tell()
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise TensorFileError(f"{label}: unsupported .npy format version {version}")
    except TensorFileError:
        raise
    except (ValueError, EOFError, OSError, SyntaxError) as exc:
        raise TensorFileError(f"{label}: not a valid .npy array ({exc})") from None
    if dtype.hasobject or dtype.kind not in _NUMERIC_KINDS or dtype.fields is not None:
        raise TensorFileError(f"{label}: array of dtype {dtype} is not plain numbers (object or "
                              "structured arrays are refused: they may hold pickles)")
    if len(shape) > _MAX_RANK:
        raise TensorFileError(f"{label}: rank {len(shape)} exceeds {_MAX_RANK}")
    count = math.prod(shape)
    need = count * dtype.itemsize
    have = available - (f.tell() - start)
    if need != have:
        raise TensorFileError(f"{label}: array {dtype} {shape} needs {need} data bytes, the file "
                              f"holds {have}" + (" (truncated)" if have < need else ""))
    flat = np.empty(count, dtype=dtype)
    if need:
        _readinto_exact(f, flat, label, "the array data")
    return _native(flat.reshape(shape, order="F" if fortran else "C"))


def _load_npz(f: IO[bytes], label: str, limit: float, size: int, explicit: bool) -> Loaded:
    """Read an .npz (a zip of .npy members) with declared sizes checked before anything inflates."""
    try:
        zf = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, ValueError, OSError) as exc:
        raise TensorFileError(f"{label}: not a valid .npz (zip) file ({exc})") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > _NPZ_MAX_MEMBERS:
            raise TensorFileError(f"{label}: {len(infos)} members exceed the limit {_NPZ_MAX_MEMBERS}")
        total = 0
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise TensorFileError(f"{label}: member {info.filename!r} is not a .npy array")
            total += info.file_size
            if info.file_size > limit or total > limit:
                raise _over_limit(label, "members declare", total, limit, size, explicit)
        tensors: dict[str, Any] = {}
        for info in infos:
            key = info.filename[: -len(".npy")]
            if key in tensors:
                raise TensorFileError(f"{label}: duplicate member {info.filename!r}")
            where = f"{label}[{key}]"
            try:
                with zf.open(info) as m:
                    tensors[key] = _read_npy(m, where, info.file_size)
            except (zipfile.BadZipFile, NotImplementedError, RuntimeError, OSError, EOFError,
                    zipfile.LargeZipFile) as exc:
                raise TensorFileError(f"{where}: cannot read member ({exc})") from None
    return Loaded(tensors, "npz")


def _save_npz(f: IO[bytes], tensors: Mapping[str, Any]) -> None:
    # numpy.savez would treat keys such as "file" or "allow_pickle" as its own arguments; write the
    # same layout directly (stored members, zip64 allowed).
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for key, t in tensors.items():
            arr = _as_numpy(key, t, "npz")
            with zf.open(key + ".npy", "w", force_zip64=arr.nbytes > (1 << 31) - 4096) as m:
                np.lib.format.write_array(m, arr, allow_pickle=False)


def _save_npy(f: IO[bytes], tensors: Mapping[str, Any]) -> None:
    if len(tensors) != 1:
        raise TensorFileError(f"a .npy file holds one array; there are {len(tensors)} tensors "
                              "(write .npz, .safetensors or .pt instead)")
    ((key, t),) = tensors.items()
    np.lib.format.write_array(f, _as_numpy(key, t, "npy"), allow_pickle=False)


def _as_numpy(key: str, t: Any, fmt: str) -> np.ndarray:
    if _is_torch(t):
        t = _torch_to_numpy(t, key, fmt)
    a = np.asarray(t)
    if a.dtype.hasobject or a.dtype.kind not in _NUMERIC_KINDS:
        raise TensorFileError(f"tensor {key!r}: dtype {a.dtype} is not a plain number type")
    return a



NPY = Format("npy", (".npy",), sniff_npy, load_npy, _save_npy)
NPZ = Format("npz", (".npz",), sniff_zip, _load_npz, _save_npz)
