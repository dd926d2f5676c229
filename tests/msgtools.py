"""Helpers for tests that build or tamper with messages at the byte level."""

from __future__ import annotations

import struct
import tracemalloc
import zlib

from mucsc.codec.wire import container as fmt


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


def build(header_json: bytes, sections: list[tuple], *, major: int = 1, flags: int = 0,
          head_zstd: bytes | None = None) -> bytes:
    """A message from raw parts (HEAD first), with a valid CRC.

    A section is (group, tag, data), stored raw, or (group, tag, stored, raw_length): stored
    zstd-encoded with that declared raw length (the stored bytes are not checked).  ``head_zstd``:
    HEAD's stored bytes, zstd-encoded, ``header_json`` being its declared raw content."""
    parts = []
    head = (fmt.MESSAGE_GROUP, "HEAD", header_json) if head_zstd is None else (
        fmt.MESSAGE_GROUP, "HEAD", head_zstd, len(header_json))
    for group, tag, data, *raw in [head, *sections]:
        enc, raw_len = (1, raw[0]) if raw else (0, len(data))
        parts.append(fmt.SECTION.pack(tag.encode(), group, enc, 0, 0, 0, len(data), raw_len))
        parts.append(data + bytes(fmt.padding(len(data))))
    total = fmt.PREAMBLE.size + sum(map(len, parts)) + 4
    body = fmt.PREAMBLE.pack(fmt.MAGIC, major, 0, flags, 1 + len(sections), total) + b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


def zstd_frame_header(content_size: int) -> bytes:
    """The header of a zstd frame declaring ``content_size`` (single segment, 8-byte size field)."""
    return struct.pack("<IB", 0xFD2FB528, 0xE0) + struct.pack("<Q", content_size)


def peak_bytes(fn, *args, **kw):
    """(peak bytes traced while fn runs, the exception it raised or None): decoders of hostile
    messages are held to memory bounds with it (numpy buffers, Python objects and zstd output)."""
    tracemalloc.start()
    try:
        fn(*args, **kw)
        exc = None
    except Exception as e:  # noqa: BLE001 - returned to the caller, which asserts on it
        exc = e
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak, exc
