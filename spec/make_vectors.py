#!/usr/bin/env python3
"""Write the test vectors in spec/vectors/ and the annotated dump spec/example.md.

    python spec/make_vectors.py          # (re)write them
    python spec/make_vectors.py --check  # exit 1 if the files on disk differ from what would be written

A valid vector is ``valid/NAME.json`` (description, codec, params, seed, shared, compress, the input
tensors and the expected decoded tensors in record order, as name, dtype, shape and little-endian hex) plus ``valid/NAME.mucsc`` (the expected
message).  An invalid vector is ``invalid/NAME.mucsc`` plus an entry in ``invalid/index.json`` naming
the error class a decoder must raise.  Cases for the other codecs live in ``vector_cases_codecs.py``, for
format 1.2's lane-coded IDs in ``vector_cases_lanes.py``;
authenticated messages (format 1.1) in ``vector_cases_auth.py`` (written to ``auth/``).
"""

from __future__ import annotations

import argparse
import json
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
import zstandard

import mucsc
from mucsc.codec.wire import container as fmt

HERE = Path(__file__).resolve().parent
OUT = HERE / "vectors"


def gauss(n, seed=1, dtype="float32", scale=1.0):
    return (np.random.default_rng(seed).normal(size=n) * scale).astype(dtype)


# name -> (description, input (array or dict), encode kwargs)
CASES = {
    "mucsc_z2": ("Z = 2: centroids are min and max, 1-bit ids", gauss(40), dict(codec="mucsc", z=2)),
    "mucsc_z3": ("Z = 3: 2-bit ids with 3 used values", gauss(40, 2), dict(codec="mucsc", z=3)),
    "mucsc_z4": ("Z = 4, 2-bit ids", gauss(64, 3), dict(codec="mucsc", z=4)),
    "mucsc_z16": ("Z = 16, 4-bit ids, a 2-D tensor", gauss(96, 4).reshape(8, 12), dict(codec="mucsc", z=16)),
    "mucsc_z256": ("Z = 256, 8-bit ids", gauss(1000, 5), dict(codec="mucsc", z=256)),
    "mucsc_z5_3bit": ("Z = 5, 3-bit ids (generic packing)", gauss(29, 6), dict(codec="mucsc", z=5)),
    "mucsc_z300_9bit": ("Z = 300, 9-bit ids", gauss(700, 7), dict(codec="mucsc", z=300)),
    "mucsc_constant": ("a constant tensor: one centroid, empty IDS_", np.full(17, 0.25, np.float32),
                       dict(codec="mucsc", z=16)),
    "mucsc_d1": ("d = 1", np.array([-3.5], np.float32), dict(codec="mucsc", z=16)),
    "mucsc_empty": ("an empty tensor of shape (0, 4)", np.zeros((0, 4), np.float32), dict(codec="mucsc", z=16)),
    "mucsc_few_distinct": ("Z larger than the number of distinct values: exact",
                           np.array([1, 2, 2, 3, 1, 3, 3], np.float32), dict(codec="mucsc", z=16)),
    "mucsc_shared": ("a state_dict with a shared codebook and an int buffer carried raw",
                     {"conv.weight": gauss(48, 8).reshape(2, 2, 3, 4), "conv.bias": gauss(2, 9),
                      "steps": np.array([12345], np.int64)}, dict(codec="mucsc", z=8)),
    "mucsc_per_tensor": ("the same state_dict, one codebook per tensor",
                         {"conv.weight": gauss(48, 8).reshape(2, 2, 3, 4), "conv.bias": gauss(2, 9),
                          "steps": np.array([12345], np.int64)}, dict(codec="mucsc", z=8, shared=False)),
    "mucsc_float16": ("float16 input (decoded back to float16)", gauss(50, 10, "float16"), dict(codec="mucsc", z=4)),
    "mucsc_float64": ("float64 input (float64 arithmetic, float64 centroids)", gauss(50, 11, "float64", 1e-6),
                      dict(codec="mucsc", z=16, centroid_dtype="float64")),
    "mucsc_zstd_ids": ("mostly-zero data: IDS_ stored zstd-compressed",
                       np.where(np.arange(4000) % 10 == 0, gauss(4000, 12), 0).astype(np.float32),
                       dict(codec="mucsc", z=4)),
    "mucsc_z8_aligned": ("Z = 8, IDs widened to 4 bits (id_bits) in a zstd-compressed IDS_",
                         gauss(4000, 14), dict(codec="mucsc", z=8)),
    "mucsc_rans_z8": ("format 1.1: Z = 8, cluster IDs rANS-coded (IDSA, one lane)", gauss(3000, 15),
                      dict(codec="mucsc", z=8, id_coding="rans")),
    "mucsc_rans_2lanes": ("format 1.1: Z = 4, IDSA with two interleaved lanes (float16 input)",
                          gauss(33000, 16, "float16"), dict(codec="mucsc", z=4, id_coding="rans")),
    "mucsc_bits_ecsq": ("format 1.1: bits=1.5 goal: entropy-constrained levels beyond the data, rANS IDs",
                        gauss(3000, 17), dict(codec="mucsc", bits=1.5)),
    "policy_pooled_raw": ("format 1.1: the grouping policy (mucsc.Policy) pools small lossless tensors, "
                          "one raw group of two int64 records, one fp16 group of an fp16-exact bias and an "
                          "all-zero tensor, and a weight with its own codebook",
                          {"weight": gauss(600, 15).reshape(20, 30), "bias": np.array([0.5, -1, 2], np.float32),
                           "step": np.array(7, np.int64), "zeros": np.zeros(4, np.float32),
                           "counts": np.array([1, 2, 3], np.int64)},
                          dict(codec="mucsc", z=16, policy={})),
    "mucsc_step_overflow": ("float32 data spanning more than FLT_MAX: c[k+1] - c[k] overflows float32, so "
                            "the rounding step is taken in float64 (FORMAT.md 4.3)",
                            np.linspace(-1.8e38, 1.8e38, 33).astype(np.float32), dict(codec="mucsc", z=2)),
    "raw_ints": ("lossless raw codec for integer and bool tensors",
                 {"a": np.arange(-5, 5, dtype=np.int32), "mask": np.array([True, False, True])},
                 dict(codec="raw")),
}

try:
    sys.path.insert(0, str(HERE))
    from vector_cases_codecs import CASES as CODEC_CASES  # noqa: E402
    from vector_cases_rounding import CASES as ROUNDING_CASES  # noqa: E402
    from vector_cases_lanes import CASES as LANES_CASES  # noqa: E402
    CASES.update(CODEC_CASES)
    CASES.update(ROUNDING_CASES)
    CASES.update(LANES_CASES)
except ImportError:
    pass


def hexed(name, value):
    """A tensor as JSON: name, dtype, shape and little-endian bytes in hex."""
    a = np.asarray(value)
    return {"name": name, "dtype": str(a.dtype), "shape": list(a.shape),
            "hex": a.astype(a.dtype.newbyteorder("<")).tobytes().hex()}


def tensors_json(data):
    """A list (order matters: it is the record order) of hexed tensors."""
    if isinstance(data, dict):
        return [hexed(k, v) for k, v in data.items()]
    return [hexed("", data)]


def policy_arg(enc):
    """encode's ``policy`` keyword from a case's JSON ``policy`` object (the Policy's fields)."""
    return {"policy": mucsc.Policy(**enc["policy"])} if "policy" in enc else {}


def valid_files():
    files = {}
    for name, (desc, data, kw) in CASES.items():
        kw = dict(kw)
        enc = {"seed": kw.pop("seed", 7), "shared": kw.pop("shared", True), "compress": kw.pop("compress", "auto")}
        codec = kw.pop("codec")
        if "policy" in kw:  # only cases that use one carry the key (older vectors keep their bytes)
            enc["policy"] = kw.pop("policy")
        blob = mucsc.encode(data, codec, **{**enc, **policy_arg(enc)}, **kw)
        decoded = mucsc.decode(blob)
        case = {"description": desc, "codec": codec, "params": kw, **enc,
                "container": "dict" if isinstance(data, dict) else "tensor",
                "input": tensors_json(data), "expected": tensors_json(decoded),
                "message": f"{name}.mucsc", "message_bytes": len(blob)}
        files[f"valid/{name}.json"] = (json.dumps(case, indent=1, sort_keys=True) + "\n").encode()
        files[f"valid/{name}.mucsc"] = blob
    return files


def _crc(body: bytes) -> bytes:
    return body[:-4] + struct.pack("<I", zlib.crc32(body[:-4]))


def invalid_files():
    base = mucsc.encode(gauss(20, 13), "mucsc", z=4, seed=1, compress="off")
    sec = []  # section header offsets
    pos = fmt.PREAMBLE.size
    for _ in range(struct.unpack_from("<I", base, 12)[0]):
        sec.append(pos)
        stored = struct.unpack_from("<Q", base, pos + 16)[0]
        pos += fmt.SECTION.size + stored + fmt.padding(stored)

    def patch(offset, fmt_, *values):
        b = bytearray(base)
        struct.pack_into(fmt_, b, offset, *values)
        return _crc(bytes(b))

    cent_head = sec[1]
    cases = {
        "truncated": (base[:-9], "TruncatedError", "the last 9 bytes are missing"),
        "truncated_preamble": (base[:20], "TruncatedError", "shorter than the preamble"),
        "bad_magic": (b"\x89PNG\r\n\x1a\n" + base[8:], "FormatError", "another format's signature"),
        "text_mode_mangled": (base.replace(b"\r\n", b"\n", 1), "FormatError", "CRLF -> LF translation"),
        "future_major": (patch(8, "<B", 2), "VersionError", "major version 2"),
        "bad_checksum": (base[:-4] + bytes(4), "ChecksumError", "the CRC-32 is wrong"),
        "payload_corrupted": (base[:sec[2] + 32] + bytes([base[sec[2] + 32] ^ 0x10]) + base[sec[2] + 33:],
                              "ChecksumError", "one bit of IDS_ flipped"),
        "length_overflow": (patch(cent_head + 16, "<QQ", 2**64 - 8, 2**64 - 8), "TruncatedError",
                            "a section declares 2^64-8 bytes"),
        "total_length_overflow": (patch(16, "<Q", 2**64 - 1), "TruncatedError", "total_length 2^64-1"),
        "reserved_flags": (patch(10, "<H", 0x8000), "FormatError", "a reserved flag bit is set"),
        "reserved_section_bytes": (patch(cent_head + 9, "<B", 1), "FormatError", "reserved byte of a section header"),
        "unknown_encoding": (patch(cent_head + 8, "<B", 9), "FormatError", "section encoding 9"),
        "zstd_ratio_impossible": (_zstd_impossible(base, cent_head),
                                  "LimitError", "zstd section claiming a raw size 2^40 for a few bytes"),
        "ids_out_of_range": (_ids_out_of_range(), "FormatError", "Z = 3 but an id equals 3"),
        "centroids_unsorted": (_unsorted_centroids(base, sec[1]), "FormatError", "CENT not increasing"),
        "pooled_raw_in_1_0": (_pooled_raw_as_1_0(), "FormatError",
                              "a raw group of two records in a message declaring minor 0 (a 1.1 feature)"),
        "zstd_trailing_bytes": (_zstd_trailing(bytes(8)), "FormatError",
                                "8 zero bytes after a section's zstd frame (exactly one frame)"),
        "zstd_second_frame": (_zstd_trailing(zstandard.ZstdCompressor().compress(b"more")), "FormatError",
                              "a second zstd frame after the first in one section"),
        "head_nested_deep": (_assemble([("HEAD", fmt.MESSAGE_GROUP, b"[" * 1000)]), "FormatError",
                             "HEAD is 1000 nested JSON arrays (deeper than 32 levels)"),
        "unknown_critical_section": (_unknown_critical(), "FormatError",
                                     "a group carries a critical section XTRA its codec does not define"),
        "zstd_empty_second_frame": (_zstd_empty(zstandard.ZstdCompressor().compress(b"more")), "FormatError",
                                    "a zstd section of raw_length 0: a second frame after the 0-byte one"),
        "zstd_empty_rle_blocks": (_zstd_empty(None), "FormatError",
                                  "a zstd section of raw_length 0: a frame declaring 0 bytes, then RLE "
                                  "blocks of 128 KiB"),
        "head_lone_surrogate": (_lone_surrogate(), "FormatError",
                                "a record name holding the JSON escape \\ud800 (a lone surrogate, not Unicode)"),
        "group_dtype_mismatch": (_group_dtype_mismatch(), "FormatError",
                                 "a mucsc group of dtype float32 over a float64 record (its records imply "
                                 "float64)"),
    }
    try:
        from vector_cases_codecs import invalid_cases as codec_invalid_cases
        from vector_cases_rounding import invalid_cases as rounding_invalid_cases
        from vector_cases_lanes import invalid_cases as lanes_invalid_cases
        cases.update(codec_invalid_cases())
        cases.update(rounding_invalid_cases())
        cases.update(lanes_invalid_cases())
    except ImportError:
        pass
    files, index = {}, {}
    for name, (blob, err, desc) in cases.items():
        files[f"invalid/{name}.mucsc"] = blob
        index[name] = {"error": err, "description": desc}
        try:
            mucsc.decode(blob)
        except mucsc.MucscError as exc:
            assert type(exc).__name__ == err or err in [c.__name__ for c in type(exc).__mro__], (name, exc)
        else:
            raise AssertionError(f"invalid vector {name} decoded")
    files["invalid/index.json"] = (json.dumps(index, indent=1, sort_keys=True) + "\n").encode()
    return files


def _zstd_impossible(base, head_off):
    b = bytearray(base)
    struct.pack_into("<B", b, head_off + 8, 1)
    struct.pack_into("<Q", b, head_off + 24, 2**40)
    return _crc(bytes(b))


def _assemble(sections) -> bytes:
    """A message from (tag, group, payload) raw sections or (tag, group, stored, raw_length) zstd ones."""
    parts = []
    for tag, group, data, *raw in sections:
        enc, raw_len = (1, raw[0]) if raw else (0, len(data))
        parts.append(fmt.SECTION.pack(tag.encode(), group, enc, 0, 0, 0, len(data), raw_len))
        parts.append(data + bytes(fmt.padding(len(data))))
    total = fmt.PREAMBLE.size + sum(map(len, parts)) + 4
    return _crc(fmt.PREAMBLE.pack(fmt.MAGIC, 1, 0, 0, len(sections), total) + b"".join(parts) + bytes(4))


def _sections_of(blob: bytes) -> list:
    msg = fmt.read_message(blob)
    return [(s.tag, s.group, bytes(msg.payload(s))) for s in msg.sections]


def _zstd_trailing(extra: bytes) -> bytes:
    secs = _sections_of(mucsc.encode(np.zeros(256, np.int32), "raw", compress="off"))
    tag, group, data = secs[1]
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(data)
    return _assemble([secs[0], (tag, group, frame + extra, len(data))])


def _zstd_empty(extra: bytes | None) -> bytes:
    """A one-centroid mucsc group, whose IDS_ holds 0 bytes, with IDS_ zstd-marked: a 0-byte frame
    followed by ``extra``, or (None) a 0-byte frame header followed by 16 RLE blocks."""
    secs = _sections_of(mucsc.encode(np.full(4, 1.5, np.float32), "mucsc", compress="off"))
    empty = zstandard.ZstdCompressor(write_content_size=True).compress(b"")
    if extra is None:  # drop the frame's empty last block; 16 RLE blocks of 128 KiB (4 bytes each)
        extra = b"".join(((131072 << 3) | 2 | (i == 15)).to_bytes(3, "little") + b"\0" for i in range(16))
        empty = empty[:-3]
    assert [t for t, _, _ in secs] == ["HEAD", "CENT", "IDS_"] and secs[2][2] == b""
    return _assemble(secs[:2] + [("IDS_", 0, empty + extra, 0)])


def _lone_surrogate() -> bytes:
    secs = _sections_of(mucsc.encode({"w\u00e9": np.arange(3, dtype=np.int8)}, "raw", compress="off"))
    head = secs[0][2].replace("w\u00e9".encode(), b"w\\ud800")
    return _assemble([("HEAD", fmt.MESSAGE_GROUP, head), *secs[1:]])


def _group_dtype_mismatch() -> bytes:
    secs = _sections_of(mucsc.encode({"w": gauss(20, 13, "float64")}, "mucsc", z=4, seed=1, compress="off"))
    head = json.loads(secs[0][2])
    assert head["groups"][0]["dtype"] == "float64"
    head["groups"][0]["dtype"] = "float32"
    return _assemble([("HEAD", fmt.MESSAGE_GROUP, fmt.canonical_json(head)), *secs[1:]])


def _unknown_critical() -> bytes:
    secs = _sections_of(mucsc.encode(np.arange(4, dtype=np.int16), "raw", compress="off"))
    return _assemble(secs + [("XTRA", 0, b"unknown")])


def _ids_out_of_range():
    x = np.array([0.0, 1.0, 2.0, 0.5], np.float32)  # 3 distinct values... plus 0.5 -> still k = 3 at z = 3
    blob = bytearray(mucsc.encode(x, "mucsc", z=3, compress="off"))
    msg = fmt.read_message(bytes(blob))
    ids = [s for s in msg.sections if s.tag == "IDS_"][0]
    blob[ids.offset] = 0xFF  # ids 3,3,3,3
    return _crc(bytes(blob))


def _pooled_raw_as_1_0():
    blob = mucsc.encode({"a": np.array([1], np.int64), "b": np.array([2, 3], np.int64)}, "raw",
                        policy=mucsc.Policy())
    assert blob[9] == 1
    return _crc(blob[:9] + b"\x00" + blob[10:])


def _unsorted_centroids(base, head_off):
    b = bytearray(base)
    p = head_off + 32
    c0, c1 = struct.unpack_from("<ff", b, p)
    struct.pack_into("<ff", b, p, c1, c0)
    return _crc(bytes(b))


def example_md() -> bytes:
    x = np.array([-1.0, -0.25, 0.0, 0.1, 0.5, 2.0], np.float32)
    blob = mucsc.encode(x, "mucsc", z=4, seed=3, compress="off")
    msg = fmt.read_message(blob)
    lines = ["# Annotated example message", "",
             "Generated by `python spec/make_vectors.py`: `mucsc.encode(x, \"mucsc\", z=4, seed=3, compress=\"off\")`",
             f"with `x = {x.tolist()}` (float32). {len(blob)} bytes in all.", "",
             "| offset | bytes | field | value |", "|---|---|---|---|"]

    def row(off, n, field, value):
        lines.append(f"| {off} | `{blob[off:off + n].hex(' ')}` | {field} | {value} |")

    row(0, 8, "magic", "`\\x89MUC\\r\\n\\x1a\\n`")
    row(8, 1, "major", blob[8])
    row(9, 1, "minor", blob[9])
    row(10, 2, "flags", 0)
    row(12, 4, "section_count", struct.unpack_from("<I", blob, 12)[0])
    row(16, 8, "total_length", struct.unpack_from("<Q", blob, 16)[0])
    for s in msg.sections:
        h = s.offset - 32
        row(h, 4, f"{s.tag}: tag", f"`{s.tag}`")
        row(h + 4, 4, f"{s.tag}: group", "0xFFFFFFFF (message)" if s.group == fmt.MESSAGE_GROUP else s.group)
        row(h + 8, 1, f"{s.tag}: encoding", s.encoding)
        row(h + 9, 7, f"{s.tag}: reserved", 0)
        row(h + 16, 8, f"{s.tag}: stored_length", s.stored_bytes)
        row(h + 24, 8, f"{s.tag}: raw_length", s.raw_bytes)
        payload = bytes(blob[s.offset: s.offset + s.stored_bytes])
        if s.tag == "HEAD":
            for i in range(0, len(payload), 32):
                chunk = payload[i:i + 32]
                lines.append(f"| {s.offset + i} | `{chunk.hex(' ')}` | HEAD json | `{chunk.decode()}` |")
        elif s.tag == "CENT":
            for i, v in enumerate(np.frombuffer(payload, "<f4")):
                row(s.offset + 4 * i, 4, f"CENT[{i}] (float32)", repr(float(v)))
        elif s.tag == "IDS_":
            ids = mucsc.codec.wire.bitpack.unpack(payload, 2, x.size)
            for i, byte in enumerate(payload):
                part = ids[4 * i: 4 * i + 4].tolist()
                row(s.offset + i, 1, f"IDS_ byte {i}", f"2-bit ids of elements {4 * i}..{4 * i + len(part) - 1}, "
                    f"LSB first: {part} (`{byte:08b}`)")
        pad = fmt.padding(s.stored_bytes)
        if pad:
            row(s.offset + s.stored_bytes, pad, "padding", "zeros to a multiple of 8")
    row(len(blob) - 4, 4, "CRC-32 of bytes 0..%d" % (len(blob) - 5), f"0x{struct.unpack_from('<I', blob, len(blob) - 4)[0]:08x}")
    dec = mucsc.decode(blob)
    lines += ["", f"Decoded: `{dec.tolist()}` (each element is its centroid; E[decoded] = x).", ""]
    return "\n".join(lines).encode()


def fingerprint_files():
    """The base fingerprint (FORMAT.md 2.4.1) of a small state_dict with a float, an int, a bool and a
    scalar tensor, listed out of name order (the fingerprint sorts by name)."""
    data = {"layer.weight": gauss(6, 18).reshape(2, 3), "b.bias": np.array([0.5, -0.0], np.float32),
            "steps": np.array(3, np.int64), "mask": np.array([True, False, True]),
            "h": gauss(3, 19, "float16")}
    case = {"description": "mucsc.fingerprint of these tensors (spec/FORMAT.md 2.4.1)",
            "input": tensors_json(data), "fingerprint": mucsc.fingerprint(data),
            "fingerprint_of_bare_first_tensor": mucsc.fingerprint(data["layer.weight"])}
    return {"fingerprint/base_fingerprint.json": (json.dumps(case, indent=1, sort_keys=True) + "\n").encode()}


def all_files():
    from vector_cases_auth import auth_files

    files = {**valid_files(), **invalid_files(), **auth_files(), **fingerprint_files()}
    files["../example.md"] = example_md()
    return files


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the files on disk instead of writing")
    args = ap.parse_args()
    files = all_files()
    bad = []
    for rel, data in sorted(files.items()):
        path = (OUT / rel).resolve()
        if args.check:
            if not path.exists() or path.read_bytes() != data:
                bad.append(rel)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    if args.check and bad:
        print("differs from what make_vectors.py writes:", *bad, sep="\n  ")
        return 1
    print(f"{'checked' if args.check else 'wrote'} {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
