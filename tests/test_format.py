"""The container: framing, integrity, limits, and rejection of every malformed message."""

import json
import struct

import numpy as np
import pytest
import zstandard

import mucsc
from mucsc.codec import format as fmt
from mucsc.errors import (ChecksumError, FormatError, LimitError, MucscError, TruncatedError,
                          VersionError)
from msgtools import build, recrc, section_offsets

HEAD = {"container": "tensor", "groups": [{"codec": "raw", "dtype": "int32", "params": {}, "records": [0]}],
        "meta": {}, "records": [{"dtype": "int32", "name": "", "shape": [3]}]}


def head(**changes):
    h = json.loads(json.dumps(HEAD))
    h.update(changes)
    return fmt.canonical_json(h)


DATA = np.array([1, -2, 3], "<i4").tobytes()


def golden() -> bytes:
    return mucsc.encode({"w": np.arange(12, dtype=np.int64).reshape(3, 4), "b": np.array([True, False])},
                        codec="raw", compress="off")


def test_build_helper_matches_writer():
    blob = build(head(), [(0, "DATA", DATA)])
    np.testing.assert_array_equal(mucsc.decode(blob), [1, -2, 3])
    assert blob == mucsc.encode(np.array([1, -2, 3], np.int32), codec="raw", compress="off")


def test_size_formula_and_alignment():
    blob = golden()
    offs = section_offsets(blob)
    assert all(o % 8 == 0 for o, *_ in offs)
    assert len(blob) == fmt.message_size([s for _, _, s, _ in offs])
    assert struct.unpack_from("<Q", blob, 16)[0] == len(blob)


def test_every_truncation_is_rejected_cleanly():
    blob = golden()
    for cut in range(len(blob)):
        with pytest.raises(FormatError):
            mucsc.decode(blob[:cut])


def test_every_byte_flip_is_rejected_cleanly():
    blob = golden()
    for i in range(len(blob)):
        bad = bytearray(blob)
        bad[i] ^= 0x01
        with pytest.raises(MucscError):
            mucsc.decode(bytes(bad))


def test_crc_mismatch_is_checksum_error():
    blob = bytearray(golden())
    blob[-10] ^= 0xFF
    with pytest.raises(ChecksumError):
        mucsc.decode(bytes(blob))


@pytest.mark.parametrize("mangle, error, match", [
    (lambda b: b"GIF89a" + b[6:], FormatError, "bad magic"),
    (lambda b: b[:4].replace(b"\x89", b"\x09") + b[4:], FormatError, "bad magic|altered"),
    (lambda b: b.replace(b"\r\n", b"\n", 1), FormatError, "altered"),
    (lambda b: b + b"\x00", FormatError, "unexpected bytes"),
])
def test_bad_magic_and_lengths(mangle, error, match):
    with pytest.raises(error, match=match):
        mucsc.decode(mangle(golden()))


def test_future_major_version():
    with pytest.raises(VersionError, match="2.0"):
        mucsc.decode(build(head(), [(0, "DATA", DATA)], major=2))


def test_reserved_flags_and_bytes():
    with pytest.raises(FormatError, match="flag"):
        mucsc.decode(build(head(), [(0, "DATA", DATA)], flags=4))
    blob = bytearray(build(head(), [(0, "DATA", DATA)]))
    pos = section_offsets(bytes(blob))[1][0]
    blob[pos + 12] = 1
    with pytest.raises(FormatError, match="reserved"):
        mucsc.decode(recrc(blob))


def test_section_length_overflow():
    blob = bytearray(build(head(), [(0, "DATA", DATA)]))
    pos = section_offsets(bytes(blob))[1][0]
    struct.pack_into("<QQ", blob, pos + 16, 2**63, 2**63)
    with pytest.raises(TruncatedError):
        mucsc.decode(recrc(blob))


def test_nonzero_padding():
    blob = bytearray(build(head(), [(0, "DATA", DATA)]))
    pos, _, stored, _ = section_offsets(bytes(blob))[1]
    blob[pos + 32 + stored] = 7
    with pytest.raises(FormatError, match="padding"):
        mucsc.decode(recrc(blob))


def test_zstd_bomb_and_size_mismatch_are_rejected():
    bomb = zstandard.ZstdCompressor().compress(bytes(64 << 20))  # declares 64 MiB
    hj = head(records=[{"dtype": "uint8", "name": "", "shape": [12]}],
              groups=[{"codec": "raw", "dtype": "uint8", "params": {}, "records": [0]}])
    blob = bytearray(build(hj, [(0, "DATA", bomb)]))
    pos = section_offsets(bytes(blob))[1][0]
    struct.pack_into("<B", blob, pos + 8, 1)  # zstd
    struct.pack_into("<Q", blob, pos + 24, 12)  # claims 12 raw bytes
    with pytest.raises(FormatError, match="declares"):
        mucsc.decode(recrc(blob))
    struct.pack_into("<Q", blob, pos + 24, 64 << 30)  # claims 64 GiB from a few KB
    with pytest.raises(LimitError, match="impossible"):
        mucsc.decode(recrc(blob))


def test_unknown_sections():
    ok = build(head(), [(0, "DATA", DATA), (0, "note", b"ancillary: skipped")])
    np.testing.assert_array_equal(mucsc.decode(ok), [1, -2, 3])
    with pytest.raises(FormatError, match="critical"):
        mucsc.decode(build(head(), [(0, "DATA", DATA), (0xFFFFFFFF, "XTRA", b"")]))
    with pytest.raises(FormatError, match="group 5"):
        mucsc.decode(build(head(), [(5, "DATA", DATA)]))
    with pytest.raises(FormatError, match="twice"):
        mucsc.decode(build(head(), [(0, "DATA", DATA), (0, "DATA", DATA)]))


@pytest.mark.parametrize("hj, match", [
    (b"not json", "JSON"),
    (b"[]", "object"),
    (b'{"container":"tensor","groups":[],"meta":{},"records":[],"x":NaN}', "JSON"),
    (head(container="zip"), "container"),
    (head(records=[{"dtype": "complex64", "name": "", "shape": [3]}]), "dtype"),
    (head(records=[{"dtype": "int32", "name": "", "shape": [-3]}]), "shape"),
    (head(records=[{"dtype": "int32", "name": "", "shape": [1] * 33}]), "rank"),
    (head(records=[{"dtype": "int32", "name": "x" * 2000, "shape": [3]}]), "name longer"),
    (head(records=[{"dtype": "int32", "name": "", "shape": [2**41]}]), "elements"),
    (head(groups=[]), "exactly one group"),
    (head(groups=[{"codec": "raw", "dtype": "int32", "params": {}, "records": [0, 0]}]), "exactly one group"),
    (head(groups=[{"codec": "raw", "dtype": "int32", "params": {}, "records": [3]}]), "record indices"),
    (head(groups=[{"codec": "nope", "dtype": "int32", "params": {}, "records": [0]}]), "does not know"),
])
def test_bad_headers(hj, match):
    with pytest.raises(FormatError, match=match):
        mucsc.decode(build(hj, [(0, "DATA", DATA)]))


def test_raw_section_length_must_match_records():
    with pytest.raises(FormatError, match="expected 12"):
        mucsc.decode(build(head(), [(0, "DATA", DATA + b"\0\0\0\0")]))


def test_max_elements_guard():
    blob = mucsc.encode(np.zeros(1000, np.int8), codec="raw")
    with pytest.raises(LimitError, match="max_elements"):
        mucsc.decode(blob, max_elements=999)


def test_empty_and_scalar_records_round_trip():
    data = {"empty": np.zeros((0, 3), np.int16), "scalar": np.array(7, np.uint64)}
    out = mucsc.decode(mucsc.encode(data, codec="raw"))
    assert out["empty"].shape == (0, 3) and out["empty"].dtype == np.int16
    assert out["scalar"].shape == () and out["scalar"] == 7 and out["scalar"].dtype == np.uint64


def test_inspect_counts_every_byte():
    blob = golden()
    info = mucsc.inspect(blob)
    assert info.size == len(blob)
    assert fmt.PREAMBLE.size + fmt.TRAILER.size + sum(
        fmt.SECTION.size + s.stored_bytes + fmt.padding(s.stored_bytes) for s in info.sections) == len(blob)
    json.dumps(info.to_dict())
    assert [r.name for r in info.records] == ["w", "b"]
