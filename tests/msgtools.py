"""Helpers for tests that build or tamper with messages at the byte level."""

from __future__ import annotations

import struct
import zlib

from mucsc.codec import format as fmt


def recrc(blob: bytes | bytearray) -> bytes:
    """Recompute the trailer CRC so that a tampered message reaches the checks behind it."""
    body = bytes(blob[:-4])
    return body + struct.pack("<I", zlib.crc32(body))


def section_offsets(blob: bytes) -> list[tuple[int, str, int, int]]:
    """(header offset, tag, stored, raw) of every section."""
    out = []
    count = struct.unpack_from("<I", blob, 12)[0]
    pos = fmt.PREAMBLE.size
    for _ in range(count):
        tag, _g, _e, _r1, _r2, _r3, stored, raw = fmt.SECTION.unpack_from(blob, pos)
        out.append((pos, tag.decode(), stored, raw))
        pos += fmt.SECTION.size + stored + fmt.padding(stored)
    return out


def build(header_json: bytes, sections: list[tuple[int, str, bytes]], *, major: int = 1,
          flags: int = 0) -> bytes:
    """A message from raw parts (HEAD first, all raw-encoded), with a valid CRC."""
    parts = []
    for group, tag, data in [(fmt.MESSAGE_GROUP, "HEAD", header_json), *sections]:
        parts.append(fmt.SECTION.pack(tag.encode(), group, 0, 0, 0, 0, len(data), len(data)))
        parts.append(data + bytes(fmt.padding(len(data))))
    total = fmt.PREAMBLE.size + sum(map(len, parts)) + 4
    body = fmt.PREAMBLE.pack(fmt.MAGIC, major, 0, flags, 1 + len(sections), total) + b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))
