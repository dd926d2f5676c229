"""safetensors: u64 LE header length, JSON header, one data buffer.  Every declared dtype, shape and
offset is checked against the bytes present before anything is allocated (header attacks)."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from typing import IO, Any

import numpy as np

from mucsc.tensorfiles._common import (
    _MAX_RANK, Format, Loaded, TensorFileError, _is_torch, _native, _readinto_exact,
    opened_for_reader,
)
from mucsc.tensorfiles.pt import _torch, _torch_to_numpy

# safetensors: the reference implementation's limit on the JSON header
SAFETENSORS_MAX_HEADER = 100_000_000
_ST_DTYPES: dict[str, str] = {
    "BOOL": "|b1", "U8": "|u1", "I8": "|i1", "I16": "<i2", "U16": "<u2", "F16": "<f2",
    "I32": "<i4", "U32": "<u4", "F32": "<f4", "I64": "<i8", "U64": "<u8", "F64": "<f8",
}
_ST_NAMES: dict[str, str] = {np.dtype(v).str.lstrip("<|"): k for k, v in _ST_DTYPES.items()}


def sniff(head: bytes) -> bool:
    """A plausible header length followed by the JSON header's opening brace."""
    if len(head) >= 9:
        (n,) = struct.unpack_from("<Q", head)
        return 2 <= n <= SAFETENSORS_MAX_HEADER and head[8:9] == b"{"
    return False


def load(f: IO[bytes], label: str, limit: float, size: int, explicit: bool) -> Loaded:
    """Load a safetensors file (its own checks bound every allocation by the file's size)."""
    return _load_safetensors(f, label, size)


def _load_safetensors(f: IO[bytes], label: str, size: int) -> Loaded:
    """Parse a safetensors file: u64 LE header length, JSON header, one data buffer (checked by
    :func:`_read_header` before any allocation)."""
    entries, data_len, _ = _read_header(f, label, size)
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


def _read_header(f: IO[bytes], label: str, size: int) -> tuple[list, int, dict[str, str] | None]:
    """(entries (key, dtype, shape, (begin, end)) in header order, data length, __metadata__) of a
    safetensors file of ``size`` bytes, read from its start; ``f`` is left at the data.

    Checked: header length against the file and SAFETENSORS_MAX_HEADER; every tensor's dtype, shape
    and offsets; offsets contiguous from 0, non-overlapping, without holes and ending exactly at the
    end of the file; byte count == prod(shape) * itemsize.
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
    return entries, data_len, metadata


class Reader:
    """A safetensors file read one tensor at a time (``os.pread`` of its byte range, no torch:
    bfloat16 comes as uint16 bit patterns).  The header is checked as :func:`load` checks it."""

    bare = False
    notes: tuple[str, ...] = ()

    def __init__(self, path: str, label: str, limit: float = math.inf, explicit: bool = False) -> None:
        with opened_for_reader(path) as (self._f, size):
            found, _, self.metadata = _read_header(self._f, label, size)
            self._start = self._f.tell()
        self._label = label
        self._spans = [(dt, shape, b, e) for _, dt, shape, (b, e) in found]
        self.entries = [(key, "bfloat16" if dt == "BF16" else np.dtype(_ST_DTYPES[dt]).name, shape)
                        for key, dt, shape, _ in found]

    def read(self, i: int) -> np.ndarray:
        dt, shape, b, e = self._spans[i]
        arr = np.empty(math.prod(shape), np.uint16 if dt == "BF16" else np.dtype(_ST_DTYPES[dt]))
        mv = memoryview(arr).cast("B")
        got = 0
        while got < e - b:
            n = os.preadv(self._f.fileno(), [mv[got:]], self._start + b + got)
            if n <= 0:
                raise TensorFileError(f"{self._label}: truncated while reading {self.entries[i][0]!r}")
            got += n
        return _native(arr.reshape(shape))

    def close(self) -> None:
        self._f.close()


class Writer:
    """A safetensors file written one tensor at a time: the header (every entry's dtype, shape and
    offsets, in the order given) first, then each tensor's bytes as :meth:`write` receives them, in
    that order.  bfloat16 tensors come as uint16 bit patterns (or torch tensors); no torch needed."""

    def __init__(self, f: IO[bytes], entries: list[tuple[str, str, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None) -> None:
        header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
        self._order: list[tuple[str, str, int]] = []
        offset = 0
        for key, dtype, shape in entries:
            st = "BF16" if dtype == "bfloat16" else _ST_NAMES.get(np.dtype(dtype).str.lstrip("<>|="))
            if st is None:
                raise TensorFileError(f"tensor {key!r}: dtype {dtype} cannot be stored in safetensors")
            n = math.prod(shape) * (2 if st == "BF16" else np.dtype(_ST_DTYPES[st]).itemsize)
            header[key] = {"dtype": st, "shape": list(shape), "data_offsets": [offset, offset + n]}
            self._order.append((key, st, n))
            offset += n
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-(8 + len(raw)) % 8)
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        self._f, self._next = f, 0

    def write(self, name: str, values: Any) -> None:
        if self._next >= len(self._order) or self._order[self._next][0] != name:
            expected = self._order[self._next][0] if self._next < len(self._order) else "nothing"
            raise TensorFileError(f"tensor {name!r} written out of order (expected {expected!r})")
        key, st, n = self._order[self._next]
        if st == "BF16" and isinstance(values, np.ndarray):
            data = memoryview(np.ascontiguousarray(values, np.uint16).reshape(-1)).cast("B")
        else:
            data = _st_bytes(key, values)[2]
        if len(data) != n:
            raise TensorFileError(f"tensor {name!r}: {len(data)} bytes, its entry declares {n}")
        self._f.write(data)
        self._next += 1

    def finish(self) -> None:
        if self._next != len(self._order):
            raise TensorFileError(f"{len(self._order) - self._next} tensors were never written")


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
    torch = _torch()
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
        torch = _torch()
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



save = _save_safetensors
FORMAT = Format("safetensors", (".safetensors",), sniff, load, save, open_reader=Reader, open_writer=Writer,
                offsets=True, metadata=True)
