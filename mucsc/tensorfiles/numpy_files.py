""".npy and .npz: numpy's own array files, read without pickles (object and structured dtypes are
refused) and, for .npz, with every member's declared size checked before anything inflates."""

from __future__ import annotations

import math
import os
import threading
import tokenize
import zipfile
from collections.abc import Mapping
from typing import IO, Any

import numpy as np

from mucsc.tensorfiles._common import (
    _MAX_RANK, _NUMERIC_KINDS, BARE_NAME, Format, Loaded, TensorFileError, _is_torch, _native, _readinto_exact,
    opened_for_reader, record_dtype,
)
from mucsc.tensorfiles import zips
from mucsc.tensorfiles.pt import _torch_to_numpy


def sniff_npy(head: bytes) -> bool:
    """numpy's .npy magic."""
    return head.startswith(b"\x93NUMPY")


def sniff_zip(head: bytes) -> bool:
    """A zip archive: an .npz, or a torch zip checkpoint (told apart by the members)."""
    return zips.is_zip(head)


def load_npy(f: IO[bytes], label: str, limit: float, size: int, explicit: bool) -> Loaded:
    """Load a .npy file: one bare array, whose declared size must match the bytes present."""
    arr = _read_npy(f, label, size)
    return Loaded({BARE_NAME: arr}, "npy", bare=True)


def _read_npy(f: IO[bytes], label: str, available: int) -> np.ndarray:
    """Read one .npy array without pickles; ``available`` = bytes from the magic to the end."""
    start = f.tell()
    shape, fortran, dtype = _npy_header(f, label)
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


_HEADER_LOCK = threading.Lock()


def _npy_header(f: IO[bytes], label: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) from a .npy header, refusing object and structured dtypes."""
    try:
        # one header at a time: numpy parses it with ast.literal_eval, and CPython 3.11's AST constructor
        # is not thread-safe ("SystemError: AST constructor recursion depth mismatch" when .npz members
        # are read on the streaming encoder's threads)
        with _HEADER_LOCK:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise TensorFileError(f"{label}: unsupported .npy format version {version}")
    except TensorFileError:
        raise
    except (ValueError, EOFError, OSError, SyntaxError, TypeError, tokenize.TokenError, RecursionError,
            MemoryError) as exc:  # numpy parses the header dict with tokenize and ast.literal_eval
        raise TensorFileError(f"{label}: not a valid .npy array ({type(exc).__name__}: {exc})") from None
    if dtype.hasobject or dtype.kind not in _NUMERIC_KINDS or dtype.fields is not None:
        raise TensorFileError(f"{label}: array of dtype {dtype} is not plain numbers (object or "
                              "structured arrays are refused: they may hold pickles)")
    if len(shape) > _MAX_RANK:
        raise TensorFileError(f"{label}: rank {len(shape)} exceeds {_MAX_RANK}")
    return tuple(shape), fortran, dtype


class NpzReader:
    """An .npz read one member at a time: every member's declared size is checked first (as
    :func:`load` does), entries come from the members' .npy headers, ``read(i)`` inflates member i."""

    bare = False
    notes: tuple[str, ...] = ()

    def __init__(self, path: str, label: str, limit: float = math.inf, explicit: bool = False) -> None:
        with opened_for_reader(path) as (self._f, size):
            self._zf = zips.open_checked(self._f, label, limit, size, explicit, what=".npz (zip) file")
            self._infos = self._zf.infolist()
            self.entries = []
            seen: set[str] = set()
            for info in self._infos:
                if not info.filename.endswith(".npy"):
                    raise TensorFileError(f"{label}: member {info.filename!r} is not a .npy array")
                key = info.filename[: -len(".npy")]
                if key in seen:
                    raise TensorFileError(f"{label}: duplicate member {info.filename!r}")
                seen.add(key)
                with self._member(len(self.entries), label) as m:
                    shape, _, dtype = _npy_header(m, f"{label}[{key}]")
                self.entries.append((key, record_dtype(dtype, f"{label}[{key}]"), shape))
        self._label = label

    def _member(self, i: int, label: str) -> Any:
        try:
            return self._zf.open(self._infos[i])
        except (zipfile.BadZipFile, NotImplementedError, RuntimeError, OSError, EOFError,
                zipfile.LargeZipFile) as exc:
            raise TensorFileError(f"{label}: cannot read member {self._infos[i].filename!r} ({exc})") from None

    def read(self, i: int) -> np.ndarray:
        where = f"{self._label}[{self.entries[i][0]}]"
        try:
            with self._member(i, self._label) as m:
                return _read_npy(m, where, self._infos[i].file_size)
        except (zipfile.BadZipFile, OSError, EOFError, RuntimeError) as exc:
            raise TensorFileError(f"{where}: cannot read member ({exc})") from None

    def close(self) -> None:
        self._zf.close()
        self._f.close()


class NpzWriter:
    """An .npz written one member at a time (stored, zip64 where needed), in the order given."""

    def __init__(self, f: IO[bytes], entries: list[tuple[str, str, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None) -> None:
        for key, _, _ in entries:  # before writing anything: member names are paths to unzip tools
            zips.check_member_name(key)
        self._zf = zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True)

    def write(self, name: str, values: Any) -> None:
        _write_member(self._zf, name, _as_numpy(name, values, "npz"))

    def finish(self) -> None:
        self._zf.close()

    def abandon(self) -> None:
        """After a failed write: close the archive now, while its (doomed) file is still open."""
        try:
            self._zf.close()
        except (ValueError, OSError):
            pass


class NpyReader:
    """A .npy as a one-entry source (bare); the array is read when asked for."""

    bare = True
    notes: tuple[str, ...] = ()

    def __init__(self, path: str, label: str, limit: float = math.inf, explicit: bool = False) -> None:
        self._path, self._label = path, label
        with open(path, "rb") as f:
            shape, _, dtype = _npy_header(f, label)
        self.entries = [(BARE_NAME, record_dtype(dtype, label), shape)]

    def read(self, i: int) -> np.ndarray:
        with open(self._path, "rb") as f:
            return _read_npy(f, self._label, os.fstat(f.fileno()).st_size)

    def close(self) -> None:
        pass


class NpyWriter:
    """A .npy of its one entry."""

    def __init__(self, f: IO[bytes], entries: list[tuple[str, str, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None) -> None:
        if len(entries) != 1:
            raise TensorFileError(f"a .npy file holds one array; there are {len(entries)} tensors "
                                  "(write .npz, .safetensors or .pt instead)")
        self._f, self._done = f, False

    def write(self, name: str, values: Any) -> None:
        np.lib.format.write_array(self._f, _as_numpy(name, values, "npy"), allow_pickle=False)
        self._done = True

    def finish(self) -> None:
        if not self._done:
            raise TensorFileError("the .npy array was never written")


def _load_npz(f: IO[bytes], label: str, limit: float, size: int, explicit: bool) -> Loaded:
    """Read an .npz (a zip of .npy members) with declared sizes checked before anything inflates."""
    zf = zips.open_checked(f, label, limit, size, explicit, what=".npz (zip) file")
    with zf:
        infos = zf.infolist()
        for info in infos:
            if not info.filename.endswith(".npy"):
                raise TensorFileError(f"{label}: member {info.filename!r} is not a .npy array")
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
    for key in tensors:  # before writing anything: member names are paths to unzip tools
        zips.check_member_name(key)
    with zipfile.ZipFile(f, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for key, t in tensors.items():
            _write_member(zf, key, _as_numpy(key, t, "npz"))


def _write_member(zf: zipfile.ZipFile, key: str, arr: np.ndarray) -> None:
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



NPY = Format("npy", (".npy",), sniff_npy, load_npy, _save_npy, open_reader=NpyReader, open_writer=NpyWriter,
             offsets=True, bfloat16=False, max_tensors=1)
NPZ = Format("npz", (".npz",), sniff_zip, _load_npz, _save_npz, open_reader=NpzReader, open_writer=NpzWriter,
             bfloat16=False)
