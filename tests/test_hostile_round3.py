"""Hostile input, round 3 (issue 26): one regression test per finding, each built from the inputs in
fuzz/reproducers.py.  Memory bounds are tracemalloc peaks (numpy buffers, Python objects and zstd
output are traced); the time bounds of findings 1 and 3 are measured by benchmarks/bench_hostile.py,
not here.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mucsc
from mucsc import tensorfiles as tf
from mucsc.codec.wire import container as fmt
from mucsc.errors import AuthError, FormatError, KeyFileError, LimitError, ParameterError
from clitools import run
from msgtools import peak_bytes

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("reproducers", ROOT / "fuzz" / "reproducers.py")
reproducers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reproducers)
MiB = 1 << 20
READERS = [mucsc.decode, mucsc.inspect, mucsc.verify]


@pytest.fixture(scope="module")
def records_300k():
    return reproducers.many_records()


# ---- 1. the nesting check was a bomb itself ----------------------------------------------------------

@pytest.mark.parametrize("fn", READERS)
def test_deep_head_is_refused_before_it_is_inflated(fn):
    blob = reproducers.deep_head()
    assert 4096 <= len(blob) < 8192  # 16 MiB of HEAD that the old 4096x bound let through
    peak, exc = peak_bytes(fn, blob)
    assert isinstance(exc, LimitError) and "header of 16777216 bytes" in str(exc)
    assert peak < 2 * MiB


def test_nesting_scan_takes_constant_memory():
    raw = b"[" * (16 * MiB)
    peak, exc = peak_bytes(fmt.json_depth, raw)
    assert exc is None and peak < 8 * MiB  # the old scan built ~12 bytes per byte of HEAD
    assert fmt.json_scan(raw) == fmt.JsonScan(16 * MiB, 16 * MiB)


def test_deep_head_on_the_trusted_path_costs_its_own_size():
    """max_expansion=None: only the spec's 16 MiB bounds HEAD; it is inflated once, copied once and
    scanned in constant memory."""
    peak, exc = peak_bytes(mucsc.decode, reproducers.deep_head(), max_expansion=None)
    assert isinstance(exc, FormatError) and "levels deep" in str(exc)
    assert peak < 2 * 16 * MiB + 8 * MiB


def _scan_reference(raw: bytes) -> tuple[int, int]:
    """json_scan's rule, one byte at a time."""
    depth = level = containers = 0
    inside = escaped = False
    for ch in raw.decode("latin-1"):
        if ch == '"' and not escaped:
            inside = not inside
        elif not inside and ch in "[{":
            level, containers = level + 1, containers + 1
            depth = max(depth, level)
        elif not inside and ch in "]}":
            level -= 1
        escaped = ch == "\\" and not escaped
    return depth, containers


@settings(max_examples=300, deadline=None)
@given(raw=st.lists(st.sampled_from(list(b'[]{}"\\ax')), max_size=80).map(bytes),
       chunk=st.sampled_from([1, 2, 3, 7, 64, 1 << 18]))
def test_json_scan_carries_its_state_across_chunks(raw, chunk):
    saved = fmt._SCAN_CHUNK
    fmt._SCAN_CHUNK = chunk
    try:
        got = fmt.json_scan(raw)
    finally:
        fmt._SCAN_CHUNK = saved
    assert (got.depth, got.containers) == _scan_reference(raw)


def test_real_headers_scan_like_the_parser_sees_them():
    ok = fmt.canonical_json({"a": ['x"[', "\\", {"b": "]]}}"}], "c": [[1], []]})
    assert fmt.json_scan(ok) == fmt.JsonScan(3, 6)


# ---- 3. parse amplification: 300,000 records ---------------------------------------------------------

@pytest.mark.parametrize("fn", READERS)
def test_300k_records_are_refused_before_parsing(fn, records_300k):
    assert len(records_300k) < 200_000
    peak, exc = peak_bytes(fn, records_300k)
    assert isinstance(exc, LimitError) and "max_expansion" in str(exc)
    assert peak < 2 * MiB


def test_containers_are_counted_before_the_parser_builds_them():
    raw = b"[" + b"[]," * fmt.MAX_JSON_CONTAINERS + b"[]]"
    assert len(raw) < fmt.MAX_HEADER_BYTES
    import zstandard

    blob = reproducers.message(raw, [], head_stored=zstandard.ZstdCompressor().compress(raw))
    peak, exc = peak_bytes(mucsc.inspect, blob, max_expansion=None)
    assert isinstance(exc, LimitError) and "objects and arrays" in str(exc)
    assert peak < 2 * len(raw) + 8 * MiB  # the inflated HEAD, its copy and the scan; no parse


def test_a_real_header_passes_the_new_bounds():
    """6000 tensors, a group each: HEAD is 78x smaller zstd'd, yet 2.4x the message (under 16x)."""
    rng = np.random.default_rng(0)
    sd = {f"layers.{i}.w": rng.normal(size=4).astype(np.float32) for i in range(6000)}
    blob = mucsc.encode(sd, "mucsc", z=4, shared=False)
    assert len(mucsc.decode(blob)) == 6000


# ---- 2. the .pt zip bomb -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pt_bomb(tmp_path_factory):
    pytest.importorskip("torch")
    return reproducers.pt_bomb(tmp_path_factory.mktemp("bomb") / "bomb.pt", 64 * MiB)


def test_pt_bomb_is_refused_before_torch_reads_it(pt_bomb, monkeypatch):
    import torch

    def no_load(*a, **k):
        raise AssertionError("torch.load was called")

    monkeypatch.setattr(torch, "load", no_load)
    assert pt_bomb.stat().st_size < MiB
    with pytest.raises(tf.TensorFileError, match=r"members declare \d+ bytes.*--max-memory"):
        tf.load(pt_bomb, max_bytes=16 * MiB)
    with open(pt_bomb, "rb") as f:  # a stream (stdin) goes through the same check
        with pytest.raises(tf.TensorFileError, match="members declare"):
            tf.load(f, fmt="torch", max_bytes=16 * MiB)


def test_pt_bomb_in_the_cli(pt_bomb, tmp_path):
    r = run(["compress", pt_bomb, "-o", tmp_path / "x.mucsc", "--max-memory", "16M"], code=1)
    assert "members declare" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.mucsc").exists()


def test_zip_members_that_cannot_be_bounded_are_refused(tmp_path):
    p = tmp_path / "b.npz"
    with zipfile.ZipFile(p, "w", compression=zipfile.ZIP_BZIP2) as zf:
        zf.writestr("a.npy", b"x" * 100)
    with pytest.raises(tf.TensorFileError, match="compression method 12"):
        tf.load(p)
    data = bytearray(p.read_bytes())
    cd = data.rindex(b"PK\x01\x02")  # central directory entry: flags at +8, method at +10
    data[cd + 8] |= 1
    data[cd + 10] = zipfile.ZIP_STORED
    p.write_bytes(bytes(data))
    with pytest.raises(tf.TensorFileError, match="encrypted"):
        tf.load(p)


def test_normal_pt_still_loads(tmp_path):
    torch = pytest.importorskip("torch")
    torch.save({"w": torch.arange(6.0)}, tmp_path / "ok.pt")
    assert tf.load(tmp_path / "ok.pt").tensors["w"].tolist() == list(range(6))


# ---- 4. lone surrogates in HEAD ----------------------------------------------------------------------

SURROGATES = ["surrogate_in_name", "surrogate_in_meta_value", "surrogate_in_meta_key"]


@pytest.mark.parametrize("name", SURROGATES)
@pytest.mark.parametrize("fn", READERS)
def test_lone_surrogates_are_format_errors(name, fn):
    with pytest.raises(FormatError, match="lone surrogate"):
        fn(reproducers.MESSAGES[name]())


@pytest.mark.parametrize("name", SURROGATES)
def test_lone_surrogates_in_the_cli(name, tmp_path):
    p = tmp_path / "s.mucsc"
    p.write_bytes(reproducers.MESSAGES[name]())
    for cmd in (["info", p], ["info", "--json", p], ["test", p], ["decompress", p, "-o", tmp_path / "o.npz"]):
        r = run(cmd, code=1)
        assert "lone surrogate" in r.stderr and "Traceback" not in r.stderr


def test_a_valid_surrogate_pair_is_text():
    raw = fmt.canonical_json({"container": "dict", "groups": [{"codec": "raw", "dtype": "int8", "params": {},
                                                              "records": [0]}], "meta": {"k": "@"},
                              "records": [{"dtype": "int8", "name": "w", "shape": [1]}]})
    blob = reproducers.message(raw.replace(b'"@"', b'"\\ud83d\\ude00"'), [(0, "DATA", b"\x01")])
    assert mucsc.inspect(blob).meta == {"k": "\U0001F600"}


# ---- 5. qsgd on float16 extremes ----------------------------------------------------------------------

def test_qsgd_float16_extremes_never_decode_to_inf():
    x = np.array([65504, -65504, 1e-7, 0], np.float16)
    for seed in range(200):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            y = mucsc.decode(mucsc.encode(x, "qsgd", seed=seed))
        assert y.dtype == np.float16 and np.all(np.isfinite(y)), (seed, y)
        assert np.all(np.abs(y) <= 65504)


def test_group_values_beyond_the_record_dtype_saturate():
    """A (hostile or careless) message whose float32 centroid exceeds a float16 record's range."""
    blob = mucsc.encode({"h": np.array([1, 2], np.float16)}, "mucsc", z=2, compress="off")
    msg = fmt.read_message(blob)
    cent = next(s for s in msg.sections if s.tag == "CENT")
    forged = bytearray(blob)
    forged[cent.offset: cent.offset + 8] = np.float32([1, 1e6]).tobytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = mucsc.decode(reproducers.message(bytes(msg.payload(msg.sections[0])),
                                             [(s.group, s.tag, bytes(forged[s.offset: s.offset + s.stored_bytes]))
                                              for s in msg.sections[1:]]))["h"]
    assert y.dtype == np.float16 and np.all(np.isfinite(y)) and y.max() == 65504


# ---- 6. zstd sections of raw_length 0 ----------------------------------------------------------------

@pytest.mark.parametrize("name", ["empty_zstd_trailing_frame", "empty_zstd_rle_blocks"])
def test_empty_zstd_sections_follow_the_frame_rules(name):
    blob = reproducers.MESSAGES[name]()
    peak, exc = peak_bytes(mucsc.decode, blob)
    assert isinstance(exc, FormatError) and "zstd" in str(exc) and peak < 2 * MiB


def test_an_empty_zstd_frame_alone_is_fine():
    y = mucsc.decode(reproducers._empty_ids(reproducers.EMPTY_FRAME))
    assert y["w"].tolist() == [1.5] * 4


# ---- 7. a lossy group's dtype against its records -----------------------------------------------------

def test_group_dtype_must_be_what_its_records_imply():
    with pytest.raises(FormatError, match="dtype float32, but its records' dtypes imply float64"):
        mucsc.decode(reproducers.group_dtype_mismatch())


# ---- 8, 9. key ids and key files ----------------------------------------------------------------------

SECRET = bytes(range(32))
X = np.arange(8, dtype=np.float32)


def _key(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    os.chmod(path, mode)
    return path


def test_a_key_id_names_one_file_only(tmp_path):
    _key(tmp_path / "client-17.key", SECRET)
    keys = mucsc.load_keys(tmp_path)
    mucsc.verify(mucsc.encode(X, key=SECRET, key_id="client-17"), keys=keys)
    for alias in ("client-17.key", "client-17.", "./client-17", "client-17/", "CLIENT-17 ", "x" * 65):
        with pytest.raises(AuthError, match="unknown key id"):
            mucsc.verify(mucsc.encode(X, key=SECRET, key_id=alias[:64]), keys=keys)
    _key(tmp_path / "client-18", SECRET)  # no suffix: not the file of any key id
    with pytest.raises(AuthError, match="unknown key id"):
        mucsc.verify(mucsc.encode(X, key=SECRET, key_id="client-18"), keys=mucsc.load_keys(tmp_path))


def test_key_file_suffix_says_what_it_holds(tmp_path):
    _key(tmp_path / "c.pub", SECRET)
    with pytest.raises(KeyFileError, match=r"a \.pub file holds an Ed25519 public key"):
        mucsc.load_keys(tmp_path)("c")


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
@pytest.mark.parametrize("mode", [0o640, 0o660, 0o620])
def test_group_access_to_a_secret_is_refused(tmp_path, mode):
    with pytest.raises(KeyFileError, match=r"the file's group can (read|write).*chmod 600"):
        mucsc.load_key(_key(tmp_path / "s.key", SECRET, mode))


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_group_writable_public_key_and_directories_are_refused(tmp_path):
    from cryptography.hazmat.primitives import serialization as s

    pub = mucsc.generate_key("ed25519").public_key().public_bytes(s.Encoding.PEM,
                                                                    s.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(KeyFileError, match="public key that the file's group can write"):
        mucsc.load_key(_key(tmp_path / "p.pub", pub, 0o664))
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o775)
    with pytest.raises(KeyFileError, match="a directory other users can write"):
        mucsc.load_key(_key(shared / "s.key", SECRET))
    with pytest.raises(KeyFileError, match="a directory other users can write"):
        mucsc.load_keys(shared)("s")
    os.chmod(shared, 0o755)
    assert mucsc.load_keys(shared)("s") == SECRET


# ---- 10. a malformed .npy header inside an .npz ------------------------------------------------------

def test_malformed_npy_header_in_npz(tmp_path):
    p = reproducers.npz_bad_npy_header(tmp_path / "bad.npz")
    with pytest.raises(tf.TensorFileError, match=r"bad\.npz\[a\]: not a valid \.npy array"):
        tf.load(p)
    r = run(["compress", p, "-o", tmp_path / "x.mucsc"], code=1)
    assert "not a valid .npy array" in r.stderr and "Traceback" not in r.stderr


# ---- 11. tensor names that are paths ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../etc/evil", "/abs", "a/../../b", "..\\win", "nul\0byte", "\\root"])
def test_path_names_are_refused_in_npz(tmp_path, name):
    with pytest.raises(tf.TensorFileError, match=r"'\.\.' component|absolute path|NUL"):
        tf.save(tmp_path / "x.npz", {name: np.zeros(2)})
    assert not (tmp_path / "x.npz").exists()


def test_path_names_survive_the_wire_and_other_formats(tmp_path):
    blob = mucsc.encode({"../../etc/evil": np.ones(2, np.float32), "/abs": np.zeros(1, np.float32)}, "none")
    (tmp_path / "m.mucsc").write_bytes(blob)
    r = run(["decompress", tmp_path / "m.mucsc", "-o", tmp_path / "out.npz"], code=1)
    assert "'..' component" in r.stderr and not (tmp_path / "out.npz").exists()
    run(["decompress", tmp_path / "m.mucsc", "-o", tmp_path / "out.safetensors"])
    assert set(tf.load(tmp_path / "out.safetensors").tensors) == {"../../etc/evil", "/abs"}
    tf.save(tmp_path / "ok.npz", {"layer.0/w": np.zeros(1), "a..b": np.ones(1)})  # not path escapes


# ---- 12. sim --config on a binary file ----------------------------------------------------------------

def test_sim_config_binary_file(tmp_path):
    p = reproducers.binary_config(tmp_path / "c.toml")
    r = run(["sim", "--config", p], code=2)  # a bad config is a usage error, as a bad TOML is
    assert "not UTF-8 text" in r.stderr and "Traceback" not in r.stderr


# ---- 13. wrong argument types --------------------------------------------------------------------------

@pytest.mark.parametrize("call", [
    lambda b: mucsc.decode(None), lambda b: mucsc.decode("text"), lambda b: mucsc.inspect(None),
    lambda b: mucsc.verify(12), lambda b: mucsc.decode(b, max_elements="x"),
    lambda b: mucsc.decode(b, max_elements=2.5), lambda b: mucsc.decode(b, max_expansion="x"),
    lambda b: mucsc.decode(b, max_elements=-1), lambda b: mucsc.inspect(b, max_expansion=float("nan")),
    lambda b: mucsc.verify(b, max_elements=True),
], ids=["decode-None", "decode-str", "inspect-None", "verify-int", "elements-str", "elements-float",
        "expansion-str", "elements-negative", "expansion-nan", "elements-bool"])
def test_wrong_argument_types_are_parameter_errors(call):
    blob = mucsc.encode(X)
    with pytest.raises(ParameterError, match="bytes, bytearray or memoryview|max_e"):
        call(blob)


def test_good_argument_types_still_work():
    blob = mucsc.encode(X)
    for b in (blob, bytearray(blob), memoryview(blob), np.frombuffer(blob, np.uint8)):
        assert mucsc.decode(b, max_elements=np.int64(100), max_expansion=np.float32(10.0)).size == 8
    assert mucsc.decode(blob, max_elements=None, max_expansion=None).size == 8
