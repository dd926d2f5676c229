"""The container: framing, integrity, limits, and rejection of every malformed message."""

import json
import struct
import zlib

import numpy as np
import pytest
import zstandard

import mucsc
from mucsc.codec.wire import container as fmt
from mucsc.codec import kernels, parallel
from mucsc.errors import (ChecksumError, FormatError, LimitError, MucscError, TruncatedError,
                          VersionError)
from msgtools import build, recrc, section_offsets

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too

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


# ---- the writer's single buffer (issue 16: one copy of each payload, its CRC taken in the same pass) ----

class HostPayload:
    """A ``format.Payload`` over host bytes: the writer's path for payloads left on a device."""

    def __init__(self, data: bytes) -> None:
        self.data, self.nbytes, self.hosted = data, len(data), 0

    def host(self):
        self.hosted += 1
        return np.frombuffer(self.data, np.uint8)

    def write_into(self, out) -> int:
        np.frombuffer(out, np.uint8)[:] = np.frombuffer(self.data, np.uint8)
        return zlib.crc32(self.data)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("threads", [1, 3])
def test_writer_fills_one_buffer_with_the_reference_bytes(monkeypatch, compiled, threads):
    """The message is written into one buffer (the returned bytes object itself with the compiled
    kernels, a numpy array otherwise), copied and checksummed in parallel parts: the bytes equal the
    independent writer of tests/msgtools.py for payloads of odd lengths given as bytes, arrays,
    memoryviews and Payloads."""
    if compiled and getattr(kernels.c_module(), "new_bytes", None) is None:
        pytest.skip("compiled kernels not built")
    monkeypatch.setattr(kernels, "BACKEND", "c" if compiled else "numpy")
    monkeypatch.setattr(parallel, "CHUNK", 1 << 12)  # parallel parts from 8 KiB on
    monkeypatch.setattr(parallel, "COPY_PIECE", 1000)
    rng = np.random.default_rng(7)
    data = [rng.bytes(n) for n in (0, 1, 13, 9000, 40_001, 3)]
    header = fmt.Header((), ())
    given = [data[0], np.frombuffer(data[1], np.uint8), memoryview(data[2]), HostPayload(data[3]),
             HostPayload(data[4]), np.frombuffer(data[5], np.uint8).view(np.dtype("S3"))]
    with parallel.using(threads):
        blob = fmt.write_message(header, [(i % 2, f"DAT{i}", d, False) for i, d in enumerate(given)],
                                 zstd_level=None)
    assert type(blob) is bytes
    assert blob == build(header.to_json(), [(i % 2, f"DAT{i}", d) for i, d in enumerate(data)])


def test_writer_compresses_a_payload_from_its_host_bytes(monkeypatch):
    """A compressible Payload is brought to the host once and stored as zstd when smaller, raw
    (those host bytes) when not: the same message as for the host bytes themselves."""
    header = fmt.Header((), ())
    small, noise = bytes(5000), np.random.default_rng(1).bytes(3000)
    lazy = [HostPayload(small), HostPayload(noise)]
    got = fmt.write_message(header, [(0, "ZERO", lazy[0], True), (0, "RAND", lazy[1], True)], minor=1)
    assert got == fmt.write_message(header, [(0, "ZERO", small, True), (0, "RAND", noise, True)], minor=1)
    assert [p.hosted for p in lazy] == [1, 1]
    assert [got[pos + 8] for pos, *_ in section_offsets(got)] == [fmt.ENC_RAW, fmt.ENC_ZSTD, fmt.ENC_RAW]  # HEAD, ZERO, RAND


def test_writer_stores_a_codecs_zstd_frame_of_its_level():
    """compressible=ZstdFrame(level, frame): a writer at that level stores the frame as given (the
    codec compressed those bytes already), at another level compresses the bytes itself; a frame
    made by the same compressor gives the same message as compressible=True."""
    header = fmt.Header((), ())
    data = bytes(4000) + np.random.default_rng(2).bytes(500)
    frame = parallel.zstd_compressor(3, 1).compress(data)
    same = fmt.write_message(header, [(0, "IDS_", data, fmt.ZstdFrame(3, frame))])
    assert same == fmt.write_message(header, [(0, "IDS_", data, True)])
    marked = fmt.ZstdFrame(3, frame[:-1] + bytes([frame[-1] ^ 1]))  # not zstd's: shows which was stored
    assert marked.frame in fmt.write_message(header, [(0, "IDS_", data, marked)])
    other = fmt.write_message(header, [(0, "IDS_", data, marked)], zstd_level=9)
    assert other == fmt.write_message(header, [(0, "IDS_", data, True)], zstd_level=9)
    assert fmt.section_bytes(data, marked, 3) == fmt.section_bytes(data, True, 3)


def test_new_bytes_gives_a_filled_bytes_object():
    new_bytes = getattr(kernels.c_module(), "new_bytes", None)
    if new_bytes is None:
        pytest.skip("compiled kernels not built")
    blob, writable = new_bytes(5)
    view = np.frombuffer(writable, np.uint8)
    view[:] = np.arange(65, 70)
    del writable
    assert type(blob) is bytes and blob == b"ABCDE" and len({blob, b"ABCDE"}) == 1
    with pytest.raises(ValueError):
        new_bytes(1)
