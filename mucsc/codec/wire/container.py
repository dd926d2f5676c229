"""The mucsc container, versions 1.0 to 1.2 (normative description: spec/FORMAT.md).

Layout: a 24-byte preamble, ``section_count`` sections (32-byte section header, payload, zero padding
to 8 bytes), then a CRC-32 of everything before it.  The first section is HEAD, a canonical JSON record
table.  Format 1.1 may append an authentication trailer after the CRC (flag bit 0; the tag itself is
computed and checked by :mod:`mucsc.codec.wire.auth`).  This module knows nothing about codecs or keys: it
frames, (de)compresses, checks and limits bytes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

import numpy as np
import zstandard

from mucsc.codec import parallel
from mucsc.codec.wire.zstdframe import ZstdFrame
from mucsc.errors import ChecksumError, FormatError, LimitError, TruncatedError, VersionError

#: ``read(offset, n)``: n bytes of a message from ``offset`` (a slice of a buffer, or a file's pread)
Reader = Callable[[int, int], Any]

MAGIC = b"\x89MUC\r\n\x1a\n"  # like PNG: high bit, CR-LF, ^Z and LF catch text-mode mangling
MAJOR, MINOR = 1, 2  # the newest version this module reads and writes; writers emit the oldest that fits

PREAMBLE = struct.Struct("<8sBBHIQ")  # magic, major, minor, flags, section_count, total_length
SECTION = struct.Struct("<4sIBBHIQQ")  # tag, group, encoding, 3 reserved (u8, u16, u32), stored, raw
TRAILER = struct.Struct("<I")  # CRC-32 (ISO-HDLC, as zlib.crc32) of all preceding bytes
ALIGN = 8

# Format 1.1: an authentication trailer follows the CRC-32 (FORMAT.md 2.5).  total_length then
# counts the body only (preamble to CRC), so a 1.0 view of the body is unchanged.
FLAG_AUTH = 0x0001
KNOWN_FLAGS = FLAG_AUTH
AUTH_HEADER = struct.Struct("<BBH")  # algorithm, key_id_length, tag_length; then key id, then tag
MAX_KEY_ID_BYTES = 64

MESSAGE_GROUP = 0xFFFFFFFF  # group index of message-level sections (HEAD)
ENC_RAW, ENC_ZSTD = 0, 1
ENCODINGS = {ENC_RAW: "raw", ENC_ZSTD: "zstd"}

# Limits (FORMAT.md "Limits").  Decoders MUST enforce them before allocating.
MAX_HEADER_BYTES = 16 << 20
MAX_SECTIONS = 1 << 20
MAX_RECORDS = 1 << 20
MAX_RANK = 32
MAX_NAME_BYTES = 1024
MAX_ELEMENTS = 1 << 40
DEFAULT_ZSTD_LEVEL = 3  # the zstd level of compressed sections unless the caller names one
MAX_ZSTD_RATIO = 1 << 15  # a zstd frame cannot expand more than this (RLE blocks: 4 bytes per 128 KiB)
MAX_JSON_DEPTH = 32  # HEAD nests 4 deep; checked before parsing (deep nesting would exhaust the stack)

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")
INT_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
RECORD_DTYPES = FLOAT_DTYPES + INT_DTYPES
ITEMSIZE = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
            "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8}


@dataclasses.dataclass(frozen=True)
class Record:
    """One named tensor of the message."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * ITEMSIZE[self.dtype]


@dataclasses.dataclass(frozen=True)
class Group:
    """Records encoded together as one flat vector by one codec (one codebook when shared)."""

    codec: str
    params: dict[str, Any]
    records: tuple[int, ...]
    dtype: str  # the dtype the codec works in: float32/float64, or the record dtype for "raw"


@dataclasses.dataclass(frozen=True)
class Header:
    """The HEAD section: the record table."""

    records: tuple[Record, ...]
    groups: tuple[Group, ...]
    container: str = "dict"  # "tensor": the message holds one bare array; "dict": a mapping
    meta: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_json(self) -> bytes:
        obj = {
            "container": self.container,
            "groups": [{"codec": g.codec, "dtype": g.dtype, "params": g.params, "records": list(g.records)}
                       for g in self.groups],
            "meta": self.meta,
            "records": [{"dtype": r.dtype, "name": r.name, "shape": list(r.shape)} for r in self.records],
        }
        return canonical_json(obj)


@dataclasses.dataclass(frozen=True)
class SectionInfo:
    """Where a section sits in a message and how it is stored."""

    tag: str
    group: int
    encoding: str
    stored_bytes: int
    raw_bytes: int
    offset: int  # offset of the payload in the message


@dataclasses.dataclass(frozen=True)
class AuthTrailer:
    """The authentication trailer of a 1.1 message: who signed, with what, and where the tag is.

    The tag covers bytes ``[0, tag_offset)`` of the message (plus a context that is not stored).
    """

    algorithm: int
    key_id: str
    tag_offset: int
    tag: bytes

    @property
    def size(self) -> int:
        """Bytes the trailer adds to the message (header, key id and tag)."""
        return AUTH_HEADER.size + len(self.key_id.encode("utf-8")) + len(self.tag)


@dataclasses.dataclass(frozen=True)
class Frame:
    """What the preamble and the trailer say, read without touching any section."""

    minor: int
    flags: int
    section_count: int
    body_length: int  # preamble to CRC-32 inclusive: the 1.0 ``total_length``
    auth: AuthTrailer | None


class AuthWriter(Protocol):
    """What :func:`write_message` needs to append a trailer (implemented in :mod:`mucsc.codec.wire.auth`)."""

    algorithm: int
    key_id: str
    tag_length: int

    def tag(self, covered: Iterable[bytes | memoryview]) -> bytes:
        """The tag over the concatenation of ``covered`` (every byte before the tag)."""


@dataclasses.dataclass(frozen=True)
class Message:
    """A parsed, checked message: header, section table, and raw (decompressed on demand) payloads."""

    header: Header
    sections: tuple[SectionInfo, ...]
    size: int
    minor: int
    _blob: memoryview
    auth: AuthTrailer | None = None

    def payload(self, s: SectionInfo) -> memoryview:
        """The raw (decompressed) payload of a section, bounded by its declared raw length."""
        stored = self._blob[s.offset: s.offset + s.stored_bytes]
        if s.encoding == "raw":
            return stored
        return memoryview(zstd_decompress_bounded(stored, s.raw_bytes, s.tag))

    def group_sections(self, group: int, max_raw: int | None = None) -> GroupSections:
        """A group's critical sections by tag, decompressed only when read (see :class:`GroupSections`)."""
        return GroupSections(self, {s.tag: s for s in self.sections if s.group == group and is_critical(s.tag)},
                             max_raw)


class GroupSections(Mapping):
    """A group's critical sections by tag (a read-only mapping tag -> raw payload).

    A payload is decompressed on first access only, after its declared raw length has passed the
    checks: ``max_raw`` (the bound the caller derives from the group's element count) and, through
    :meth:`raw_size`, the exact length a codec expects before it reads a section.  :meth:`unread`
    lists the critical sections nobody read: a codec that did not read one does not understand it,
    and FORMAT.md 2.3 requires rejecting the message then.
    """

    def __init__(self, msg: Message, infos: dict[str, SectionInfo], max_raw: int | None) -> None:
        self._msg, self._infos, self._max_raw = msg, infos, max_raw
        self._cache: dict[str, memoryview | ZstdStream] = {}  # a stream until read whole

    def raw_size(self, tag: str) -> int:
        """The declared raw length of section ``tag`` (nothing is decompressed)."""
        return self._infos[tag].raw_bytes

    def __getitem__(self, tag: str) -> memoryview:
        if tag not in self._cache:
            self._cache[tag] = self._msg.payload(self._checked(tag))
        got = self._cache[tag]
        if isinstance(got, ZstdStream):  # streamed before: whatever is left is decompressed now
            self._cache[tag] = got = got.complete()
        return got

    def stream(self, tag: str) -> memoryview | ZstdStream:
        """Section ``tag`` for a reader that consumes it front to back: a :class:`ZstdStream` that
        decompresses it progressively when it is a zstd section not read yet, else its payload."""
        if tag in self._cache:
            return self[tag]
        info = self._checked(tag)
        if info.encoding != "zstd":
            return self[tag]
        stored = self._msg._blob[info.offset: info.offset + info.stored_bytes]
        self._cache[tag] = got = ZstdStream(stored, info.raw_bytes, tag)
        return got

    def _checked(self, tag: str) -> SectionInfo:
        info = self._infos[tag]
        if self._max_raw is not None and info.raw_bytes > self._max_raw:
            raise LimitError(f"section {tag!r} of group {info.group} declares {info.raw_bytes} bytes, "
                             f"more than {self._max_raw} for the group's elements")
        return info

    def __contains__(self, tag: object) -> bool:
        return tag in self._infos

    def __iter__(self) -> Iterator[str]:
        return iter(self._infos)

    def __len__(self) -> int:
        return len(self._infos)

    def unread(self) -> list[str]:
        """Tags of the critical sections never read."""
        return [t for t in self._infos if t not in self._cache]


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8, no NaN: the same header always gives the same bytes."""
    return _CANONICAL.encode(obj).encode("utf-8")


# json.dumps with these options builds a new encoder per call (~1 us of a small message's HEAD)
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def is_critical(tag: str) -> bool:
    """Upper-case first letter: critical (must be understood); lower-case: ancillary (may be skipped)."""
    return tag[:1].isupper()


def padding(n: int) -> int:
    return (-n) % ALIGN


def message_size(payload_sizes: Iterable[int]) -> int:
    """Exact message length for the given stored section payload sizes (HEAD included)."""
    return PREAMBLE.size + sum(SECTION.size + s + padding(s) for s in payload_sizes) + TRAILER.size


# ---------------------------------------------------------------------------------------------- writing

def _compressor(zstd_level: int, threads: int = 1) -> zstandard.ZstdCompressor:
    """zstd's multi-threaded mode: the same frame for any ``threads`` (``parallel.zstd_compressor``)."""
    return parallel.zstd_compressor(zstd_level, threads)


def _frame(data: Any, compressible: Any, level: int | None, cctx: Any) -> bytes:
    """zstd's frame of the host bytes ``data`` at ``level`` (by ``cctx``), or the codec's own."""
    if isinstance(compressible, ZstdFrame) and compressible.level == level:
        return compressible.frame
    return cctx.compress(data)


def section_bytes(data: Any, compressible: bool | ZstdFrame, zstd_level: int | None) -> int:
    """Bytes one section adds to a message written by :func:`write_message` with ``zstd_level``:
    its 32-byte header, the payload as it would be stored (zstd when strictly smaller) and padding.
    Rate control uses it to know exact sizes before writing."""
    raw = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    stored = len(raw)
    if compressible and zstd_level is not None and stored > 0:
        stored = min(stored, len(_frame(raw, compressible, zstd_level, _compressor(zstd_level))))
    return SECTION.size + stored + padding(stored)


class Payload(Protocol):
    """A section payload that is not host bytes yet, e.g. packed IDs on a GPU
    (``torch_transfer.DeviceBytes``): the writer copies it straight into the message, and brings it
    to the host as bytes of its own only when it compresses it."""

    nbytes: int

    def host(self) -> Any:
        """The bytes on the host (a buffer of ``nbytes`` bytes)."""

    def write_into(self, out: memoryview) -> int:
        """Copy the bytes into ``out`` (``nbytes`` long); return their CRC-32 (as ``zlib.crc32``)."""


def write_message(header: Header, sections: Iterable[tuple[int, str, Any, bool]], *,
                  zstd_level: int | None = 3, flags: int = 0, auth: AuthWriter | None = None,
                  minor: int = 0, threads: int = 1, head: bytes | None = None) -> bytes:
    """Serialise a message.  ``sections`` yields (group, tag, payload, compressible); a payload is
    bytes-like or a :class:`Payload`.

    ``minor``: the version to declare, the oldest that can represent the message (a message using
    no 1.1 feature is written as 1.0, byte-identical to what a 1.0 writer produces).

    A compressible payload is stored zstd-compressed when that is strictly smaller (``zstd_level``
    None: never).  The HEAD section is written first.  ``minor``: the format minor version the
    sections need (0 unless a group uses a 1.1 or 1.2 feature, such as rANS-coded IDs); with ``auth`` the
    message is 1.1 with an authentication trailer.  Writers emit the oldest version that fits.
    ``threads``: zstd worker threads (the bytes do not depend on it, see ``parallel.zstd_compressor``).
    ``head``: ``header.to_json()`` when the caller already has it (it is not built twice).

    The message is allocated once at its final size and every part is copied into it once, its
    CRC-32 taken in the same pass (``parallel.copy_crc32``; a :class:`Payload` brings its own CRC).
    A small unauthenticated message of host bytes is checksummed part by part and joined once
    (:data:`SMALL_MESSAGE`).
    """
    if flags:
        raise ValueError("flags are set by the writer, not by its caller")
    if not 0 <= minor <= MINOR:
        raise ValueError(f"this writer knows minor versions 0..{MINOR}, not {minor}")
    cctx = _compressor(zstd_level, threads) if zstd_level is not None else None
    head = header.to_json() if head is None else head
    raw_len, enc, stored, size = _stored_head(head, cctx, zstd_level)
    pad = padding(size)
    parts: list[bytes | memoryview | Payload] = [
        SECTION.pack(b"HEAD", MESSAGE_GROUP, enc, 0, 0, 0, size, raw_len), stored, _ZEROS[pad]]
    total = PREAMBLE.size + SECTION.size + size + pad + TRAILER.size
    lazy = False  # a Payload among the parts
    for group, tag, data, compressible in sections:
        if type(tag) is not str or tag not in _GOOD_TAGS:
            _check_tag(tag)
        raw_len, enc, stored, size = _stored(data, compressible, cctx, zstd_level)
        pad = padding(size)
        lazy = lazy or hasattr(stored, "write_into")
        parts += [SECTION.pack(tag.encode("ascii"), group, enc, 0, 0, 0, size, raw_len), stored, _ZEROS[pad]]
        total += SECTION.size + size + pad
    count = len(parts) // 3
    if count > MAX_SECTIONS:
        raise LimitError(f"{count} sections exceed the limit of {MAX_SECTIONS}")
    if auth is None and not lazy and total <= SMALL_MESSAGE:
        return _joined_message([PREAMBLE.pack(MAGIC, MAJOR, minor, flags, count, total), *parts], total)
    tail: list[bytes] = []
    if auth is not None:
        flags, minor = flags | FLAG_AUTH, max(minor, 1)
        tail = auth_trailer_head(auth.algorithm, auth.key_id, auth.tag_length)
    out = _MessageBuffer(total + sum(map(len, tail)) + (auth.tag_length if auth is not None else 0))
    for p in _joined_small([PREAMBLE.pack(MAGIC, MAJOR, minor, flags, count, total), *parts]):
        out.put(p)
    out.put(TRAILER.pack(out.crc))
    if auth is not None:
        for p in tail:
            out.put(p)
        tag = auth.tag([out.view[: out.pos]])
        if len(tag) != auth.tag_length:
            raise ValueError(f"the signer made a tag of {len(tag)} bytes, not {auth.tag_length}")
        out.put(tag)
    return out.finish()


# A message up to this many bytes, all on the host, is written by _joined_message: its parts'
# CRC-32 taken where they are (in cache: the group was just encoded), then one join (~6 us less than
# the buffer, the joins of small parts and a put per part, of a ~60 us encode of 1e4 floats)
SMALL_MESSAGE = 1 << 18
# ... and one up to this many bytes is joined first and checksummed in one call, the trailer appended
# by a second copy: a message of one small group has ~10 parts, whose CRC calls (~0.22 us each) cost
# more than copying it again (measured: 16 KiB 0.16 us, 32 KiB 0.8 us, 64 KiB 1.7 us)
JOIN_FIRST = 1 << 15


def _joined_message(parts: list[Any], total: int) -> bytes:
    """The message of ``parts`` (host bytes, preamble first; ``total`` bytes with the trailer), its
    CRC-32 trailer appended."""
    if total <= JOIN_FIRST:
        blob = b"".join(parts)
        return blob + TRAILER.pack(parallel.crc32_update(blob))
    crc = 0
    for p in parts:
        crc = parallel.crc32_update(p, crc)
    parts.append(TRAILER.pack(crc))
    return b"".join(parts)


# Host parts of a message up to this many bytes are joined with their small neighbours before they
# are put: a message of one small group is ~8 parts (preamble, section headers, HEAD, paddings), and
# each put is a copy and a CRC-32 call (~1 us each of a ~80 us encode of 1e4 floats).
SMALL_PART = 4096


def _joined_small(parts: list[Any]) -> list[Any]:
    """``parts`` with each run of consecutive small host parts (at most SMALL_PART bytes) joined into
    one bytes object (the same bytes in the same order); empty parts dropped."""
    out: list[Any] = []
    run: list[Any] = []
    for p in parts:
        n = _length(p)
        if n and n <= SMALL_PART and not hasattr(p, "write_into"):
            run.append(p)
            continue
        if run:
            out.append(run[0] if len(run) == 1 else b"".join(run))
            run = []
        if n:
            out.append(p)
    if run:
        out.append(run[0] if len(run) == 1 else b"".join(run))
    return out


_ZEROS = tuple(bytes(n) for n in range(ALIGN))  # the padding after a payload


def _stored_head(head: bytes, cctx: Any, level: int | None) -> tuple[int, int, bytes, int]:
    """:func:`_stored` of a HEAD payload (JSON bytes), memoised for small ones: a zstd frame is a
    function of the bytes and the level only (``parallel.zstd_compressor``), and a sender's HEAD is
    the same message after message (~3 us of zstd per small message)."""
    if cctx is None or len(head) > _HEAD_FRAME_BYTES:
        return _stored(head, True, cctx, level)
    key = (level, head)
    hit = _HEAD_FRAMES.get(key)
    if hit is None:
        hit = _stored(head, True, cctx, level)
        _remember(_HEAD_FRAMES, key, hit)
    return hit


def _remember(memo: dict, key: Any, value: Any) -> None:
    """``memo[key] = value``, the oldest entry dropped beyond _HEAD_MEMO_COUNT (messages may be
    written and read on several threads)."""
    with _HEAD_MEMO_LOCK:
        if len(memo) >= _HEAD_MEMO_COUNT:
            del memo[next(iter(memo))]  # dicts keep insertion order
        memo[key] = value


# HEAD payloads (as stored) of recent messages: at most 64, of up to 4 KiB of JSON each
_HEAD_FRAMES: dict[tuple[int | None, bytes], tuple[int, int, bytes]] = {}
_HEAD_MEMO_COUNT, _HEAD_FRAME_BYTES = 64, 4096
_HEAD_MEMO_LOCK = threading.Lock()


def _byte_view(data: Any) -> bytes | memoryview:
    """Host bytes as themselves or a flat unsigned-byte view (no copy)."""
    return data if isinstance(data, bytes) else memoryview(data).cast("B")


def _length(part: Any) -> int:
    if type(part) is bytes:  # most parts (section headers, padding, HEAD, zstd frames)
        return len(part)
    return part.nbytes if hasattr(part, "write_into") else len(part)


def _stored(data: Any, compressible: bool | ZstdFrame, cctx: Any, level: int | None = None
            ) -> tuple[int, int, Any, int]:
    """(raw length, encoding, payload as stored, its length) of one section: zstd when that is
    strictly smaller; a :class:`Payload` stays one unless it was brought to the host to be compressed.
    ``level``: ``cctx``'s zstd level, where a :class:`ZstdFrame` of that level may stand in for it."""
    lazy = hasattr(data, "write_into")
    raw = data if lazy else _byte_view(data)
    raw_len = data.nbytes if lazy else len(raw)
    if not (compressible and cctx is not None and raw_len > 0):
        return raw_len, ENC_RAW, raw, raw_len
    host = _byte_view(data.host()) if lazy else raw
    z = _frame(host, compressible, level, cctx)
    return (raw_len, ENC_ZSTD, z, len(z)) if len(z) < raw_len else (raw_len, ENC_RAW, host, raw_len)


class _MessageBuffer:
    """The message being written: one buffer of its final size, filled front to back, with the
    running CRC-32 of what was put so far.  With the compiled kernels the buffer is the ``bytes``
    object returned (``_kernels.new_bytes``); otherwise a numpy array copied into one at the end."""

    def __init__(self, size: int) -> None:
        from mucsc.codec import kernels

        new_bytes = kernels.compiled("new_bytes")
        if new_bytes is not None:
            self._bytes, writable = new_bytes(size)
        else:
            self._bytes = None
            writable = self._array = np.empty(size, np.uint8)
        self.view = memoryview(writable).cast("B")
        self.pos, self.crc, self.size = 0, 0, size

    def put(self, part: Any) -> None:
        """Append ``part`` (bytes-like or a :class:`Payload`), extending the running CRC."""
        n = _length(part)
        if self.pos + n > self.size:
            raise ValueError(f"message buffer overrun: {self.pos} + {n} > {self.size} bytes")
        dest = self.view[self.pos: self.pos + n]
        if hasattr(part, "write_into"):
            self.crc = parallel.crc32_combine(self.crc, part.write_into(dest), n)
        else:
            self.crc = parallel.copy_crc32(part, dest, self.crc)
        self.pos += n

    def finish(self) -> bytes:
        """The message, once every byte was put (the writer drops its view of it)."""
        if self.pos != self.size:
            raise ValueError(f"message buffer holds {self.pos} of {self.size} bytes")
        self.view = None
        return self._bytes if self._bytes is not None else self._array.tobytes()


def auth_trailer_head(algorithm: int, key_id: str, tag_length: int) -> list[bytes]:
    """The trailer's bytes before the tag: its 4-byte header and the key id."""
    kid = check_key_id(key_id)
    return [AUTH_HEADER.pack(algorithm, len(kid), tag_length), kid]


def check_key_id(key_id: str) -> bytes:
    """The key id's UTF-8 bytes; 1..64 of them, no control characters (FORMAT.md 2.5)."""
    if not isinstance(key_id, str):
        raise TypeError(f"key id must be a string, got {type(key_id).__name__}")
    kid = key_id.encode("utf-8", "strict")
    if not 1 <= len(kid) <= MAX_KEY_ID_BYTES:
        raise ValueError(f"key id must be 1..{MAX_KEY_ID_BYTES} bytes of UTF-8, got {len(kid)}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key_id):
        raise ValueError(f"key id {key_id!r} contains control characters")
    return kid


_GOOD_TAGS: set[str] = set()  # tags already checked (a handful: the codecs' section tags)


def _check_tag(tag: str) -> None:
    if isinstance(tag, str) and tag in _GOOD_TAGS:
        return
    if not isinstance(tag, str) or len(tag) != 4 or not tag.isascii() or not all(33 <= ord(c) <= 126 for c in tag):
        raise ValueError(f"section tag must be 4 printable ASCII characters, got {tag!r}")
    if len(_GOOD_TAGS) < 256:
        _GOOD_TAGS.add(tag)


# ---------------------------------------------------------------------------------------------- reading

def read_frame(blob: bytes | bytearray | memoryview) -> Frame:
    """Check the preamble and locate the body and the authentication trailer; no section is read.

    This is all an authenticating reader looks at before verifying the tag (FORMAT.md 2.5).
    """
    mv = as_bytes_view(blob)
    return read_frame_at(lambda pos, n: mv[pos: pos + n], len(mv))


def read_frame_at(read: Reader, size: int) -> Frame:
    """:func:`read_frame` of a message of ``size`` bytes read through ``read(offset, n)`` (a file:
    only the preamble and the authentication trailer are read)."""
    first = bytes(read(0, 8))
    if size < 8 or first != MAGIC:
        raise FormatError(_magic_problem(first))
    if size < PREAMBLE.size:
        raise TruncatedError(f"message truncated: {size} bytes, the preamble alone is {PREAMBLE.size}")
    _, major, minor, flags, count, total = PREAMBLE.unpack(bytes(read(0, PREAMBLE.size)))
    if major != MAJOR:
        raise VersionError(f"format version {major}.{minor} is not supported (this decoder reads {MAJOR}.x)")
    if flags & ~KNOWN_FLAGS:
        raise FormatError(f"reserved flag bits are set (0x{flags & ~KNOWN_FLAGS:04x}); format "
                          f"{MAJOR}.{MINOR} defines only 0x{KNOWN_FLAGS:04x}")
    if flags & FLAG_AUTH and minor < 1:
        raise FormatError("the authentication flag is set in a 1.0 message (it needs minor version 1)")
    if total > size:
        raise TruncatedError(f"message truncated: declares {total} bytes, only {size} present")
    if total < size and not flags & FLAG_AUTH:
        raise FormatError(f"{size - total} unexpected bytes after the end of the message")
    if total < PREAMBLE.size + TRAILER.size:
        raise FormatError(f"declared length {total} is smaller than the fixed parts of a message")
    auth = None
    if flags & FLAG_AUTH:
        if size - total > AUTH_HEADER.size + MAX_KEY_ID_BYTES + 0xFFFF:
            raise FormatError(f"{size - total} bytes follow the body: more than an authentication trailer can "
                              "hold (unexpected bytes after the authentication trailer)")
        auth = _read_auth_trailer(as_bytes_view(read(total, size - total)), total)
    return Frame(minor, flags, count, total, auth)


def _read_auth_trailer(mv: memoryview, body: int) -> AuthTrailer:
    """Parse the trailer ``mv`` (the message's bytes from offset ``body`` to its end), which must end
    exactly at the end of the message; offsets in the result are the message's."""
    if len(mv) < AUTH_HEADER.size:
        raise TruncatedError("message truncated: the authentication trailer is missing")
    alg, klen, tlen = AUTH_HEADER.unpack_from(mv, 0)
    if not 1 <= klen <= MAX_KEY_ID_BYTES:
        raise FormatError(f"authentication trailer: key id length {klen} is outside 1..{MAX_KEY_ID_BYTES}")
    if tlen == 0:
        raise FormatError("authentication trailer: empty tag")
    expected = AUTH_TAG_LENGTHS.get(alg)
    if expected is not None and tlen != expected:
        raise FormatError(f"authentication trailer: algorithm {alg} has {expected}-byte tags, not {tlen}")
    end = AUTH_HEADER.size + klen + tlen
    if end > len(mv):
        raise TruncatedError(f"message truncated: the authentication trailer needs {body + end} bytes, "
                             f"only {body + len(mv)} present")
    if end < len(mv):
        raise FormatError(f"{len(mv) - end} unexpected bytes after the authentication trailer")
    kid_at = AUTH_HEADER.size
    try:
        key_id = bytes(mv[kid_at: kid_at + klen]).decode("utf-8")
        check_key_id(key_id)
    except ValueError as exc:  # UnicodeDecodeError is a ValueError
        raise FormatError(f"authentication trailer: invalid key id ({exc})") from None
    return AuthTrailer(alg, key_id, body + kid_at + klen, bytes(mv[kid_at + klen: end]))


# Tag length of each algorithm id the spec defines (FORMAT.md 2.5); unknown ids are framed by the
# trailer's own tag_length so that a reader without keys can still decode the message.
AUTH_TAG_LENGTHS = {1: 32, 2: 64}


def as_bytes_view(blob: bytes | bytearray | memoryview) -> memoryview:
    """A flat unsigned-byte view of ``blob`` (no copy)."""
    return memoryview(blob).cast("B") if not isinstance(blob, memoryview) or blob.format != "B" else blob


def read_message(blob: bytes | bytearray | memoryview, max_header: int | None = None) -> Message:
    """Parse and check a message: magic, version, flags, length, CRC, section table, HEAD.

    Raises the specific FormatError subclasses; payloads are decompressed later, on demand.  An
    authentication trailer is parsed but not verified here (that needs keys: :mod:`mucsc.codec.wire.auth`).
    ``max_header``: the caller's bound on HEAD's raw length, below the spec's 16 MiB (checked before
    HEAD is decompressed or parsed).
    """
    mv = as_bytes_view(blob)
    frame = read_frame(mv)
    total = frame.body_length
    (crc,) = TRAILER.unpack_from(mv, total - TRAILER.size)
    if parallel.crc32(mv[: total - TRAILER.size]) != crc:
        raise ChecksumError("checksum mismatch: the message is corrupted")
    return _parse_body(mv, len(mv), frame, max_header)


def read_message_file(f: Any, max_header: int | None = None, check_crc: bool = True) -> Message:
    """:func:`read_message` of an open message file, in memory independent of its size: the preamble,
    the section headers and HEAD are read; payloads are read (``os.pread``) when a group asks for
    them.  ``check_crc``: verify the CRC-32 first, reading the file once in CRC_CHUNK pieces; False
    (random access, ``mucsc.open``) skips that pass: each payload is still checked as it is decoded
    (lengths, zstd framing, codec rules), but a flipped bit inside a raw payload goes unnoticed."""
    blob = FileBytes(f)
    frame = read_frame_at(blob.read, blob.size)
    if check_crc:
        total = frame.body_length
        (crc,) = TRAILER.unpack(bytes(blob.read(total - TRAILER.size, TRAILER.size)))
        if blob.crc32(0, total - TRAILER.size) != crc:
            raise ChecksumError("checksum mismatch: the message is corrupted")
    return _parse_body(blob, blob.size, frame, max_header)


def _parse_body(blob: Any, size: int, frame: Frame, max_header: int | None) -> Message:
    """The section table and HEAD of a message whose frame (and CRC) passed; ``blob[a:b]`` gives bytes."""
    count, total = frame.section_count, frame.body_length
    if count == 0 or count > MAX_SECTIONS:
        raise LimitError(f"section count {count} is outside 1..{MAX_SECTIONS}")
    sections = read_section_table_at(lambda pos, n: blob[pos: pos + n], count, total - TRAILER.size)
    head = sections[0]
    if head.tag != "HEAD" or head.group != MESSAGE_GROUP:
        raise FormatError("the first section must be HEAD")
    if head.raw_bytes > MAX_HEADER_BYTES:
        raise LimitError(f"header of {head.raw_bytes} bytes exceeds the limit of {MAX_HEADER_BYTES}")
    if max_header is not None and head.raw_bytes > max_header:
        raise LimitError(f"a header of {head.raw_bytes} bytes in a message of {size}: more than the "
                         f"{max_header} bytes max_expansion allows (pass max_expansion=None to read it; "
                         "CLI: --max-expansion none)")
    msg = Message(Header((), ()), sections, size, frame.minor, blob, frame.auth)
    header = _parsed_head(msg, head)
    _check_sections_against_header(sections, header)
    return dataclasses.replace(msg, header=header)


def _parsed_head(msg: Message, head: SectionInfo) -> Header:
    """``parse_header`` of the HEAD section ``head`` (decompressed), memoised by its stored bytes:
    a pure function of them, its encoding and declared raw length, and a receiver sees the same
    HEAD message after message (its zstd frame and the parse are ~70% of decoding 1e4 floats).  A
    header comes back with dicts of its own (parameters and meta), so nothing a caller changes
    reaches the memo; headers whose parameters nest (lists, objects), and HEADs over 4 KiB of JSON
    (their parse is large next to one lookup), are not kept."""
    if head.raw_bytes > _HEAD_FRAME_BYTES:
        return parse_header(bytes(msg.payload(head)))
    key = (head.encoding, head.raw_bytes, bytes(msg._blob[head.offset: head.offset + head.stored_bytes]))
    header = _PARSED_HEADS.get(key)
    if header is None:
        header = parse_header(bytes(msg.payload(head)))
        if all(type(v) in _PLAIN_JSON for g in header.groups for v in g.params.values()):
            _remember(_PARSED_HEADS, key, header)
    return Header(header.records, tuple(Group(g.codec, dict(g.params), g.records, g.dtype) for g in header.groups),
                  header.container, dict(header.meta))


# Headers parsed from recent stored HEAD payloads (at most 64, of up to 4 KiB of JSON each).
_PARSED_HEADS: dict[tuple[str, int, bytes], Header] = {}
_PLAIN_JSON = (str, int, float, bool, type(None))  # values a JSON parse gives that no one can change


CRC_CHUNK = 16 << 20  # bytes per read when a message file's CRC is checked (its extra memory)


class FileBytes:
    """A message file as read-only bytes on demand: ``blob[a:b]`` is ``os.pread`` of that range (a
    fresh buffer, safe from several threads).  What :class:`Message` holds for a file."""

    def __init__(self, f: Any) -> None:
        self._fd = f.fileno()
        self.size = os.fstat(self._fd).st_size

    def read(self, pos: int, n: int) -> memoryview:
        """Exactly ``n`` bytes from ``pos`` (TruncatedError when the file is shorter: it changed)."""
        n = max(0, min(n, self.size - pos))
        buf = bytearray(n)
        mv = memoryview(buf)
        got = 0
        while got < n:
            k = os.preadv(self._fd, [mv[got:]], pos + got)
            if k <= 0:
                raise TruncatedError(f"the file ended at {pos + got} bytes while reading {n} from {pos} "
                                     "(was it changed while being read?)")
            got += k
        return mv

    def __getitem__(self, key: slice) -> memoryview:
        start, stop, _ = key.indices(self.size)
        return self.read(start, max(0, stop - start))

    def __len__(self) -> int:
        return self.size

    def crc32(self, start: int, end: int) -> int:
        """CRC-32 of bytes [start, end), read CRC_CHUNK at a time."""
        crc = 0
        for a in range(start, end, CRC_CHUNK):
            crc = parallel.crc32_update(self.read(a, min(CRC_CHUNK, end - a)), crc)
        return crc


class MessageSpool:
    """A message written group by group in memory independent of its size (streamed compression).

    :meth:`add` appends one section (header, payload as stored, padding) to ``spool``, a scratch
    file, as soon as its group is encoded, and keeps the running CRC-32 of what it wrote; the HEAD
    section, which lists every group, can only be written last, yet must come first (FORMAT.md 2.4),
    so :meth:`finish` writes the preamble and HEAD to ``out`` and then copies the spool after them,
    joining the CRCs (``parallel.crc32_combine``) instead of reading the sections again.  The bytes
    equal :func:`write_message`'s for the same sections in the same order.
    """

    COPY_CHUNK = 8 << 20

    def __init__(self, spool: Any, zstd_level: int | None = DEFAULT_ZSTD_LEVEL, threads: int = 1) -> None:
        self._spool, self._level = spool, zstd_level
        self._cctx = _compressor(zstd_level, threads) if zstd_level is not None else None
        self._threads = threads
        self.count = self.nbytes = self.crc = 0
        self.group_bytes: dict[int, int] = {}

    def add(self, group: int, tag: str, data: Any, compressible: bool) -> int:
        """Append one section of ``group`` (as :func:`write_message`'s ``sections``); its bytes."""
        _check_tag(tag)
        raw_len, enc, stored, size = _stored(data, compressible, self._cctx, self._level)
        if hasattr(stored, "write_into"):
            stored = _byte_view(stored.host())
        n = 0
        for part in (SECTION.pack(tag.encode("ascii"), group, enc, 0, 0, 0, size, raw_len), stored,
                     bytes(padding(size))):
            self._spool.write(part)
            self.crc = parallel.crc32_update(part, self.crc)
            n += len(part)
        self.count += 1
        self.nbytes += n
        self.group_bytes[group] = self.group_bytes.get(group, 0) + n
        return n

    def finish(self, out: Any, header: Header, *, minor: int = 0, auth: AuthWriter | None = None,
               head: bytes | None = None) -> int:
        """Write the message to ``out``: preamble, HEAD, the spooled sections, CRC-32 (and the
        authentication trailer); its length.  ``minor``, ``auth``, ``head``: as :func:`write_message`."""
        if not 0 <= minor <= MINOR:
            raise ValueError(f"this writer knows minor versions 0..{MINOR}, not {minor}")
        count = self.count + 1
        if count > MAX_SECTIONS:
            raise LimitError(f"{count} sections exceed the limit of {MAX_SECTIONS}")
        head = header.to_json() if head is None else head
        raw_len, enc, stored, size = _stored(head, True, self._cctx)
        head_parts = [SECTION.pack(b"HEAD", MESSAGE_GROUP, enc, 0, 0, 0, size, raw_len), stored,
                      bytes(padding(size))]
        total = PREAMBLE.size + sum(map(len, head_parts)) + self.nbytes + TRAILER.size
        flags = 0
        tail: list[bytes] = []
        if auth is not None:
            flags, minor = FLAG_AUTH, max(minor, 1)
            tail = auth_trailer_head(auth.algorithm, auth.key_id, auth.tag_length)
        pre = PREAMBLE.pack(MAGIC, MAJOR, minor, flags, count, total)
        crc = parallel.crc32_update(b"".join(bytes(p) for p in head_parts), parallel.crc32_update(pre))
        crc = parallel.crc32_combine(crc, self.crc, self.nbytes)

        def parts() -> Iterator[bytes | memoryview]:  # every byte before the tag, written as it goes
            for p in [pre, *head_parts]:
                out.write(p)
                yield p
            self._spool.flush()
            self._spool.seek(0)
            while chunk := self._spool.read(self.COPY_CHUNK):
                out.write(chunk)
                yield chunk
            for p in [TRAILER.pack(crc), *tail]:
                out.write(p)
                yield p

        if auth is None:
            for _ in parts():
                pass
            return total
        tag = auth.tag(parts())
        if len(tag) != auth.tag_length:
            raise ValueError(f"the signer made a tag of {len(tag)} bytes, not {auth.tag_length}")
        out.write(tag)
        return total + sum(map(len, tail)) + len(tag)


def _magic_problem(first: bytes) -> str:
    if first[1:4] == b"MUC":
        return "not a mucsc message: the signature was altered (text-mode transfer or 7-bit channel?)"
    return "not a mucsc message (bad magic number)"


def _read_section_table(mv: memoryview, count: int, end: int) -> tuple[SectionInfo, ...]:
    return read_section_table_at(lambda pos, n: mv[pos: pos + n], count, end)


def read_section_table_at(read: Reader, count: int, end: int) -> tuple[SectionInfo, ...]:
    """The section table of a message whose sections end at ``end`` (the CRC's offset), read through
    ``read(offset, n)``: each section's 32-byte header and padding, payloads skipped (a file reader
    reads 40 bytes per section, not the message)."""
    out = []
    pos = PREAMBLE.size
    for i in range(count):
        if pos + SECTION.size > end:
            raise TruncatedError(f"section {i} header runs past the end of the message")
        tag_b, group, enc, r1, r2, r3, stored, raw = SECTION.unpack(bytes(read(pos, SECTION.size)))
        try:
            tag = tag_b.decode("ascii")
            _check_tag(tag)
        except (UnicodeDecodeError, ValueError):
            raise FormatError(f"section {i} has an invalid tag {tag_b!r}") from None
        if r1 or r2 or r3:
            raise FormatError(f"section {i} ({tag}): reserved header bytes must be zero")
        if enc not in ENCODINGS:
            raise FormatError(f"section {i} ({tag}): unknown encoding {enc}")
        pos += SECTION.size
        if stored > end - pos:
            raise TruncatedError(f"section {i} ({tag}) declares {stored} bytes, only {end - pos} remain")
        if enc == ENC_RAW and raw != stored:
            raise FormatError(f"section {i} ({tag}): raw section with raw length {raw} != stored {stored}")
        if enc == ENC_ZSTD and raw > stored * MAX_ZSTD_RATIO:
            raise LimitError(f"section {i} ({tag}): raw length {raw} is impossible for {stored} zstd bytes")
        pad = padding(stored)
        if pad > end - pos - stored or (pad and any(bytes(read(pos + stored, pad)))):
            raise FormatError(f"section {i} ({tag}): padding missing or not zero")
        out.append(SectionInfo(tag, group, ENCODINGS[enc], stored, raw, pos))
        pos += stored + pad
    if pos != end:
        raise FormatError(f"{end - pos} bytes between the last section and the checksum")
    return tuple(out)


def _check_frame_header(data: memoryview, raw_len: int, tag: str) -> None:
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError:
        raise FormatError(f"section {tag}: not a zstd frame") from None
    if declared != raw_len:
        raise FormatError(f"section {tag}: zstd frame declares {declared} bytes, section says {raw_len}")


def zstd_decompress_bounded(data: memoryview, raw_len: int, tag: str) -> bytes:
    """Decompress exactly one zstd frame that MUST declare exactly ``raw_len`` bytes; never produce
    more, and reject anything after the frame (a second or skippable frame, padding): FORMAT.md 2.3."""
    _check_frame_header(data, raw_len, tag)
    if raw_len == 0:
        _check_empty_frame(data, tag)
        return b""
    try:
        out = _decompressor().decompress(data, max_output_size=raw_len, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        if "unused data" in str(exc):
            raise FormatError(f"section {tag}: bytes after the zstd frame (the payload must be exactly "
                              "one frame)") from None
        raise FormatError(f"section {tag}: corrupt zstd data ({_zstd_reason(exc)})") from None
    if len(out) != raw_len:
        raise FormatError(f"section {tag}: zstd frame gave {len(out)} bytes, expected {raw_len}")
    return out


def _decompressor() -> zstandard.ZstdDecompressor:
    """This thread's one-shot decompressor, reused: making one costs ~25 us (a decompression
    context), more than decompressing a small section; each ``decompress`` call starts a new frame
    (the context is reset), and a decompressor is not safe to share between threads.  Streaming
    readers (:class:`ZstdStream`) keep their own."""
    d = getattr(_ZSTD_ONE_SHOT, "d", None)
    if d is None:
        d = _ZSTD_ONE_SHOT.d = zstandard.ZstdDecompressor()
    return d


_ZSTD_ONE_SHOT = threading.local()


def _check_empty_frame(data: memoryview, tag: str) -> None:
    """The checks of :func:`zstd_decompress_bounded` for a frame that declares 0 bytes, which
    python-zstandard answers with ``b""`` without reading the frame: it must end exactly at the end
    of the section (a walk over at most a few block headers) and decode to nothing."""
    end = zstd_frame_end(data, max_blocks=4)  # a 0-byte frame has one (empty, last) block
    if end is None or end > len(data):
        raise FormatError(f"section {tag}: corrupt zstd data (a frame declaring 0 bytes whose blocks "
                          "do not end within the section)")
    if end < len(data):
        raise FormatError(f"section {tag}: bytes after the zstd frame (the payload must be exactly one frame)")
    try:
        with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=False) as r:
            extra = r.read(1)  # at most the 4 blocks walked above: bounded work and memory
    except zstandard.ZstdError as exc:
        raise FormatError(f"section {tag}: corrupt zstd data ({_zstd_reason(exc)})") from None
    if extra:
        raise FormatError(f"section {tag}: zstd frame gave more than 0 bytes")


def _zstd_reason(exc: Exception) -> str:
    """zstd's own words for an error, without the prefix python-zstandard adds (which differs
    between one-shot and streaming decompression): the same message on either path."""
    return str(exc).split("error: ", 1)[-1]


def zstd_frame_end(data: memoryview, max_blocks: int) -> int | None:
    """Where the zstd frame that starts ``data`` ends, from its block headers (RFC 8878 3.1.1), or
    None when the headers run past the end or there are more than ``max_blocks`` blocks.  A walk
    over at most ``max_blocks`` 3-byte headers: nothing is decompressed."""
    try:
        pos = zstandard.frame_header_size(data)
    except zstandard.ZstdError:
        return None
    checksum = len(data) > 4 and data[4] & 0x04  # Frame_Header_Descriptor: Content_Checksum_flag
    for _ in range(max_blocks):
        if pos + 3 > len(data):
            return None
        h = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
        kind, size = (h >> 1) & 3, h >> 3
        if kind == 3:  # reserved block type
            return None
        pos += 3 + (1 if kind == 1 else size)  # an RLE block stores its one byte
        if h & 1:  # Last_Block
            return pos + (4 if checksum else 0)
    return None


class ZstdStream:
    """A zstd section payload decompressed progressively, front to back, into one buffer.

    One thread calls :meth:`read_to` with growing positions (``buffer[:pos]`` is then final) while
    others read the part already there: the decoder unpacks a section while the rest of it is still
    being decompressed.  The checks are those of :func:`zstd_decompress_bounded`, with the same
    errors: the frame declares ``nbytes``, gives exactly that, and nothing follows it (the frame's
    end is found from its block headers before anything is decompressed; when that walk does not
    land on the section's end, the one-shot path decompresses it and reports the problem).
    """

    def __init__(self, data: memoryview, nbytes: int, tag: str) -> None:
        _check_frame_header(data, nbytes, tag)
        self.nbytes, self._data, self._tag = nbytes, data, tag
        self._done, self._finished, self._reader = 0, False, None
        self._error: BaseException | None = None
        self.buffer = np.empty(nbytes, np.uint8)  # pages are touched as the frame is decompressed
        # a valid frame of n bytes has about n / 128 KiB blocks; a frame of far more (tiny) blocks
        # is left to the one-shot path, which walks it in C
        if zstd_frame_end(data, max_blocks=(nbytes >> 10) + 64) != len(data):
            self._set(zstd_decompress_bounded(data, nbytes, tag))

    def _set(self, raw: bytes) -> None:
        self.buffer = np.frombuffer(raw, np.uint8)
        self._done, self._finished = self.nbytes, True

    def read_to(self, pos: int) -> None:
        """Decompress until ``buffer[:pos]`` holds the payload's first ``pos`` bytes (FormatError for
        a corrupt frame; at ``pos == nbytes`` also the end-of-frame checks)."""
        if self._error is not None:
            raise self._error
        if self._finished or (self._done >= pos and pos < self.nbytes):
            return
        if self._reader is None:
            self._reader = zstandard.ZstdDecompressor().stream_reader(self._data, read_across_frames=False)
        view = memoryview(self.buffer)
        try:
            while self._done < pos:
                got = self._reader.readinto(view[self._done: pos])
                if got == 0:
                    raise FormatError(f"section {self._tag}: zstd frame gave {self._done} bytes, "
                                      f"expected {self.nbytes}")
                self._done += got
            if self._done == self.nbytes:
                if self._reader.read(1):
                    raise FormatError(f"section {self._tag}: zstd frame gave more than {self.nbytes} bytes")
                self._finished = True
                self._reader.close()
        except zstandard.ZstdError as exc:
            self._fail(FormatError(f"section {self._tag}: corrupt zstd data ({_zstd_reason(exc)})"))
        except BaseException as exc:
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        """Close the reader and raise ``exc``, now and on every later read."""
        self._reader.close()
        self._error = exc
        raise exc from None

    def complete(self) -> memoryview:
        """The whole payload (decompressed in one call when nothing was read yet: the fastest way)."""
        if self._done == 0 and not self._finished:
            self._set(zstd_decompress_bounded(self._data, self.nbytes, self._tag))
        self.read_to(self.nbytes)
        return memoryview(self.buffer)


# ---------------------------------------------------------------------------------------------- header

def parse_header(raw: bytes) -> Header:
    """Parse and validate HEAD's JSON against the schema and the limits.

    Before ``json.loads`` builds anything, one streaming pass (:func:`json_scan`, constant extra
    memory) bounds the nesting depth and the number of objects and arrays: a parser's memory grows
    with the containers it builds (about 60-200 bytes each), so these are checked first."""
    scan = json_scan(raw)
    if scan.depth > MAX_JSON_DEPTH:
        raise FormatError(f"header JSON nests {scan.depth} levels deep, more than {MAX_JSON_DEPTH}")
    if scan.containers > MAX_JSON_CONTAINERS:
        raise LimitError(f"header JSON holds {scan.containers} objects and arrays; a header within the "
                         f"limits ({MAX_RECORDS} records and groups) needs at most {MAX_JSON_CONTAINERS}")
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"header is not valid UTF-8 JSON ({exc})") from None
    if _SURROGATE_ESCAPE.search(raw):  # "\ud800": valid JSON, but not Unicode text (FORMAT.md 2.4)
        _check_unicode(obj, "header")
    if not isinstance(obj, dict):
        raise FormatError("header must be a JSON object")
    container = obj.get("container")
    if container not in ("tensor", "dict"):
        raise FormatError(f"header 'container' must be 'tensor' or 'dict', got {container!r}")
    meta = obj.get("meta", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise FormatError("header 'meta' must map strings to strings")
    recs = _list(obj, "records", MAX_RECORDS)
    records = tuple(_parse_record(i, r) for i, r in enumerate(recs))
    if len({r.name for r in records}) != len(records):
        raise FormatError("record names must be unique")
    if container == "tensor" and len(records) != 1:
        raise FormatError("a 'tensor' message holds exactly one record")
    groups = tuple(_parse_group(i, g, records) for i, g in enumerate(_list(obj, "groups", MAX_RECORDS)))
    seen = [x for g in groups for x in g.records]
    if sorted(seen) != list(range(len(records))):
        raise FormatError("every record must belong to exactly one group")
    return Header(records, groups, container, meta)


# A valid HEAD has 4 containers of its own, 2 per record (the object, its shape) and 3 per group
# (the object, params, records) plus what a codec's params nest (none nest today): with 2^20 records
# and 2^20 groups, 5 * 2^20 and slack.  Counted before parsing, so the parser never builds more.
MAX_JSON_CONTAINERS = 5 * MAX_RECORDS + 4096


@dataclasses.dataclass(frozen=True)
class JsonScan:
    """What :func:`json_scan` counts in JSON text, outside strings."""

    depth: int  # the deepest nesting of [ and {
    containers: int  # the number of [ and { (objects and arrays the parser would build)


_SCAN_CHUNK = 1 << 18  # bytes per step of json_scan: its extra memory is a few arrays of this size


def json_scan(raw: bytes | memoryview) -> JsonScan:
    """Nesting depth and container count of JSON text, outside strings, in one pass over fixed-size
    chunks (constant extra memory, whatever the text's size).

    A quote toggles "inside a string" unless an odd run of backslashes precedes it; the state (inside
    a string or not, the backslash run and the nesting level) carries from one chunk to the next.
    Text that is not JSON may be counted oddly, but the parser rejects it afterwards."""
    data = np.frombuffer(raw, np.uint8)
    depth = level = containers = 0
    in_string, run_before = 0, 0  # run_before: backslashes ending right before the chunk
    for a in range(0, data.size, _SCAN_CHUNK):
        c = data[a: a + _SCAN_CHUNK]
        quotes = c == 0x22
        bs = c == 0x5C
        if bs.any():  # a quote after an odd run of backslashes is escaped
            idx = np.arange(c.size, dtype=np.int32)
            last_other = np.maximum.accumulate(np.where(bs, -1, idx))  # last non-backslash at or before i
            run = idx - last_other  # backslashes ending at i (0 where c[i] is not one)
            run[last_other < 0] += run_before  # the chunk starts inside a run carried over
            quotes[0] &= not run_before & 1
            quotes[1:] &= (run[:-1] & 1) == 0
            run_before = int(run[-1])
        else:
            quotes[0] &= not run_before & 1
            run_before = 0
        opens = (c == 0x5B) | (c == 0x7B)
        closes = (c == 0x5D) | (c == 0x7D)
        if quotes.any() or in_string:
            outside = (np.cumsum(quotes, dtype=np.int32) + in_string) & 1 == 0
            in_string = int(not outside[-1])
            opens &= outside
            closes &= outside
        levels = np.cumsum(opens, dtype=np.int32)
        levels -= np.cumsum(closes, dtype=np.int32)
        depth = max(depth, level + int(levels.max()))
        level += int(levels[-1])
        containers += int(np.count_nonzero(opens))
    return JsonScan(depth, containers)


def json_depth(raw: bytes | memoryview) -> int:
    """The deepest nesting of [ and { in JSON text (outside strings): :func:`json_scan`'s depth."""
    return json_scan(raw).depth


# a \uD800-\uDFFF escape: a surrogate, lone unless paired (json.loads joins valid pairs)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _check_unicode(value: Any, where: str) -> None:
    """FormatError when a string anywhere in parsed JSON holds a lone surrogate (not UTF-8-encodable:
    the writer refuses such text, so the reader must too).  Depth is bounded by MAX_JSON_DEPTH."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise FormatError(f"{where}: a lone surrogate (\\u{ord(value[exc.start]):04x}) in {value[:40]!r} is "
                              "not Unicode text") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_unicode(k, where)
            _check_unicode(v, f"{where}[{k!r}]")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _check_unicode(v, f"{where}[{i}]")


def _reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not allowed")


def _list(obj: Mapping, key: str, limit: int) -> list:
    v = obj.get(key)
    if not isinstance(v, list):
        raise FormatError(f"header {key!r} must be a list")
    if len(v) > limit:
        raise LimitError(f"header lists {len(v)} {key}, the limit is {limit}")
    return v


def _parse_record(i: int, r: Any) -> Record:
    if not isinstance(r, dict):
        raise FormatError(f"record {i} must be an object")
    name, dtype, shape = r.get("name"), r.get("dtype"), r.get("shape")
    if not isinstance(name, str):
        raise FormatError(f"record {i}: name must be a string")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise LimitError(f"record {i}: name longer than {MAX_NAME_BYTES} bytes")
    if dtype not in RECORD_DTYPES:
        raise FormatError(f"record {i} ({name!r}): unsupported dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                 for s in shape):
        raise FormatError(f"record {i} ({name!r}): shape must be a list of non-negative integers")
    if len(shape) > MAX_RANK:
        raise LimitError(f"record {i} ({name!r}): rank {len(shape)} exceeds {MAX_RANK}")
    if any(s > MAX_ELEMENTS for s in shape) or math.prod(shape) > MAX_ELEMENTS:
        raise LimitError(f"record {i} ({name!r}): more than {MAX_ELEMENTS} elements")
    return Record(name, dtype, tuple(shape))


def _parse_group(i: int, g: Any, records: tuple[Record, ...]) -> Group:
    if not isinstance(g, dict):
        raise FormatError(f"group {i} must be an object")
    codec, params, members, dtype = g.get("codec"), g.get("params"), g.get("records"), g.get("dtype")
    if not isinstance(codec, str) or not isinstance(params, dict):
        raise FormatError(f"group {i}: 'codec' must be a string and 'params' an object")
    if not isinstance(members, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) and 0 <= x < len(records) for x in members):
        raise FormatError(f"group {i}: 'records' must list valid record indices")
    if dtype not in RECORD_DTYPES:
        raise FormatError(f"group {i}: unsupported dtype {dtype!r}")
    if sum(records[x].size for x in members) > MAX_ELEMENTS:
        raise LimitError(f"group {i}: more than {MAX_ELEMENTS} elements")
    return Group(codec, params, tuple(members), dtype)


def _check_sections_against_header(sections: tuple[SectionInfo, ...], header: Header) -> None:
    seen = set()
    for s in sections[1:]:
        if s.tag == "HEAD":
            raise FormatError("HEAD appears more than once")
        if s.group == MESSAGE_GROUP:
            if is_critical(s.tag):
                raise FormatError(f"unknown critical message-level section {s.tag!r}")
            continue
        if s.group >= len(header.groups):
            raise FormatError(f"section {s.tag!r} refers to group {s.group}, the header has {len(header.groups)}")
        if (s.group, s.tag) in seen:
            raise FormatError(f"section {s.tag!r} appears twice in group {s.group}")
        seen.add((s.group, s.tag))
