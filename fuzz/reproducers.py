"""The inputs behind the hostile-input findings of issue 26, built on demand (some are megabytes once
inflated, none is stored).  Used by the regression tests (tests/test_hostile_round3.py), the CLI
traceback sweep (tests/test_hostile_cli_sweep.py) and benchmarks/bench_hostile.py, which measures the
memory and time the decoder spends refusing findings 1, 2 and 3.

``MESSAGES``: name -> function returning a message that every reader must refuse with a MucscError.
``FILES``: name -> function(directory) writing an input file for the CLI; returns its path.
"""

from __future__ import annotations

import json
import struct
import zipfile
import zlib
from pathlib import Path

import zstandard

from mucsc.codec.wire import container as fmt

MiB = 1 << 20


def message(head: bytes, sections: list[tuple], *, minor: int = 0, head_stored: bytes | None = None) -> bytes:
    """A message from raw parts, with a valid CRC: HEAD's JSON (stored as ``head_stored``, zstd, when
    given), then sections (group, tag, data) stored raw or (group, tag, stored, raw_length) zstd."""
    first = (fmt.MESSAGE_GROUP, "HEAD", head) if head_stored is None else (
        fmt.MESSAGE_GROUP, "HEAD", head_stored, len(head))
    parts = []
    for group, tag, data, *raw in [first, *sections]:
        enc, raw_len = (fmt.ENC_ZSTD, raw[0]) if raw else (fmt.ENC_RAW, len(data))
        parts += [fmt.SECTION.pack(tag.encode(), group, enc, 0, 0, 0, len(data), raw_len),
                  data + bytes(fmt.padding(len(data)))]
    total = fmt.PREAMBLE.size + sum(map(len, parts)) + fmt.TRAILER.size
    body = fmt.PREAMBLE.pack(fmt.MAGIC, 1, minor, 0, 1 + len(sections), total) + b"".join(parts)
    return body + struct.pack("<I", zlib.crc32(body))


def _head(records: list, groups: list, meta: dict | None = None) -> bytes:
    return fmt.canonical_json({"container": "dict", "groups": groups, "meta": meta or {}, "records": records})


def _raw_group(dtype: str, records: list[int]) -> dict:
    return {"codec": "raw", "dtype": dtype, "params": {}, "records": records}


# ---- finding 1: HEAD nesting check that was a bomb itself --------------------------------------------

def deep_head(mib: int = 16) -> bytes:
    """16 MiB of '[' as a zstd HEAD, padded by an ancillary section to 4 KB: what the old 4096x
    bound on HEAD (of the message size) let through."""
    raw = b"[" * (mib * MiB)
    return message(raw, [(fmt.MESSAGE_GROUP, "pad_", bytes(3600))],
                   head_stored=zstandard.ZstdCompressor().compress(raw))


# ---- finding 3: HEAD with 300,000 records -------------------------------------------------------------

def many_records(n: int = 300_000) -> bytes:
    """n records, no group (so invalid), as a zstd HEAD: a message of about 185 KB."""
    recs = b",".join(b'{"dtype":"float32","name":"%d","shape":[1]}' % i for i in range(n))
    raw = b'{"container":"dict","groups":[],"meta":{},"records":[' + recs + b"]}"  # canonical, built fast
    return message(raw, [], head_stored=zstandard.ZstdCompressor().compress(raw))


# ---- finding 4: lone surrogates in HEAD --------------------------------------------------------------

def _surrogate(where: str) -> bytes:
    """A lone surrogate escape (valid JSON, not Unicode text) in a record name, a meta key or value."""
    name = "w\\ud800" if where == "name" else "w"
    meta = {"k": "x\\udfff"} if where == "value" else {"\\ud83d": "v"} if where == "key" else {}
    raw = _head([{"dtype": "int8", "name": name, "shape": [1]}], [_raw_group("int8", [0])], meta)
    return message(raw.replace(b"\\\\u", b"\\u"), [(0, "DATA", b"\x01")])


# ---- finding 6: zstd-marked sections of raw_length 0 ---------------------------------------------------

EMPTY_FRAME = zstandard.ZstdCompressor(write_content_size=True).compress(b"")


def _empty_ids(stored: bytes) -> bytes:
    """A one-centroid mucsc group (its IDS_ holds 0 bytes), IDS_ zstd-marked with ``stored``."""
    raw = _head([{"dtype": "float32", "name": "w", "shape": [4]}],
                [{"codec": "mucsc", "dtype": "float32", "records": [0],
                  "params": {"centroids": 1, "centroid_dtype": "float32", "id_bits": 0, "solver": "optimal",
                             "z": 16}}])
    return message(raw, [(0, "CENT", struct.pack("<f", 1.5)), (0, "IDS_", stored, 0)])


def rle_blocks(count: int) -> bytes:
    """``count`` zstd RLE blocks of 128 KiB each (the last one marked last), 4 bytes each."""
    out = b""
    for i in range(count):
        h = ((128 << 10) << 3) | (1 << 1) | (i == count - 1)
        out += h.to_bytes(3, "little") + b"\x00"
    return out


def empty_zstd_trailing() -> bytes:
    return _empty_ids(EMPTY_FRAME + zstandard.ZstdCompressor().compress(b"more"))


def empty_zstd_rle() -> bytes:
    """A frame header declaring 0 bytes, then 8192 RLE blocks that claim 1 GiB."""
    header = EMPTY_FRAME[:-3]  # the frame minus its one empty last block
    return _empty_ids(header + rle_blocks(8192))


# ---- finding 7: a lossy group's dtype against its records ---------------------------------------------

def group_dtype_mismatch() -> bytes:
    """A float32 mucsc group over a float64 record (the records imply float64)."""
    import numpy as np

    import mucsc

    blob = mucsc.encode({"w": np.linspace(-1, 1, 40)}, "mucsc", z=4, compress="off")
    msg = fmt.read_message(blob)
    head = json.loads(bytes(msg.payload(msg.sections[0])))
    assert head["groups"][0]["dtype"] == "float64"
    head["groups"][0]["dtype"] = "float32"
    secs = [(s.group, s.tag, bytes(msg.payload(s))) for s in msg.sections[1:]]
    return message(fmt.canonical_json(head), secs)


MESSAGES = {
    "deep_head_16mib": deep_head,
    "records_300k": many_records,
    "surrogate_in_name": lambda: _surrogate("name"),
    "surrogate_in_meta_value": lambda: _surrogate("value"),
    "surrogate_in_meta_key": lambda: _surrogate("key"),
    "empty_zstd_trailing_frame": empty_zstd_trailing,
    "empty_zstd_rle_blocks": empty_zstd_rle,
    "group_dtype_mismatch": group_dtype_mismatch,
}


# ---- files for the CLI ------------------------------------------------------------------------------

def pt_bomb(path: Path, inflated: int = 2 << 30) -> Path:
    """A torch zip checkpoint of one small tensor whose storage member is replaced by a deflated one of
    ``inflated`` zero bytes (2 GiB: a 2 MB file)."""
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"w": torch.zeros(4)}, buf)
    with zipfile.ZipFile(buf) as src, zipfile.ZipFile(path, "w") as out:
        for info in src.infolist():
            if info.filename.endswith("/data/0"):
                member = zipfile.ZipInfo(info.filename)
                member.compress_type = zipfile.ZIP_DEFLATED
                with out.open(member, "w", force_zip64=True) as m:
                    zeros = bytes(16 * MiB)
                    for a in range(0, inflated, len(zeros)):
                        m.write(zeros[: min(len(zeros), inflated - a)])
            else:
                out.writestr(info, src.read(info))
    return path


def npz_bad_npy_header(path: Path) -> Path:
    """An .npz whose member's .npy header is an unterminated Python literal (tokenize.TokenError)."""
    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), '''"
    header += b" " * (-(len(header) + 11) % 64) + b"\n"
    npy = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + bytes(12)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("a.npy", npy)
    return path


def binary_config(path: Path) -> Path:
    """A file that is not UTF-8 text, given as ``mucsc sim --config``."""
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe" + bytes(range(256)))
    return path


FILES = {"pt_bomb": lambda d: pt_bomb(Path(d) / "bomb.pt", 64 * MiB),
         "npz_bad_npy_header": lambda d: npz_bad_npy_header(Path(d) / "bad.npz"),
         "binary_config": lambda d: binary_config(Path(d) / "config.toml")}
