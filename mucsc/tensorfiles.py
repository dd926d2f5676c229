"""Named-tensor files: load and save .safetensors, .pt/.pth/.bin/.ckpt, .npy and .npz, safely.

Why a module of its own: checkpoints arrive from untrusted places, so every reader here refuses to run
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
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import re
import struct
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterator, Mapping
from typing import IO, Any

import numpy as np

from mucsc.errors import MucscError

__all__ = [
    "TensorFileError", "Loaded", "load", "save", "atomic_open", "WriteAll", "format_of", "sniff_format",
    "FORMATS", "SUFFIXES", "STATE_DICT_KEYS", "BARE_NAME", "default_max_bytes", "load_limit",
]

#: file-name suffix (lower-case) -> format name
SUFFIXES: dict[str, str] = {
    ".safetensors": "safetensors",
    ".pt": "torch", ".pth": "torch", ".bin": "torch", ".ckpt": "torch",
    ".npz": "npz",
    ".npy": "npy",
}
FORMATS = ("safetensors", "torch", "npz", "npy")
#: keys searched, in order, for a state_dict inside a torch checkpoint dict
STATE_DICT_KEYS = ("state_dict", "model_state_dict", "model", "module", "net", "weights", "params")
#: name given to a bare array when it is written to a named-tensor format
BARE_NAME = "arr_0"

# safetensors: the reference implementation's limit on the JSON header
SAFETENSORS_MAX_HEADER = 100_000_000
_ST_DTYPES: dict[str, str] = {
    "BOOL": "|b1", "U8": "|u1", "I8": "|i1", "I16": "<i2", "U16": "<u2", "F16": "<f2",
    "I32": "<i4", "U32": "<u4", "F32": "<f4", "I64": "<i8", "U64": "<u8", "F64": "<f8",
}
_ST_NAMES: dict[str, str] = {np.dtype(v).str.lstrip("<|"): k for k, v in _ST_DTYPES.items()}
_MAX_RANK = 64
_NPZ_MAX_MEMBERS = 1_000_000
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


def load_limit(file_size: int) -> int:
    """The default ``max_bytes`` of :func:`load` for a file of ``file_size`` bytes:
    LOAD_EXPANSION times its size, at least LOAD_FLOOR_BYTES, at most :func:`default_max_bytes`."""
    return min(default_max_bytes(), max(LOAD_FLOOR_BYTES, LOAD_EXPANSION * file_size))


def _over_limit(label: str, what: str, nbytes: int, limit: float, size: int, explicit: bool) -> TensorFileError:
    why = ("the limit given" if explicit else
           f"the default limit for loading a {size}-byte file ({LOAD_EXPANSION}x its size, at least "
           f"{LOAD_FLOOR_BYTES >> 20} MiB)")
    return TensorFileError(f"{label}: {what} {nbytes} bytes, over {why} of {limit:.0f} bytes (a zip bomb or "
                           "crafted views?); if you trust the file, allow more with --max-memory SIZE|none "
                           "(tensorfiles.load(max_bytes=...))")


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
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "zip"  # .npz or a torch zip checkpoint: told apart by the members
    if head.startswith(b"\x80") and len(head) >= 2 and head[1] in range(2, 6):
        return "torch"  # legacy torch.save pickle stream
    if len(head) >= 9:
        (n,) = struct.unpack_from("<Q", head)
        if 2 <= n <= SAFETENSORS_MAX_HEADER and head[8:9] == b"{":
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
        path = os.fspath(source)
        label = name or path
        fmt = fmt or format_of(path)
        try:
            if os.path.isdir(path):
                raise TensorFileError(f"{label}: is a directory")
            if fmt == "torch" and wrap is None:
                size = os.path.getsize(path)
                loaded = _load_torch(path, label)
            else:
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    limit = max_bytes if explicit else load_limit(size)
                    g = f if wrap is None else wrap(f)
                    if fmt == "torch":
                        loaded = _load_torch(g, label)
                    else:
                        loaded = _load_stream(g, fmt, label, limit, size, explicit)
        except OSError as exc:
            raise TensorFileError(f"{label}: {exc.strerror or exc}") from None
    else:
        label = name or "<stdin>"
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
        loaded = _load_torch(bio, label) if fmt == "torch" else _load_stream(bio, fmt, label, limit, size, explicit)
    limit = max_bytes if explicit else load_limit(size)
    if loaded.nbytes > limit:  # torch views can declare far more than the storages they share
        raise _over_limit(label, "the tensors take", loaded.nbytes, limit, size, explicit)
    return loaded


def _read_all(stream: IO[bytes], label: str) -> bytearray:
    buf = bytearray()
    try:
        while chunk := stream.read(1 << 22):
            buf += chunk
    except OSError as exc:
        raise TensorFileError(f"{label}: {exc.strerror or exc}") from None
    return buf


def _load_stream(f: IO[bytes], fmt: str, label: str, limit: float, size: int, explicit: bool) -> Loaded:
    if fmt == "safetensors":
        return _load_safetensors(f, label, size)
    if fmt == "npy":
        arr = _read_npy(f, label, size)
        return Loaded({BARE_NAME: arr}, "npy", bare=True)
    if fmt == "npz":
        return _load_npz(f, label, limit, size, explicit)
    raise TensorFileError(f"{label}: unknown format {fmt!r}; known: {', '.join(FORMATS)}")


def _readinto_exact(f: IO[bytes], out: np.ndarray | bytearray, label: str, what: str) -> None:
    """Fill ``out`` (C-contiguous) from ``f``; a short read is a truncated file."""
    mv = memoryview(out).cast("B") if isinstance(out, np.ndarray) else memoryview(out)
    got = 0
    while got < len(mv):
        n = f.readinto(mv[got:])
        if not n:
            raise TensorFileError(f"{label}: truncated: {what} needs {len(mv)} bytes, found {got}")
        got += n


# ---- safetensors ---------------------------------------------------------------------------------

def _load_safetensors(f: IO[bytes], label: str, size: int) -> Loaded:
    """Parse a safetensors file: u64 LE header length, JSON header, one data buffer.

    Checked before any allocation: header length against the file and SAFETENSORS_MAX_HEADER; every
    tensor's dtype, shape and offsets; offsets contiguous from 0, non-overlapping, without holes and
    ending exactly at the end of the file; byte count == prod(shape) * itemsize.
    """
    if size < 8:
        raise TensorFileError(f"{label}: not a safetensors file: {size} bytes, the header length "
                              "alone takes 8")
    head = f.read(8)
    (n,) = struct.unpack("<Q", head)
    if n > SAFETENSORS_MAX_HEADER:
        raise TensorFileError(f"{label}: safetensors header length {n} exceeds the limit "
                              f"{SAFETENSORS_MAX_HEADER}")
    if n > size - 8:
        raise TensorFileError(f"{label}: safetensors header length {n} runs past the end of the "
                              f"file ({size} bytes)")
    raw = f.read(n)
    if len(raw) != n:
        raise TensorFileError(f"{label}: truncated safetensors header")
    header = _parse_st_header(raw, label)
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (isinstance(metadata, dict)
                                     and all(isinstance(v, str) for v in metadata.values())):
        raise TensorFileError(f"{label}: safetensors __metadata__ must map strings to strings")
    data_len = size - 8 - n
    entries = []
    for key, info in header.items():
        entries.append((key, *_st_entry(key, info, label)))
    # offsets: sorted by start they must tile [0, data_len) exactly (no holes, no overlap)
    end = 0
    for key, dt, shape, (b, e) in sorted(entries, key=lambda t: (t[3][0], t[3][1])):
        if b != end:
            problem = "overlap" if b < end else "leave a hole"
            raise TensorFileError(f"{label}: safetensors offsets of {key!r} {problem} "
                                  f"(starts at {b}, previous tensor ends at {end})")
        end = e
    if end != data_len:
        raise TensorFileError(f"{label}: safetensors data is {data_len} bytes but the tensors "
                              f"cover {end}" + (" (truncated file)" if end > data_len else ""))
    buf = bytearray(data_len)
    _readinto_exact(f, buf, label, "the safetensors data")
    tensors: dict[str, Any] = {}
    for key, dt, shape, (b, e) in entries:
        if dt == "BF16":
            tensors[key] = _bf16_from_bytes(memoryview(buf)[b:e], shape)
        else:
            arr = np.frombuffer(buf, dtype=np.dtype(_ST_DTYPES[dt]), count=math.prod(shape), offset=b)
            tensors[key] = _native(arr.reshape(shape))
    return Loaded(tensors, "safetensors")


def _parse_st_header(raw: bytes, label: str) -> dict:
    def no_duplicates(pairs: list) -> dict:
        d = dict(pairs)
        if len(d) != len(pairs):
            raise TensorFileError(f"{label}: safetensors header has duplicate names")
        return d

    try:
        text = raw.decode("utf-8")
        header = json.loads(text, object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise TensorFileError(f"{label}: safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise TensorFileError(f"{label}: safetensors header is not a JSON object")
    return header


def _st_entry(key: str, info: Any, label: str) -> tuple[str, tuple[int, ...], tuple[int, int]]:
    where = f"{label}: safetensors tensor {key!r}"
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise TensorFileError(f"{where}: needs exactly dtype, shape and data_offsets")
    dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
    if dt not in _ST_DTYPES and dt != "BF16":
        raise TensorFileError(f"{where}: unsupported dtype {dt!r}")
    if (not isinstance(shape, list) or len(shape) > _MAX_RANK
            or not all(type(s) is int and s >= 0 for s in shape)):
        raise TensorFileError(f"{where}: bad shape {shape!r}")
    if (not isinstance(offs, list) or len(offs) != 2
            or not all(type(o) is int and o >= 0 for o in offs) or offs[0] > offs[1]):
        raise TensorFileError(f"{where}: bad data_offsets {offs!r}")
    itemsize = 2 if dt == "BF16" else np.dtype(_ST_DTYPES[dt]).itemsize
    need = math.prod(shape) * itemsize
    if need != offs[1] - offs[0]:
        raise TensorFileError(f"{where}: shape {shape} of {dt} needs {need} bytes but its offsets "
                              f"span {offs[1] - offs[0]}")
    return dt, tuple(shape), (offs[0], offs[1])


def _bf16_from_bytes(mv: memoryview, shape: tuple[int, ...]) -> Any:
    torch = require_torch()
    raw = torch.frombuffer(mv, dtype=torch.int16) if len(mv) else torch.empty(0, dtype=torch.int16)
    return raw.view(torch.bfloat16).reshape(shape)


def _save_safetensors(f: IO[bytes], tensors: Mapping[str, Any]) -> None:
    """Write the safetensors layout: header padded with spaces to 8 bytes, data in given order."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    parts = []
    offset = 0
    for key, t in tensors.items():
        dt, shape, data = _st_bytes(key, t)
        header[key] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        parts.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-(8 + len(raw)) % 8)
    f.write(struct.pack("<Q", len(raw)))
    f.write(raw)
    for data in parts:
        f.write(data)


def _st_bytes(key: str, t: Any) -> tuple[str, tuple[int, ...], memoryview]:
    if _is_torch(t):
        torch = require_torch()
        if t.dtype == torch.bfloat16:
            raw = t.detach().contiguous().view(torch.int16).numpy()
            return "BF16", tuple(t.shape), memoryview(raw).cast("B")
        t = _torch_to_numpy(t, key)
    a = np.asarray(t)
    name = _ST_NAMES.get(a.dtype.str.lstrip("<>|="))
    if name is None:
        raise TensorFileError(f"tensor {key!r}: dtype {a.dtype} cannot be stored in safetensors")
    a = np.asarray(a, dtype=np.dtype(_ST_DTYPES[name]), order="C")
    return name, a.shape, memoryview(a.reshape(-1)).cast("B")


# ---- npy / npz -----------------------------------------------------------------------------------

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


# ---- torch ---------------------------------------------------------------------------------------

def require_torch() -> Any:
    """torch (>= 2.6, for safe loading), or a TensorFileError saying it is needed."""
    try:
        import torch
    except ImportError:
        raise TensorFileError("torch is needed for .pt files and bfloat16 tensors: "
                              "pip install 'mucsc[torch]'") from None
    major, minor = (int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    if (major, minor) < (2, 6):
        # CVE-2025-32434: weights_only=True could still execute code before torch 2.6
        raise TensorFileError(f"torch {torch.__version__} is too old to load checkpoints safely "
                              "(CVE-2025-32434); torch >= 2.6 is required")
    return torch


def _is_torch(t: Any) -> bool:
    return type(t).__module__.startswith("torch") and hasattr(t, "dtype") and hasattr(t, "numpy")


def _torch_to_numpy(t: Any, key: str, fmt: str | None = None) -> np.ndarray:
    torch = require_torch()
    if t.dtype == torch.bfloat16:
        raise TensorFileError(f"tensor {key!r}: bfloat16 cannot be stored in .{fmt} "
                              "(write .safetensors or .pt)")
    try:
        return t.detach().cpu().resolve_conj().resolve_neg().numpy()
    except (TypeError, RuntimeError) as exc:
        raise TensorFileError(f"tensor {key!r}: {t.dtype} has no numpy equivalent ({exc})") from None


def _load_torch(src: str | IO[bytes], label: str) -> Loaded:
    torch = require_torch()
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": noise on a CLI
            warnings.simplefilter("ignore")
            obj = torch.load(src, weights_only=True, map_location="cpu")
    except Exception as exc:  # noqa: BLE001 - torch raises many types; all mean "cannot load"
        raise TensorFileError(f"{label}: {_torch_load_problem(exc)}") from None
    if isinstance(obj, torch.Tensor):
        return Loaded({BARE_NAME: _from_torch(obj, label, "tensor")}, "torch", bare=True)
    if not isinstance(obj, Mapping):
        raise TensorFileError(f"{label}: holds a {type(obj).__name__}, not a state_dict "
                              "(a mapping of names to tensors)")
    notes: list[str] = []
    state = obj
    if not _all_tensors(obj, torch):
        for k in STATE_DICT_KEYS:
            if isinstance(obj.get(k), Mapping) and obj[k] and _all_tensors(obj[k], torch):
                state = obj[k]
                skipped = [repr(s) for s in obj if s != k]
                notes.append(f"{label}: using checkpoint[{k!r}]"
                             + (f"; skipped {', '.join(skipped[:8])}" if skipped else "")
                             + (" ..." if len(skipped) > 8 else ""))
                break
    bad = [(k, v) for k, v in state.items() if not (isinstance(k, str) and isinstance(v, torch.Tensor))]
    if bad:
        shown = ", ".join(f"{k!r} ({type(v).__name__})" for k, v in bad[:3])
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        hint = (f"; no state_dict found under {', '.join(map(repr, STATE_DICT_KEYS))}"
                if state is obj else "")
        raise TensorFileError(f"{label}: not a state_dict of tensors: entries {shown}{more} are not "
                              f"named tensors{hint}")
    tensors = {k: _from_torch(v, label, k) for k, v in state.items()}
    return Loaded(tensors, "torch", notes=tuple(notes))


def _all_tensors(m: Mapping, torch: Any) -> bool:
    return all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in m.items())


def _from_torch(t: Any, label: str, key: str) -> Any:
    """A loaded tensor as a numpy view (no copy), or the tensor itself for bfloat16."""
    torch = require_torch()
    if t.layout != torch.strided or t.is_quantized:
        raise TensorFileError(f"{label}: tensor {key!r} is {t.layout} / quantized; only dense "
                              "tensors are supported")
    if t.dtype == torch.bfloat16:
        return t.detach()
    try:
        return _native(t.detach().resolve_conj().resolve_neg().numpy())
    except (TypeError, RuntimeError):
        raise TensorFileError(f"{label}: tensor {key!r} has dtype {t.dtype}, which is not "
                              "supported") from None


def _torch_load_problem(exc: BaseException) -> str:
    """One readable clause out of torch's multi-paragraph load errors."""
    text = str(exc)
    m = re.search(r"Unsupported global: ([^\n]*)", text)
    if m:
        return ("refused: the checkpoint is not plain tensors, loading it would call "
                f"{m.group(1).strip().rstrip('.')}; mucsc loads .pt files only with "
                "torch.load(weights_only=True)")
    m = re.search(r"WeightsUnpickler error: \s*([^\n]+)", text)
    if m:
        return (f"not a torch checkpoint that torch.load(weights_only=True) can read "
                f"({m.group(1).strip()})")
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    first = first.split(". ")[0].rstrip(".")
    return f"not a readable torch checkpoint ({first[:300]})"


def _save_torch(f: IO[bytes], tensors: Mapping[str, Any]) -> None:
    torch = require_torch()
    out = {}
    for key, t in tensors.items():
        if not _is_torch(t):
            a = np.asarray(t)
            t = torch.from_numpy(a if a.flags.writeable else a.copy())
        out[key] = t
    torch.save(out, f)


# ---- saving --------------------------------------------------------------------------------------

_WRITERS = {"safetensors": _save_safetensors, "npz": _save_npz, "npy": _save_npy, "torch": _save_torch}


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


class WriteAll(io.RawIOBase):
    """A write-only stream that never loses a short write.

    Seen here: when the reader of a pipe exits mid-write, ``sys.stdout.buffer.write`` returned the
    partial count instead of raising; this wrapper retries the rest, so the next write raises EPIPE.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__()
        self._stream = stream

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        mv = memoryview(data).cast("B")
        total = len(mv)
        while len(mv):
            n = self._stream.write(mv)
            if not n:
                raise BrokenPipeError(32, "short write")
            mv = mv[n:]
        return total

    def flush(self) -> None:
        self._stream.flush()


def _write(f: IO[bytes], tensors: Mapping[str, Any], fmt: str, label: str) -> None:
    try:
        writer = _WRITERS[fmt]
    except KeyError:
        raise TensorFileError(f"{label}: unknown format {fmt!r}; known: {', '.join(FORMATS)}") from None
    try:
        writer(f, tensors)
    except TensorFileError as exc:
        raise TensorFileError(f"{label}: {exc}") from None


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, *, force: bool = False) -> Iterator[IO[bytes]]:
    """Open a temporary file beside ``path``; on success it becomes ``path``, on any error it vanishes.

    Without ``force`` an existing ``path`` is refused up front and, at the end, the rename is done with
    ``os.link`` so a file created meanwhile is not clobbered either.
    """
    path = os.fspath(path)
    if not force and os.path.lexists(path):
        raise TensorFileError(f"{path}: already exists (use -f to overwrite)")
    if os.path.isdir(path):
        raise TensorFileError(f"{path}: is a directory")
    directory = os.path.dirname(path) or "."
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp", dir=directory)
    except OSError as exc:
        raise TensorFileError(f"{path}: cannot create a file in {directory}: "
                              f"{exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), 0o666 & ~_umask())
        _commit(tmp, path, force)
    except BaseException as exc:  # also SIGTERM/SIGHUP, which the CLI turns into an exception
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # e.g. ENOSPC: name the file, not only the errno
            raise TensorFileError(f"{path}: {exc.strerror or exc}") from None
        raise


def _commit(tmp: str, path: str, force: bool) -> None:
    if force:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)  # fails if path appeared meanwhile; never overwrites
    except FileExistsError:
        raise TensorFileError(f"{path}: already exists (use -f to overwrite)") from None
    except OSError:  # file systems without hard links
        if os.path.lexists(path):
            raise TensorFileError(f"{path}: already exists (use -f to overwrite)") from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ---- small helpers -------------------------------------------------------------------------------

def _native(a: np.ndarray) -> np.ndarray:
    """``a`` in native byte order (a copy only for byte-swapped input)."""
    return a if a.dtype.isnative else a.astype(a.dtype.newbyteorder("="))


def _nbytes(t: Any) -> int:
    if _is_torch(t):
        return t.numel() * t.element_size()
    return int(np.asarray(t).nbytes)
