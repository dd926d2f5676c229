"""Named-tensor files: load and save .safetensors, .pt/.pth/.bin/.ckpt, .npy and .npz, safely.

Why a package of its own: checkpoints arrive from untrusted places, so every reader here refuses to run
code (no pickles except through ``torch.load(weights_only=True)``), checks every declared size against
the bytes present before it allocates (safetensors header attacks, .npz zip bombs), and every writer is
atomic (temporary file in the destination's directory, then ``os.replace``).

Loaded values are numpy arrays (native byte order), except bfloat16, which numpy cannot represent: those
stay ``torch.Tensor`` (torch is imported lazily, only for .pt files or bfloat16 data).  The only error
raised on purpose is :class:`TensorFileError`; its message names the file and the problem.

Torch checkpoints: the loaded object must be a tensor (a bare array), a mapping of names to tensors (a
state_dict), or a mapping holding one under one of :data:`STATE_DICT_KEYS` (first match wins, e.g.
``{"state_dict": {...}, "epoch": 3}``); the other top-level entries are skipped and listed in
``Loaded.notes``.  Non-tensor entries *inside* the chosen state_dict are refused, not skipped: silently
dropping part of a model would make the round trip lie.

Layout: one module per format behind the same verbs (``sniff``, ``load``, ``save``, and where the
format allows, ``open_reader`` / ``open_writer`` for one tensor at a time, gathered in a
:class:`~mucsc.tensorfiles._common.Format` that also declares what the format can do): :mod:`.safetensors`, :mod:`.numpy_files` (.npy, .npz),
:mod:`.pt` (torch); :mod:`.atomic` holds the atomic writer, :mod:`._common` the error type, ``Loaded``
and the load limits.  This module is the registry and the public entry points; adding a format is
adding one module and one line to ``_REGISTRY``.

May import: :mod:`mucsc.errors` and :mod:`mucsc.optional` (torch on demand); not the codec (the CLI
joins the two).
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Callable, Mapping
from typing import IO, Any

from mucsc.tensorfiles import numpy_files, pt, safetensors
from mucsc.tensorfiles._common import (
    BARE_NAME, LOAD_EXPANSION, LOAD_FLOOR_BYTES, Format, Loaded, TensorFileError, TensorReader, TensorWriter,
    _over_limit, default_max_bytes,
)
from mucsc.tensorfiles.atomic import WriteAll, atomic_open
from mucsc.tensorfiles.pt import NEEDS_TORCH, STATE_DICT_KEYS, _load_torch
# re-exported: names callers used from the single-file module
from mucsc.tensorfiles.safetensors import SAFETENSORS_MAX_HEADER  # noqa: F401

__all__ = [
    "TensorFileError", "Loaded", "load", "save", "atomic_open", "WriteAll", "format_of", "sniff_format",
    "FORMATS", "SUFFIXES", "STATE_DICT_KEYS", "BARE_NAME", "default_max_bytes", "load_limit", "NEEDS_TORCH",
    "Format", "TensorReader", "TensorWriter", "capabilities", "open_reader", "open_writer",
]

#: format name -> its module's verbs, in the order suffixes are listed in messages
_REGISTRY: dict[str, Format] = {
    f.name: f for f in (safetensors.FORMAT, pt.FORMAT, numpy_files.NPZ, numpy_files.NPY)
}
#: file-name suffix (lower-case) -> format name
SUFFIXES: dict[str, str] = {s: f.name for f in _REGISTRY.values() for s in f.suffixes}
FORMATS = tuple(_REGISTRY)


# Defined here, not in _common, so that it reads this module's ``default_max_bytes`` and
# ``LOAD_FLOOR_BYTES``: patching ``tensorfiles.X`` (as the tests do) keeps changing the limit.
def load_limit(file_size: int) -> int:
    """The default ``max_bytes`` of :func:`load` for a file of ``file_size`` bytes:
    LOAD_EXPANSION times its size, at least LOAD_FLOOR_BYTES, at most :func:`default_max_bytes`."""
    return min(default_max_bytes(), max(LOAD_FLOOR_BYTES, LOAD_EXPANSION * file_size))


# ---- format detection ----------------------------------------------------------------------------

def format_of(name: str | os.PathLike) -> str:
    """The format named by a file's suffix, else TensorFileError listing the known suffixes."""
    name = os.fspath(name)
    suffix = os.path.splitext(name)[1].lower()
    try:
        return SUFFIXES[suffix]
    except KeyError:
        known = ", ".join(SUFFIXES)
        what = f"unknown suffix {suffix!r}" if suffix else "no suffix"
        raise TensorFileError(f"{name}: {what}; known tensor file suffixes: {known}") from None


def sniff_format(head: bytes) -> str | None:
    """Guess the format from a file's first bytes (for stdin); None when nothing matches."""
    if numpy_files.sniff_npy(head):
        return "npy"
    if numpy_files.sniff_zip(head):
        return "zip"  # .npz or a torch zip checkpoint: told apart by the members
    if pt.sniff(head):
        return "torch"  # legacy torch.save pickle stream
    if safetensors.sniff(head):
        return "safetensors"
    return None


def _zip_kind(fileobj: IO[bytes]) -> str:
    try:
        with zipfile.ZipFile(fileobj) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError):
        return "npz"  # let the npz reader report the damage
    finally:
        fileobj.seek(0)
    return "torch" if any(n.endswith("data.pkl") for n in names) else "npz"


# ---- loading -------------------------------------------------------------------------------------

def load(source: str | os.PathLike | IO[bytes], *, fmt: str | None = None,
         name: str | None = None, max_bytes: float | None = None,
         wrap: Callable[[IO[bytes]], IO[bytes]] | None = None) -> Loaded:
    """Load named tensors from a path or a binary stream (e.g. stdin).

    ``fmt`` overrides the suffix (required knowledge for streams, which are sniffed when it is None).
    ``name`` is used in messages (defaults to the path, or ``<stdin>``).  ``max_bytes`` bounds what
    loading may allocate: the declared uncompressed size of .npz members (checked before inflating)
    and the bytes of the loaded tensors (checked before anything copies them); default
    :func:`load_limit` of the file's size, ``math.inf`` for none.  ``wrap`` (paths only) wraps the
    opened file, e.g. to count bytes for a progress bar; the file is still parsed in place, never
    buffered whole.
    """
    explicit = max_bytes is not None
    if isinstance(source, (str, os.PathLike)):
        label = name or os.fspath(source)
        loaded, size = _load_path(os.fspath(source), fmt, label, max_bytes, wrap)
    else:
        label = name or "<stdin>"
        loaded, size = _load_from_stream(source, fmt, label, max_bytes)
    limit = max_bytes if explicit else load_limit(size)
    if loaded.nbytes > limit:  # torch views can declare far more than the storages they share
        raise _over_limit(label, "the tensors take", loaded.nbytes, limit, size, explicit)
    return loaded


def _load_path(path: str, fmt: str | None, label: str, max_bytes: float | None,
               wrap: Callable[[IO[bytes]], IO[bytes]] | None) -> tuple[Loaded, int]:
    """:func:`load` of a file: the tensors and the file's size."""
    explicit = max_bytes is not None
    fmt = fmt or format_of(path)
    try:
        if os.path.isdir(path):
            raise TensorFileError(f"{label}: is a directory")
        if fmt == "torch" and wrap is None:
            size = os.path.getsize(path)
            return _load_torch(path, label, max_bytes if explicit else load_limit(size), size, explicit), size
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            limit = max_bytes if explicit else load_limit(size)
            g = f if wrap is None else wrap(f)
            if fmt == "torch":
                return _load_torch(g, label, limit, size, explicit), size
            return _load_stream(g, fmt, label, limit, size, explicit), size
    except OSError as exc:
        raise TensorFileError(f"{label}: {exc.strerror or exc}") from None


def _load_from_stream(source: IO[bytes], fmt: str | None, label: str,
                      max_bytes: float | None) -> tuple[Loaded, int]:
    """:func:`load` of a stream (read whole, its format sniffed when not given): the tensors and its size."""
    explicit = max_bytes is not None
    buf = _read_all(source, label)
    size = len(buf)
    if fmt is None:
        fmt = sniff_format(bytes(buf[:16]))
        if fmt is None:
            raise TensorFileError(f"{label}: not a recognised tensor file (not safetensors, npy, npz "
                                  "or a torch checkpoint)")
    bio = io.BytesIO(buf)
    if fmt == "zip":
        fmt = _zip_kind(bio)
    limit = max_bytes if explicit else load_limit(size)
    loaded = (_load_torch(bio, label, limit, size, explicit) if fmt == "torch"
              else _load_stream(bio, fmt, label, limit, size, explicit))
    return loaded, size


def _read_all(stream: IO[bytes], label: str) -> bytearray:
    buf = bytearray()
    try:
        while chunk := stream.read(1 << 22):
            buf += chunk
    except OSError as exc:
        raise TensorFileError(f"{label}: {exc.strerror or exc}") from None
    return buf


def _load_stream(f: IO[bytes], fmt: str, label: str, limit: float, size: int, explicit: bool) -> Loaded:
    try:
        spec = _REGISTRY[fmt]
    except KeyError:
        raise TensorFileError(f"{label}: unknown format {fmt!r}; known: {', '.join(FORMATS)}") from None
    return spec.load(f, label, limit, size, explicit)


# ---- streaming -----------------------------------------------------------------------------------

def capabilities(fmt: str) -> Format:
    """What format ``fmt`` can do (``open_reader``, ``open_writer``, ``offsets``, ``metadata``,
    ``bfloat16``, ``max_tensors``, ``needs_torch``: see :class:`Format`); callers ask this instead of
    switching on format names."""
    try:
        return _REGISTRY[fmt]
    except KeyError:
        raise TensorFileError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}") from None


def open_reader(path: str | os.PathLike, *, fmt: str | None = None, max_bytes: float | None = None
                ) -> TensorReader | None:
    """``path`` opened for reading one tensor at a time (a :class:`TensorReader`; close it), or None
    when its format cannot (then :func:`load` it).  ``max_bytes`` as :func:`load`'s (checked where the
    format declares sizes before reading: .npz members, .pt tensors)."""
    path = os.fspath(path)
    spec = capabilities(fmt or format_of(path))
    if spec.open_reader is None:
        return None
    explicit = max_bytes is not None
    try:
        if os.path.isdir(path):
            raise TensorFileError(f"{path}: is a directory")
        limit = max_bytes if explicit else load_limit(os.path.getsize(path))
        return spec.open_reader(path, path, limit, explicit)
    except OSError as exc:
        raise TensorFileError(f"{path}: {exc.strerror or exc}") from None


def open_writer(f: IO[bytes], fmt: str, entries: list[tuple[str, str, tuple[int, ...]]],
                metadata: Mapping[str, str] | None = None) -> TensorWriter | None:
    """A :class:`TensorWriter` of format ``fmt`` on the binary stream ``f`` for ``entries`` (name,
    dtype, shape, in the order they will be written), or None when the format cannot stream out (then
    :func:`save` the tensors at once)."""
    spec = capabilities(fmt)
    if spec.open_writer is None:
        return None
    return spec.open_writer(f, list(entries), dict(metadata) if metadata is not None else None)


# ---- saving --------------------------------------------------------------------------------------

#: format name -> writer (looked up at each write, so a test can swap one in)
_WRITERS: dict[str, Callable[[IO[bytes], Mapping[str, Any]], None]] = {
    name: f.save for name, f in _REGISTRY.items()
}


def save(dest: str | os.PathLike | IO[bytes], tensors: Mapping[str, Any] | Any, *,
         fmt: str | None = None, force: bool = False) -> None:
    """Write ``tensors`` (a mapping, or one array/tensor) to a path atomically, or to a stream.

    ``fmt`` defaults to the path's suffix.  Without ``force`` an existing file is never replaced.
    A bare array is stored under :data:`BARE_NAME` in the named formats.
    """
    if not isinstance(tensors, Mapping):
        tensors = {BARE_NAME: tensors}
    if isinstance(dest, (str, os.PathLike)):
        path = os.fspath(dest)
        fmt = fmt or format_of(path)
        with atomic_open(path, force=force) as f:
            _write(f, tensors, fmt, path)
    else:
        if fmt is None:
            raise TensorFileError("a format is needed to write to a stream")
        _write(WriteAll(dest), tensors, fmt, "<stdout>")


def _write(f: IO[bytes], tensors: Mapping[str, Any], fmt: str, label: str) -> None:
    try:
        writer = _WRITERS[fmt]
    except KeyError:
        raise TensorFileError(f"{label}: unknown format {fmt!r}; known: {', '.join(FORMATS)}") from None
    try:
        writer(f, tensors)
    except TensorFileError as exc:
        raise TensorFileError(f"{label}: {exc}") from None
