"""Shared by every tensor-file format module: the error type, what loading returns, the load limits
(issue 9) and small helpers.  Nothing here imports torch."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any, Protocol

import numpy as np

from mucsc.errors import MucscError

#: name given to a bare array when it is written to a named-tensor format
BARE_NAME = "arr_0"
_MAX_RANK = 64
_NUMERIC_KINDS = "biufc"
# Default bound on what loading one file may allocate: LOAD_EXPANSION times the file's size, at least
# LOAD_FLOOR_BYTES.  .safetensors, .npy, stored .npz and .pt files load to about their own size (tied
# weights: a few times); more is a zip bomb or a checkpoint of crafted overlapping views.
LOAD_EXPANSION = 32
LOAD_FLOOR_BYTES = 256 << 20


class TensorFileError(MucscError, ValueError):
    """A tensor file cannot be read or written; the message names the file and the problem."""


@dataclasses.dataclass(frozen=True)
class Loaded:
    """What :func:`load` returns.

    ``tensors``: name -> numpy array (or torch.Tensor for bfloat16), in file order.  ``bare``: the file
    held one unnamed array (.npy, or a .pt holding a single tensor); it is ``tensors[BARE_NAME]``.
    ``notes``: things the user should know (skipped checkpoint entries, ...).
    """

    tensors: dict[str, Any]
    format: str
    bare: bool = False
    notes: tuple[str, ...] = ()

    @property
    def nbytes(self) -> int:
        return sum(_nbytes(t) for t in self.tensors.values())



def default_max_bytes() -> int:
    """Upper bound on what loading any file may allocate: the machine's physical memory.

    Nothing larger can be loaded anyway, so a bigger declaration is a zip bomb or a lie.
    """
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        return 64 << 30



def _over_limit(label: str, what: str, nbytes: int, limit: float, size: int, explicit: bool) -> TensorFileError:
    why = ("the limit given" if explicit else
           f"the default limit for loading a {size}-byte file ({LOAD_EXPANSION}x its size, at least "
           f"{LOAD_FLOOR_BYTES >> 20} MiB)")
    return TensorFileError(f"{label}: {what} {nbytes} bytes, over {why} of {limit:.0f} bytes (a zip bomb or "
                           "crafted views?); if you trust the file, allow more with --max-memory SIZE|none "
                           "(tensorfiles.load(max_bytes=...))")



class TensorReader(Protocol):
    """A tensor file opened for reading one tensor at a time (a format's ``open_reader``).

    ``entries``: (name, dtype, shape) of every tensor in file order, known without reading any data;
    dtype is a record dtype name (``float32``, ``bfloat16``, ``int64``, ...).  ``read(i)``: tensor i's
    values, read now: a numpy array (bfloat16 as its uint16 bit patterns; no torch) or, for .pt, a
    torch tensor (memory-mapped).  ``bare``: the file holds one unnamed array.  ``notes``: as
    :class:`Loaded`'s.  ``close()`` releases the file."""

    entries: list[tuple[str, str, tuple[int, ...]]]
    bare: bool
    notes: tuple[str, ...]

    def read(self, i: int) -> Any: ...

    def close(self) -> None: ...


class TensorWriter(Protocol):
    """A tensor file being written one tensor at a time (a format's ``open_writer``): the entries are
    given up front, in the order they will be written; ``write(name, values)`` takes numpy arrays
    (bfloat16 as uint16 bit patterns, or torch tensors), ``finish()`` completes the file."""

    def write(self, name: str, values: Any) -> None: ...

    def finish(self) -> None: ...

    # optional: ``abandon()`` releases what the writer holds after a failed write (the caller
    # deletes the file)


@dataclasses.dataclass(frozen=True)
class Format:
    """One file format behind the same verbs: the registry in ``mucsc.tensorfiles`` maps names to these.

    ``sniff(head)``: do a file's first bytes look like this format.  ``load(f, label, limit, size,
    explicit)``: parse an open file (or a path, for torch) of ``size`` bytes into :class:`Loaded`, with
    ``limit`` the bound on what loading may allocate (``explicit``: given by the user, for messages).
    ``save(f, tensors)``: write a mapping of names to arrays/tensors to a binary stream.

    What the format can do, for callers to ask instead of switching on names:
    ``open_reader(path, label, limit, explicit)``: a :class:`TensorReader` (stream in; None: load whole);
    ``open_writer(f, entries, metadata)``: a :class:`TensorWriter` (stream out; None: the writer needs
    every tensor at once, ``save``); ``offsets``: the header gives every tensor's offset (one tensor is
    read without the rest); ``metadata``: the file carries string metadata; ``bfloat16``: it holds
    bfloat16 (else such tensors are widened to float32); ``max_tensors``: 1 for a single-array format;
    ``needs_torch``: reading or writing it imports torch.
    """

    name: str
    suffixes: tuple[str, ...]
    sniff: Callable[[bytes], bool]
    load: Callable[..., Loaded]
    save: Callable[[IO[bytes], Mapping[str, Any]], None]
    open_reader: Callable[..., TensorReader] | None = None
    open_writer: Callable[..., TensorWriter] | None = None
    offsets: bool = False
    metadata: bool = False
    bfloat16: bool = True
    max_tensors: int | None = None
    needs_torch: bool = False


@contextlib.contextmanager
def opened_for_reader(path: str) -> Iterator[tuple[IO[bytes], int]]:
    """(file, size) for a streaming reader's constructor: the file is closed again if the constructor
    raises; a reader that was built owns it and closes it in ``close()``."""
    f = open(path, "rb")  # noqa: SIM115 - owned by the reader
    try:
        yield f, os.fstat(f.fileno()).st_size
    except BaseException:
        f.close()
        raise


def _readinto_exact(f: IO[bytes], out: np.ndarray | bytearray, label: str, what: str) -> None:
    """Fill ``out`` (C-contiguous) from ``f``; a short read is a truncated file."""
    mv = memoryview(out).cast("B") if isinstance(out, np.ndarray) else memoryview(out)
    got = 0
    while got < len(mv):
        n = f.readinto(mv[got:])
        if not n:
            raise TensorFileError(f"{label}: truncated: {what} needs {len(mv)} bytes, found {got}")
        got += n



def _native(a: np.ndarray) -> np.ndarray:
    """``a`` in native byte order (a copy only for byte-swapped input)."""
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))



#: numpy dtype name -> record dtype name, for the dtypes a tensor file can hold (bfloat16 apart)
RECORD_DTYPE = {n: n for n in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                               "uint64", "float16", "float32", "float64")}


def record_dtype(dt: np.dtype, label: str) -> str:
    """The record dtype name of numpy dtype ``dt`` (TensorFileError for complex and other types)."""
    name = RECORD_DTYPE.get(np.dtype(dt).name)
    if name is None:
        raise TensorFileError(f"{label}: dtype {dt} cannot be compressed (floats, integers and bool only)")
    return name


def _is_torch(t: Any) -> bool:
    return type(t).__module__.startswith("torch") and hasattr(t, "dtype") and hasattr(t, "numpy")



def _nbytes(t: Any) -> int:
    if _is_torch(t):
        return t.numel() * t.element_size()
    return int(np.asarray(t).nbytes)
