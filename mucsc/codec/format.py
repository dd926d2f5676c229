"""The mucsc container, version 1.0 (normative description: spec/FORMAT.md).

Layout: a 24-byte preamble, ``section_count`` sections (32-byte section header, payload, zero padding
to 8 bytes), then a CRC-32 of everything before it.  The first section is HEAD, a canonical JSON record
table.  This module knows nothing about codecs: it frames, (de)compresses, checks and limits bytes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import zstandard

from mucsc.errors import ChecksumError, FormatError, LimitError, TruncatedError, VersionError

MAGIC = b"\x89MUC\r\n\x1a\n"  # like PNG: high bit, CR-LF, ^Z and LF catch text-mode mangling
MAJOR, MINOR = 1, 0

PREAMBLE = struct.Struct("<8sBBHIQ")  # magic, major, minor, flags, section_count, total_length
SECTION = struct.Struct("<4sIBBHIQQ")  # tag, group, encoding, 3 reserved (u8, u16, u32), stored, raw
TRAILER = struct.Struct("<I")  # CRC-32 (ISO-HDLC, as zlib.crc32) of all preceding bytes
ALIGN = 8

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
class Message:
    """A parsed, checked message: header, section table, and raw (decompressed on demand) payloads."""

    header: Header
    sections: tuple[SectionInfo, ...]
    size: int
    minor: int
    _blob: memoryview

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
        self._cache: dict[str, memoryview] = {}

    def raw_size(self, tag: str) -> int:
        """The declared raw length of section ``tag`` (nothing is decompressed)."""
        return self._infos[tag].raw_bytes

    def __getitem__(self, tag: str) -> memoryview:
        if tag not in self._cache:
            info = self._infos[tag]
            if self._max_raw is not None and info.raw_bytes > self._max_raw:
                raise LimitError(f"section {tag!r} of group {info.group} declares {info.raw_bytes} bytes, "
                                 f"more than {self._max_raw} for the group's elements")
            self._cache[tag] = self._msg.payload(info)
        return self._cache[tag]

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
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def is_critical(tag: str) -> bool:
    """Upper-case first letter: critical (must be understood); lower-case: ancillary (may be skipped)."""
    return tag[:1].isupper()


def padding(n: int) -> int:
    return (-n) % ALIGN


def message_size(payload_sizes: Iterable[int]) -> int:
    """Exact message length for the given stored section payload sizes (HEAD included)."""
    return PREAMBLE.size + sum(SECTION.size + s + padding(s) for s in payload_sizes) + TRAILER.size


# ---------------------------------------------------------------------------------------------- writing

def _compressor(zstd_level: int) -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=zstd_level, write_content_size=True, write_checksum=False)


def section_bytes(data: Any, compressible: bool, zstd_level: int | None) -> int:
    """Bytes one section adds to a message written by :func:`write_message` with ``zstd_level``:
    its 32-byte header, the payload as it would be stored (zstd when strictly smaller) and padding.
    Rate control uses it to know exact sizes before writing."""
    raw = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    stored = len(raw)
    if compressible and zstd_level is not None and stored > 0:
        stored = min(stored, len(_compressor(zstd_level).compress(raw)))
    return SECTION.size + stored + padding(stored)


def write_message(header: Header, sections: Iterable[tuple[int, str, Any, bool]], *,
                  zstd_level: int | None = 3, flags: int = 0) -> bytes:
    """Serialise a message.  ``sections`` yields (group, tag, payload, compressible).

    A compressible payload is stored zstd-compressed when that is strictly smaller (``zstd_level``
    None: never).  The HEAD section is written first.
    """
    if flags:
        raise ValueError("no flags are defined in format 1.0")
    cctx = _compressor(zstd_level) if zstd_level is not None else None
    parts: list[bytes | memoryview] = []
    count = 0
    for group, tag, data, compressible in [(MESSAGE_GROUP, "HEAD", header.to_json(), True), *sections]:
        _check_tag(tag)
        raw = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        enc, stored = ENC_RAW, raw
        if compressible and cctx is not None and len(raw) > 0:
            z = cctx.compress(raw)
            if len(z) < len(raw):
                enc, stored = ENC_ZSTD, z
        parts.append(SECTION.pack(tag.encode("ascii"), group, enc, 0, 0, 0, len(stored), len(raw)))
        parts.append(stored)
        if padding(len(stored)):
            parts.append(bytes(padding(len(stored))))
        count += 1
    if count > MAX_SECTIONS:
        raise LimitError(f"{count} sections exceed the limit of {MAX_SECTIONS}")
    total = PREAMBLE.size + sum(len(p) for p in parts) + TRAILER.size
    parts.insert(0, PREAMBLE.pack(MAGIC, MAJOR, MINOR, flags, count, total))
    crc = 0
    for p in parts:  # incrementally, so the message is assembled with a single copy
        crc = zlib.crc32(p, crc)
    parts.append(TRAILER.pack(crc))
    return b"".join(parts)


def _check_tag(tag: str) -> None:
    if len(tag) != 4 or not tag.isascii() or not all(33 <= ord(c) <= 126 for c in tag):
        raise ValueError(f"section tag must be 4 printable ASCII characters, got {tag!r}")


# ---------------------------------------------------------------------------------------------- reading

def read_message(blob: bytes | bytearray | memoryview) -> Message:
    """Parse and check a message: magic, version, flags, length, CRC, section table, HEAD.

    Raises the specific FormatError subclasses; payloads are decompressed later, on demand.
    """
    mv = memoryview(blob).cast("B") if not isinstance(blob, memoryview) or blob.format != "B" else blob
    if len(mv) < 8 or bytes(mv[:8]) != MAGIC:
        raise FormatError(_magic_problem(bytes(mv[:8])))
    if len(mv) < PREAMBLE.size:
        raise TruncatedError(f"message truncated: {len(mv)} bytes, the preamble alone is {PREAMBLE.size}")
    _, major, minor, flags, count, total = PREAMBLE.unpack_from(mv, 0)
    if major != MAJOR:
        raise VersionError(f"format version {major}.{minor} is not supported (this decoder reads {MAJOR}.x)")
    if flags:
        raise FormatError(f"reserved flag bits are set (0x{flags:04x}); format {MAJOR}.{MINOR} defines none")
    if total > len(mv):
        raise TruncatedError(f"message truncated: declares {total} bytes, only {len(mv)} present")
    if total < len(mv):
        raise FormatError(f"{len(mv) - total} unexpected bytes after the end of the message")
    if total < PREAMBLE.size + TRAILER.size:
        raise FormatError(f"declared length {total} is smaller than the fixed parts of a message")
    (crc,) = TRAILER.unpack_from(mv, total - TRAILER.size)
    if zlib.crc32(mv[: total - TRAILER.size]) != crc:
        raise ChecksumError("checksum mismatch: the message is corrupted")
    if count == 0 or count > MAX_SECTIONS:
        raise LimitError(f"section count {count} is outside 1..{MAX_SECTIONS}")
    sections = _read_section_table(mv, count, total - TRAILER.size)
    head = sections[0]
    if head.tag != "HEAD" or head.group != MESSAGE_GROUP:
        raise FormatError("the first section must be HEAD")
    if head.raw_bytes > MAX_HEADER_BYTES:
        raise LimitError(f"header of {head.raw_bytes} bytes exceeds the limit of {MAX_HEADER_BYTES}")
    msg = Message(Header((), ()), sections, total, minor, mv)
    header = parse_header(bytes(msg.payload(head)))
    _check_sections_against_header(sections, header)
    return dataclasses.replace(msg, header=header)


def _magic_problem(first: bytes) -> str:
    if first[1:4] == b"MUC":
        return "not a mucsc message: the signature was altered (text-mode transfer or 7-bit channel?)"
    return "not a mucsc message (bad magic number)"


def _read_section_table(mv: memoryview, count: int, end: int) -> tuple[SectionInfo, ...]:
    out = []
    pos = PREAMBLE.size
    for i in range(count):
        if pos + SECTION.size > end:
            raise TruncatedError(f"section {i} header runs past the end of the message")
        tag_b, group, enc, r1, r2, r3, stored, raw = SECTION.unpack_from(mv, pos)
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
        if pad > end - pos - stored or any(mv[pos + stored: pos + stored + pad]):
            raise FormatError(f"section {i} ({tag}): padding missing or not zero")
        out.append(SectionInfo(tag, group, ENCODINGS[enc], stored, raw, pos))
        pos += stored + pad
    if pos != end:
        raise FormatError(f"{end - pos} bytes between the last section and the checksum")
    return tuple(out)


def zstd_decompress_bounded(data: memoryview, raw_len: int, tag: str) -> bytes:
    """Decompress exactly one zstd frame that MUST declare exactly ``raw_len`` bytes; never produce
    more, and reject anything after the frame (a second or skippable frame, padding): FORMAT.md 2.3."""
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError:
        raise FormatError(f"section {tag}: not a zstd frame") from None
    if declared != raw_len:
        raise FormatError(f"section {tag}: zstd frame declares {declared} bytes, section says {raw_len}")
    try:
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw_len, allow_extra_data=False)
    except zstandard.ZstdError as exc:
        if "unused data" in str(exc):
            raise FormatError(f"section {tag}: bytes after the zstd frame (the payload must be exactly "
                              "one frame)") from None
        raise FormatError(f"section {tag}: corrupt zstd data ({exc})") from None
    if len(out) != raw_len:
        raise FormatError(f"section {tag}: zstd frame gave {len(out)} bytes, expected {raw_len}")
    return out


# ---------------------------------------------------------------------------------------------- header

def parse_header(raw: bytes) -> Header:
    """Parse and validate HEAD's JSON against the schema and the limits."""
    depth = json_depth(raw)
    if depth > MAX_JSON_DEPTH:
        raise FormatError(f"header JSON nests {depth} levels deep, more than {MAX_JSON_DEPTH}")
    try:
        obj = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"header is not valid UTF-8 JSON ({exc})") from None
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


# a JSON string, or an unterminated one running to the end; possessive, so it scans in linear time
_JSON_STRING = re.compile(rb'"(?:[^"\\]++|\\[\s\S])*+"?')
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")


def json_depth(raw: bytes) -> int:
    """The deepest nesting of [ and { in JSON text (outside strings), in linear time and memory."""
    brackets = np.frombuffer(_JSON_STRING.sub(b"", raw).translate(None, _NOT_BRACKETS), np.uint8)
    step = np.where((brackets == 0x5B) | (brackets == 0x7B), 1, -1).astype(np.int32)
    depth, level = 0, 0
    for i in range(0, step.size, 1 << 20):
        c = np.cumsum(step[i: i + (1 << 20)]) + level
        depth, level = max(depth, int(c.max())), int(c[-1])
    return depth


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
