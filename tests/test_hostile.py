"""Hostile messages (issue 9, items 1-5): each escape found by fuzzing, as a small message built here.

Every test asserts the specific MucscError and, where the attack was a huge allocation, that the
decoder's peak memory (tracemalloc: numpy buffers and Python objects, zstd output included) stays a
small multiple of the message, far below what the message declares.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import zstandard
from click.testing import CliRunner

import mucsc
from mucsc.cli.main import main
from mucsc.codec.wire import container as fmt
from mucsc.codec.wire import sparse
from mucsc.errors import FormatError, LimitError
from msgtools import build, peak_bytes, section_offsets, zstd_frame_header

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too

MiB = 1 << 20


def head(records, groups, container="dict", meta=None):
    return fmt.canonical_json({"container": container, "groups": groups, "meta": meta or {},
                               "records": records})


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


# ---- 1. deeply nested HEAD ---------------------------------------------------------------------------

DEEP = build(b"[" * 100_000, [])


@pytest.mark.parametrize("fn", [mucsc.decode, mucsc.inspect, mucsc.verify])
def test_deep_json_is_a_format_error(fn):
    with pytest.raises(FormatError, match="nests 100000 levels"):
        fn(DEEP)


def test_deep_json_inside_meta_and_strings():
    ok = head([{"dtype": "int8", "name": "[[[[" * 50, "shape": [1]}],
              [{"codec": "raw", "dtype": "int8", "params": {}, "records": [0]}], meta={"k": "{" * 999})
    assert fmt.json_depth(ok) == 4  # brackets inside strings do not count
    mucsc.decode(build(ok, [(0, "DATA", b"\1")]))
    escaped = b'{"a":"\\"' + b"[" * 100 + b'"}'  # an escaped quote does not end the string
    assert fmt.json_depth(escaped) == 1
    nested: list = [1]
    for _ in range(40):
        nested = [nested]
    deep = json.dumps({"container": "dict", "groups": [], "meta": {}, "records": [], "x": nested}).encode()
    with pytest.raises(FormatError, match="levels deep"):
        mucsc.inspect(build(deep, []))


def test_deep_json_in_the_cli(tmp_path):
    p = tmp_path / "deep.mucsc"
    p.write_bytes(DEEP)
    for cmd in ("info", "test"):
        r = cli(cmd, p)
        assert r.exit_code == 1 and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1 and "levels deep" in r.stderr


# ---- 2. tiny messages declaring huge outputs --------------------------------------------------------

def constant_message(n: int, dtype: str = "float32") -> bytes:
    """A valid one-centroid mucsc message of n elements: ~300 bytes whatever n is."""
    hj = head([{"dtype": dtype, "name": "w", "shape": [n]}],
              [{"codec": "mucsc", "dtype": dtype, "records": [0],
                "params": {"centroids": 1, "centroid_dtype": "float32", "id_bits": 0, "solver": "optimal",
                           "z": 16}}])
    return build(hj, [(0, "CENT", np.float32([1.5]).tobytes()), (0, "IDS_", b"")])


def sparse_message(n: int) -> bytes:
    """A valid bmucsc message keeping nothing: n elements, all the mean."""
    hj = head([{"dtype": "float32", "name": "w", "shape": [n]}],
              [{"codec": "bmucsc", "dtype": "float32", "records": [0],
                "params": {"keep": 0.01, "k": 0, "centroids": 0, "centroid_dtype": "float32", "id_bits": 0,
                           "solver": "optimal", "z": 256, "pos": "rice", "pos_arg": 0}}])
    return build(hj, [(0, "CENT", b""), (0, "IDS_", b""), (0, "INDX", b""),
                      (0, "SCAL", np.float32([2.0]).tobytes())])


@pytest.mark.parametrize("blob", [constant_message(1 << 31), sparse_message(1 << 31),
                                  constant_message(1 << 32, "float64")], ids=["constant", "sparse", "f64"])
def test_huge_declared_output_is_refused_by_default(blob):
    assert len(blob) < 600
    peak, exc = peak_bytes(mucsc.decode, blob)
    assert isinstance(exc, LimitError) and peak < 4 * MiB
    assert "max_elements" in str(exc)
    peak, exc = peak_bytes(mucsc.decode, blob, max_elements=None)  # the expansion bound still holds
    assert isinstance(exc, LimitError) and "max_expansion" in str(exc) and peak < 4 * MiB
    with pytest.raises(LimitError, match="max_expansion"):
        mucsc.verify(blob, max_elements=None)


def test_expansion_floor_and_opt_in():
    small = constant_message(1 << 20)  # 4 MiB of output from ~300 bytes: under the 64 MiB floor
    assert np.all(mucsc.decode(small)["w"] == 1.5)
    big = constant_message(20 << 20)  # 80 MiB: over the floor, refused unless the caller opts in
    with pytest.raises(LimitError, match="max_expansion=None"):
        mucsc.decode(big)
    assert mucsc.decode(big, max_expansion=None)["w"].size == 20 << 20
    assert mucsc.decode(big, max_expansion=1e6)["w"].size == 20 << 20
    with pytest.raises(LimitError, match="max_elements"):
        mucsc.decode(big, max_expansion=None, max_elements=1000)


def test_real_messages_pass_the_default_limits():
    rng = np.random.default_rng(0)
    x = rng.normal(size=1 << 22).astype(np.float32)
    for codec, params in [("bmucsc", {"keep": 0.001}), ("topk", {"keep": 0.001}), ("signsgd", {}),
                          ("mucsc", {"z": 2})]:
        blob = mucsc.encode(x, codec, **params)
        assert mucsc.decode(blob).shape == x.shape


def test_memory_error_never_escapes(monkeypatch):
    from mucsc.codec.codecs.raw import Raw

    def boom(*a, **k):
        raise MemoryError

    monkeypatch.setattr(Raw, "decode_array", classmethod(lambda cls, *a: boom()))
    with pytest.raises(LimitError, match="out of memory"):
        mucsc.decode(mucsc.encode(np.arange(3, dtype=np.int8)))


def test_cli_limits(tmp_path):
    p = tmp_path / "big.mucsc"
    p.write_bytes(constant_message(20 << 20))
    r = cli("test", p)
    assert r.exit_code == 1 and "--max-expansion none" in r.stderr and len(r.stderr.splitlines()) == 1
    assert cli("test", "--max-expansion", "none", p).exit_code == 0
    r = cli("test", "--max-expansion", "none", "--max-elements", "100", p)
    assert r.exit_code == 1 and "max_elements" in r.stderr
    assert cli("test", "--max-expansion", "lots", p).exit_code == 2
    out = tmp_path / "big.npy"
    r = cli("decompress", p, "-o", out)
    assert r.exit_code == 1 and not out.exists()
    assert cli("decompress", "--max-expansion", "1e6", p, "-o", out).exit_code == 0
    assert np.load(out).size == 20 << 20


# ---- 3. zstd sections checked before they are inflated ---------------------------------------------

def _ids_message(n: int, ids_stored: bytes, ids_raw: int) -> bytes:
    hj = head([{"dtype": "float32", "name": "w", "shape": [n]}],
              [{"codec": "mucsc", "dtype": "float32", "records": [0],
                "params": {"centroids": 2, "centroid_dtype": "float32", "id_bits": 1, "solver": "optimal",
                           "z": 2}}])
    return build(hj, [(0, "CENT", np.float32([0, 1]).tobytes()), (0, "IDS_", ids_stored, ids_raw)])


def test_zstd_section_size_checked_against_the_codec_first():
    # IDS_ must be ceil(n/8) = 125 bytes; it declares 1 GiB (a frame header saying so, 33 KB stored)
    blob = _ids_message(1000, zstd_frame_header(1 << 30) + bytes(33_000), 1 << 30)
    peak, exc = peak_bytes(mucsc.decode, blob)
    assert isinstance(exc, FormatError) and "expected 125" in str(exc)
    assert peak < 2 * MiB


def test_zstd_section_bounded_by_the_group_size():
    # a topk INDX (variable length) may not exceed 16 bytes per element + 1 MiB before inflation
    frame = zstandard.ZstdCompressor().compress(bytes(32 * MiB))
    hj = head([{"dtype": "float32", "name": "w", "shape": [1000]}],
              [{"codec": "topk", "dtype": "float32", "records": [0],
                "params": {"keep": 0.01, "k": 10, "pos": "rice", "pos_arg": 0}}])
    blob = build(hj, [(0, "INDX", frame, 32 * MiB), (0, "VALS", bytes(40))])
    peak, exc = peak_bytes(mucsc.decode, blob)
    assert isinstance(exc, LimitError) and "INDX" in str(exc)
    assert peak < 2 * MiB


def test_unknown_critical_section_is_rejected_unread():
    blob = mucsc.encode(np.arange(5, dtype=np.int8))
    msg = fmt.read_message(blob)
    secs = [(s.group, s.tag, bytes(msg.payload(s))) for s in msg.sections[1:]]
    huge = zstd_frame_header(1 << 30) + bytes(40_000)
    forged = build(bytes(msg.payload(msg.sections[0])), secs + [(0, "XTRA", huge, 1 << 30)])
    peak, exc = peak_bytes(mucsc.decode, forged)
    assert isinstance(exc, FormatError) and "'XTRA'" in str(exc) and peak < 2 * MiB
    # an ancillary one is skipped
    assert mucsc.decode(build(bytes(msg.payload(msg.sections[0])), secs + [(0, "xtra", b"hello")])).size == 5


# ---- 4. Rice / unary positions without a byte per bit ----------------------------------------------

@pytest.mark.parametrize("fill", [0x00, 0xFF, 0x80])
def test_rice_decoder_memory_is_bounded_by_k(fill):
    buf = bytes([fill]) * (16 * MiB)  # the old decoder expanded this to 128 MiB of bits + positions
    d, k = 1 << 40, 1000
    peak, exc = peak_bytes(sparse.decode, buf, d, k, "rice", 0)
    assert isinstance(exc, FormatError)
    assert peak < 12 * MiB


def test_rice_message_with_huge_unary_stream():
    n = 1 << 20
    frame = zstandard.ZstdCompressor().compress(bytes(16 * MiB))  # k unary codes never end
    hj = head([{"dtype": "float32", "name": "w", "shape": [n]}],
              [{"codec": "topk", "dtype": "float32", "records": [0],
                "params": {"keep": 0.001, "k": 100, "pos": "rice", "pos_arg": 0}}])
    blob = build(hj, [(0, "INDX", frame, 16 * MiB), (0, "VALS", bytes(400))])
    assert len(blob) < 4096
    peak, exc = peak_bytes(mucsc.decode, blob)
    assert isinstance(exc, FormatError) and "unary" in str(exc)
    assert peak < 16 * MiB + 8 * MiB  # the inflated section (bounded by n) plus a scan window


@pytest.mark.parametrize("method", ["fixed", "rice", "ef", "bitmap"])
def test_byte_readers_match_the_encoder(method):
    rng = np.random.default_rng(7)
    for d, k in [(1, 1), (9, 3), (1 << 20, 5000), ((1 << 40) + 3, 3000)]:
        if method == "bitmap" and d > 1 << 24:
            continue
        p = np.sort(rng.choice(min(d, 1 << 62), k, replace=False)).astype(np.int64) if d < 1 << 30 else \
            np.unique(rng.integers(0, d, k))
        c = sparse.encode(p, d, method)
        assert np.array_equal(sparse.decode(c.data, d, p.size, c.method, c.arg), p)


# ---- 5. exactly one zstd frame -----------------------------------------------------------------------

def _with_raw_codec_section(extra: bytes) -> bytes:
    data = np.zeros(4096, np.int8).tobytes()
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(data)
    hj = head([{"dtype": "int8", "name": "z", "shape": [4096]}],
              [{"codec": "raw", "dtype": "int8", "params": {}, "records": [0]}])
    return build(hj, [(0, "DATA", frame + extra, 4096)])


def test_single_zstd_frame_decodes():
    assert mucsc.decode(_with_raw_codec_section(b""))["z"].size == 4096


@pytest.mark.parametrize("extra", [
    bytes(8),
    zstandard.ZstdCompressor().compress(b"second frame"),
    b"\x50\x2a\x4d\x18" + (4).to_bytes(4, "little") + b"skip",  # a skippable frame
    b"\x01",
], ids=["zeros", "second-frame", "skippable", "one-byte"])
def test_trailing_bytes_after_the_zstd_frame_are_rejected(extra):
    with pytest.raises(FormatError, match="after the zstd frame|corrupt zstd"):
        mucsc.decode(_with_raw_codec_section(extra))


def test_trailing_bytes_after_a_zstd_head():
    blob = mucsc.encode({"a": np.zeros(3, np.int8)}, meta={"k": "v" * 500})
    off, tag, stored, raw = section_offsets(blob)[0]
    assert tag == "HEAD"
    msg = fmt.read_message(blob)
    hj = bytes(msg.payload(msg.sections[0]))
    z = zstandard.ZstdCompressor(write_content_size=True).compress(hj) + bytes(8)
    secs = [(s.group, s.tag, bytes(msg.payload(s))) for s in msg.sections[1:]]
    with pytest.raises(FormatError, match="after the zstd frame"):
        mucsc.inspect(build(hj, secs, head_zstd=z))


# ---- HEAD inflated from a tiny message ------------------------------------------------------------------

def test_zstd_head_bounded_by_the_expansion_limit(tmp_path):
    hj = head([{"dtype": "int8", "name": "a", "shape": [2]}],
              [{"codec": "raw", "dtype": "int8", "params": {}, "records": [0]}], meta={"k": "x" * (12 << 20)})
    blob = build(hj, [(0, "DATA", b"\1\2")], head_zstd=zstandard.ZstdCompressor().compress(hj))
    assert len(blob) * 4096 < len(hj)  # 12 MiB of JSON from ~1 KB
    peak, exc = peak_bytes(mucsc.inspect, blob)
    assert isinstance(exc, LimitError) and "max_expansion" in str(exc) and peak < 2 * MiB
    with pytest.raises(LimitError, match="header"):
        mucsc.decode(blob)
    p = tmp_path / "h.mucsc"
    p.write_bytes(blob)
    r = cli("info", p)
    assert r.exit_code == 1 and "--max-expansion none" in r.stderr
    assert cli("info", "--max-expansion", "none", p).exit_code == 0
    assert mucsc.decode(blob, max_expansion=None)["a"].tolist() == [1, 2]


# ---- integrations that know the expected size bound by it instead --------------------------------------

def test_numcodecs_constant_chunk_with_out_decodes_beyond_the_expansion_limit():
    pytest.importorskip("numcodecs")
    from mucsc.numcodecs import Mucsc

    n = (64 << 20) // 4 + 1024  # just over the 64 MiB floor: refused without the chunk's size
    c = Mucsc()
    blob = c.encode(np.full(n, 0.5, np.float32))
    assert len(blob) < 1024
    with pytest.raises(LimitError, match="max_expansion"):
        c.decode(blob)
    out = np.empty(n, np.float32)
    c.decode(blob, out=out)
    assert out[0] == 0.5 and out[-1] == 0.5
    with pytest.raises(mucsc.InputError, match="out holds"):
        c.decode(blob, out=np.empty(n - 1, np.float32))
