"""Authenticated messages (FORMAT.md 2.5): every tampering is an AuthError, verification comes first,
1.0 messages are untouched, key files are loaded and refused as documented."""

import json
import os
import struct
import sys
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
import zstandard

import mucsc
from mucsc.codec.wire import container as fmt
from mucsc.errors import AuthError, FormatError, KeyFileError, ParameterError, TruncatedError
from msgtools import recrc

pytest.importorskip("cryptography")

SPEC = Path(__file__).resolve().parent.parent / "spec"
AUTH_VECTORS = SPEC / "vectors" / "auth"
K17, K18 = bytes(range(32)), bytes(range(100, 132))
CTX = b"run-4/round-9/up"
X = np.random.default_rng(0).normal(size=24).astype(np.float32)


def ed_key(i=0):
    return mucsc.generate_key("ed25519", seed=bytes([i]) * 32)


def tagged(alg="blake2b", **kw):
    key = K17 if alg == "blake2b" else ed_key()
    return mucsc.encode(X, z=4, compress="off", key=key, key_id="client-17", context=CTX, **kw)


def verify_keys(alg="blake2b"):
    return {"client-17": K17, "client-18": K18} if alg == "blake2b" else \
        {"client-17": ed_key().public_key(), "client-18": ed_key(1).public_key()}


# ---- round trip and format version -------------------------------------------------------------------

@pytest.mark.parametrize("alg, tag", [("blake2b", 32), ("ed25519", 64)])
def test_round_trip_and_overhead(alg, tag):
    plain = mucsc.encode(X, z=4, compress="off")
    blob = tagged(alg)
    assert plain[9] == 0 and blob[9] == 1  # 1.0 without a tag, 1.1 with
    assert len(blob) == len(plain) + 4 + len("client-17") + tag
    assert blob[:8] == plain[:8] and blob[24:len(plain) - 4] == plain[24:-4]  # same sections
    np.testing.assert_array_equal(mucsc.decode(blob, keys=verify_keys(alg), context=CTX), mucsc.decode(plain))
    info = mucsc.inspect(blob, keys=verify_keys(alg), context=CTX)
    assert info.version == "1.1" and info.size == len(blob)
    assert (info.auth.key_id, info.auth.tag_bytes, info.auth.trailer_bytes, info.auth.verified) == \
        ("client-17", tag, 4 + 9 + tag, True)
    assert info.auth.algorithm == {"blake2b": "blake2b-256", "ed25519": "ed25519"}[alg]


def test_encoding_is_deterministic_and_sign_matches_encode():
    for alg in ("blake2b", "ed25519"):
        assert tagged(alg) == tagged(alg)
        key = K17 if alg == "blake2b" else ed_key()
        assert mucsc.sign(mucsc.encode(X, z=4, compress="off"), key, "client-17", CTX) == tagged(alg)


def test_without_keys_decodes_unverified():
    blob = tagged()
    np.testing.assert_array_equal(mucsc.decode(blob), mucsc.decode(tagged("ed25519")))
    info = mucsc.inspect(blob)
    assert info.auth.verified is False and info.auth.key_id == "client-17"
    assert mucsc.inspect(mucsc.encode(X, z=4)).auth is None
    assert info.to_dict()["auth"]["algorithm"] == "blake2b-256"


def test_str_context_is_utf8():
    blob = mucsc.encode(X, z=4, key=K17, key_id="ü", context="ründe-1")
    mucsc.verify(blob, keys={"ü": K17}, context="ründe-1".encode())


# ---- everything a forger can do is an AuthError ----------------------------------------------------

@pytest.mark.parametrize("alg", ["blake2b", "ed25519"])
def test_every_single_byte_flip_is_auth_error(alg):
    blob, keys = tagged(alg), verify_keys(alg)
    for i in range(len(blob)):
        for bit in (0x01, 0x80):
            bad = bytearray(blob)
            bad[i] ^= bit
            with pytest.raises(AuthError):
                mucsc.decode(bytes(bad), keys=keys, context=CTX)


@pytest.mark.parametrize("alg", ["blake2b", "ed25519"])
def test_every_truncation_and_extension_is_auth_error(alg):
    blob, keys = tagged(alg), verify_keys(alg)
    for cut in range(len(blob)):
        with pytest.raises(AuthError):
            mucsc.decode(blob[:cut], keys=keys, context=CTX)
    with pytest.raises(AuthError):
        mucsc.decode(blob + b"\x00", keys=keys, context=CTX)


@pytest.mark.parametrize("alg", ["blake2b", "ed25519"])
def test_wrong_key_context_and_key_id(alg):
    blob, keys = tagged(alg), verify_keys(alg)
    with pytest.raises(AuthError, match="does not match"):  # wrong key
        mucsc.decode(blob, keys={"client-17": keys["client-18"]}, context=CTX)
    for ctx in (b"run-4/round-10/up", b"run-4/round-9/down", b"run-5/round-9/up", b"", None):
        with pytest.raises(AuthError, match="does not match"):
            mucsc.decode(blob, keys=keys, context=ctx)
    with pytest.raises(AuthError, match="unknown key id"):  # the server expects another client
        mucsc.decode(blob, keys={"client-18": keys["client-18"]}, context=CTX)
    n = struct.unpack_from("<Q", blob, 16)[0]
    relabeled = blob[:n + 4] + b"client-18" + blob[n + 13:]  # claims to come from another client
    with pytest.raises(AuthError, match="client-18"):
        mucsc.decode(relabeled, keys=keys, context=CTX)


def test_another_clients_valid_message_is_refused_by_key_id():
    # client-18 signs honestly; the server, expecting client-17 in this slot, refuses it
    blob = mucsc.encode(X, z=4, key=K18, key_id="client-18", context=CTX)
    with pytest.raises(AuthError, match="unknown key id 'client-18'"):
        mucsc.decode(blob, keys=lambda kid: {"client-17": K17}.get(kid), context=CTX)


def test_stripping_or_downgrading_the_trailer():
    blob = tagged()
    n = struct.unpack_from("<Q", blob, 16)[0]
    with pytest.raises(AuthError):
        mucsc.decode(blob[:n], keys=verify_keys(), context=CTX)
    with pytest.raises(TruncatedError):
        mucsc.decode(blob[:n])
    down = bytearray(blob[:n])
    struct.pack_into("<BH", down, 9, 0, 0)
    down = recrc(down)  # a valid 1.0 message
    mucsc.decode(down)
    with pytest.raises(AuthError, match="not authenticated"):
        mucsc.decode(down, keys=verify_keys(), context=CTX)
    with pytest.raises(AuthError, match="not authenticated"):
        mucsc.inspect(down, keys=verify_keys(), context=CTX, require_auth=True)
    # a rollout setting: keys given, unauthenticated messages tolerated, tagged ones still checked
    mucsc.decode(down, keys=verify_keys(), context=CTX, require_auth=False)
    with pytest.raises(AuthError):
        mucsc.decode(blob, keys=verify_keys(), context=b"other", require_auth=False)


def test_algorithm_confusion_is_refused():
    with pytest.raises(AuthError, match="ed25519 key"):
        mucsc.decode(tagged("blake2b"), keys={"client-17": ed_key().public_key()}, context=CTX)
    with pytest.raises(AuthError, match="blake2b-256 key"):
        mucsc.decode(tagged("ed25519"), keys={"client-17": K17}, context=CTX)


def test_private_key_also_verifies():
    mucsc.verify(tagged("ed25519"), keys={"client-17": ed_key()}, context=CTX)


def test_unknown_algorithm_decodes_without_keys_only():
    blob = bytearray(tagged())
    blob[struct.unpack_from("<Q", blob, 16)[0]] = 200
    assert mucsc.inspect(bytes(blob)).auth.algorithm == "unknown (id 200)"
    mucsc.decode(bytes(blob))
    with pytest.raises(AuthError, match="not supported"):
        mucsc.decode(bytes(blob), keys=verify_keys(), context=CTX)


def test_a_1_0_reader_rejects_authenticated_messages_cleanly(monkeypatch):
    monkeypatch.setattr(fmt, "KNOWN_FLAGS", 0)  # what a 1.0 decoder knows: no flags
    with pytest.raises(FormatError, match="reserved flag bits are set \\(0x0001\\)"):
        mucsc.decode(tagged())


def test_forged_1gb_message_is_rejected_before_any_allocation():
    # A well-formed message (valid CRC) whose DATA is a real zstd frame of 1 GiB of zeros, tagged
    # with a key the forger made up.  Decoding it unauthenticated would allocate 1 GiB.
    cctx = zstandard.ZstdCompressor(level=1)
    chunk, frame = bytes(1 << 20), cctx.compressobj(size=1 << 30)
    bomb = b"".join(frame.compress(chunk) for _ in range(1024)) + frame.flush()
    header = fmt.Header((fmt.Record("", "uint8", (1 << 30,)),), (fmt.Group("raw", {}, (0,), "uint8"),),
                        "tensor")
    forged = fmt.write_message(header, [(0, "DATA", bomb, False)], zstd_level=None,
                               auth=mucsc.codec.wire.auth.Signer(bytes(32), "client-17", CTX))
    b = bytearray(forged)  # DATA stored raw above; declare it zstd with a 1 GiB raw length
    pos = fmt.PREAMBLE.size + fmt.SECTION.size + _stored(forged, fmt.PREAMBLE.size)
    pos += fmt.padding(_stored(forged, fmt.PREAMBLE.size))
    struct.pack_into("<BBHIQQ", b, pos + 8, 1, 0, 0, 0, len(bomb), 1 << 30)
    n = struct.unpack_from("<Q", b, 16)[0]
    struct.pack_into("<I", b, n - 4, zlib.crc32(bytes(b[:n - 4])))
    forged = bytes(b)
    assert mucsc.inspect(forged).records[0].shape == (1 << 30,)  # it is a well-formed 1 GiB message
    tracemalloc.start()
    try:
        with pytest.raises(AuthError):
            mucsc.decode(forged, keys={"client-17": K17}, context=CTX)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 10, f"{peak} bytes allocated to reject a {len(forged)}-byte message"


def _stored(blob, pos):
    return struct.unpack_from("<Q", blob, pos + 16)[0]


# ---- API errors ---------------------------------------------------------------------------------------

def test_api_parameter_errors():
    with pytest.raises(ParameterError, match="key_id"):
        mucsc.encode(X, key=K17)
    with pytest.raises(ParameterError, match="need a key"):
        mucsc.encode(X, key_id="a")
    with pytest.raises(ParameterError, match="16..64"):
        mucsc.encode(X, key=b"short", key_id="a")
    with pytest.raises(ParameterError, match="private key"):
        mucsc.encode(X, key=ed_key().public_key(), key_id="a")
    with pytest.raises(ParameterError, match="key_id"):
        mucsc.encode(X, key=K17, key_id="a\nb")
    with pytest.raises(ParameterError, match="key_id"):
        mucsc.encode(X, key=K17, key_id="x" * 65)
    with pytest.raises(ParameterError, match="needs keys"):
        mucsc.decode(tagged(), require_auth=True)
    with pytest.raises(ParameterError, match="give keys too"):
        mucsc.decode(tagged(), context=CTX)
    with pytest.raises(ParameterError, match="context"):
        mucsc.decode(tagged(), keys=verify_keys(), context=12)
    with pytest.raises(mucsc.InputError, match="already authenticated"):
        mucsc.sign(tagged(), K17, "client-17")
    bad = bytearray(mucsc.encode(X, z=4))
    bad[30] ^= 1
    with pytest.raises(mucsc.ChecksumError):  # a corrupted message is never signed
        mucsc.sign(bytes(bad), K17, "client-17")


# ---- spec vectors -------------------------------------------------------------------------------------

INDEX = json.loads((AUTH_VECTORS / "index.json").read_text())


@pytest.mark.parametrize("name", sorted(INDEX["cases"]))
def test_auth_vector(name):
    sys.path.insert(0, str(SPEC))
    from vector_cases_auth import keys_from_json

    case = INDEX["cases"][name]
    blob = (AUTH_VECTORS / case["message"]).read_bytes()
    keys = keys_from_json(INDEX["keys"], case["keys"])
    for kw, want in ((dict(keys=keys, context=case["context"]), case["error"]), ({}, case["error_without_keys"])):
        if want is None:
            got = mucsc.decode(blob, **kw)
            if case["error"] is None:  # genuine: the values of the unauthenticated body
                np.testing.assert_array_equal(got, mucsc.decode((AUTH_VECTORS / "body.mucsc").read_bytes()))
        else:
            with pytest.raises(getattr(mucsc.errors, want)):
                mucsc.decode(blob, **kw)


def test_auth_vectors_reencode():
    enc = dict(INDEX["encode"])
    x = np.frombuffer(bytes.fromhex(enc.pop("input_hex_float32")), "<f4")
    seeds = INDEX["ed25519_private_seeds"]
    ed = mucsc.generate_key("ed25519", seed=bytes.fromhex(seeds["client-17"]))
    k = {kid: bytes.fromhex(v) for kid, v in INDEX["keys"]["blake2b"].items()}
    for name, key, kid, ctx in (("auth_blake2b", k["client-17"], "client-17", "run-4/round-9/up"),
                                ("auth_ed25519", ed, "client-17", "run-4/round-9/up"),
                                ("auth_empty_context", k["client-18"], "client-18", None)):
        assert mucsc.encode(x, **enc, key=key, key_id=kid, context=ctx) == \
            (AUTH_VECTORS / f"{name}.mucsc").read_bytes()


# ---- key files ----------------------------------------------------------------------------------------

def _write(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    os.chmod(path, mode)
    return path


def _pem(key, private: bool) -> bytes:
    from cryptography.hazmat.primitives import serialization as s

    if private:
        return key.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption())
    return key.public_key().public_bytes(s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo)


def test_load_key_formats(tmp_path):
    assert mucsc.load_key(_write(tmp_path / "raw", K17)) == K17
    assert mucsc.load_key(_write(tmp_path / "hex", K17.hex().encode() + b"\n")) == K17
    sk = ed_key()
    priv = mucsc.load_key(_write(tmp_path / "a.pem", _pem(sk, True)))
    pub = mucsc.load_key(_write(tmp_path / "a.pub", _pem(sk, False), 0o644))
    blob = mucsc.encode(X, key=priv, key_id="a", context=CTX)
    mucsc.verify(blob, keys={"a": pub}, context=CTX)


@pytest.mark.skipif(os.name != "posix", reason="POSIX permissions")
def test_load_key_refusals(tmp_path):
    with pytest.raises(KeyFileError, match="every user can read.*chmod 600"):
        mucsc.load_key(_write(tmp_path / "raw", K17, 0o644))
    with pytest.raises(KeyFileError, match="private key that every user can read"):
        mucsc.load_key(_write(tmp_path / "a.pem", _pem(ed_key(), True), 0o604))
    with pytest.raises(KeyFileError, match="public key that every user can write"):
        mucsc.load_key(_write(tmp_path / "b.pub", _pem(ed_key(), False), 0o666))
    with pytest.raises(KeyFileError, match="not a key file"):
        mucsc.load_key(_write(tmp_path / "junk", b"hello"))
    with pytest.raises(KeyFileError, match="16..64"):
        mucsc.load_key(_write(tmp_path / "short", b"abcd"))
    with pytest.raises(KeyFileError, match="not a usable PEM"):
        mucsc.load_key(_write(tmp_path / "bad.pem", b"-----BEGIN PRIVATE KEY-----\nxx\n-----END PRIVATE KEY-----\n"))
    with pytest.raises(KeyFileError, match="cannot read"):
        mucsc.load_key(tmp_path / "missing")


def test_load_keys_directory(tmp_path):
    _write(tmp_path / "client-17.key", K17)
    _write(tmp_path / "client-18.key", K18.hex().encode())
    _write(tmp_path / "signer.pub", _pem(ed_key(), False), 0o644)
    _write(tmp_path / "plain", K17)  # no suffix: not a key file of any id
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub" / "x.key", K17)
    keys = mucsc.load_keys(tmp_path)
    assert keys("client-17") == K17 and keys("client-18") == K18
    assert keys("nobody") is None and keys("sub/x") is None and keys("..") is None and keys("plain") is None
    mucsc.verify(mucsc.encode(X, key=K18, key_id="client-18"), keys=keys)
    mucsc.verify(mucsc.encode(X, key=ed_key(), key_id="signer", context=CTX), keys=keys, context=CTX)
    _write(tmp_path / "client-17.pub", _pem(ed_key(), False), 0o644)
    keys = mucsc.load_keys(tmp_path)
    with pytest.raises(KeyFileError, match="both client-17.key and client-17.pub"):
        keys("client-17")
    with pytest.raises(KeyFileError, match="not a directory"):
        mucsc.load_keys(tmp_path / "client-18.key")


def test_tags_follow_the_spec_formula():
    """FORMAT.md 2.5, recomputed with hashlib and cryptography directly (not through mucsc.codec.wire.auth)."""
    import hashlib

    for alg, key in (("blake2b", K17), ("ed25519", ed_key())):
        blob = tagged(alg)
        n = struct.unpack_from("<Q", blob, 16)[0]
        algo, klen, tlen = struct.unpack_from("<BBH", blob, n)
        assert blob[n + 4: n + 4 + klen] == b"client-17" and len(blob) == n + 4 + klen + tlen
        a = struct.pack("<Q", len(CTX)) + CTX + blob[:n + 4 + klen]
        tag = blob[n + 4 + klen:]
        if alg == "blake2b":
            assert algo == 1 and tag == hashlib.blake2b(a, key=key, digest_size=32).digest()
        else:
            assert algo == 2
            key.public_key().verify(tag, b"mucsc-1.1 ed25519 blake2b-512\x00" + hashlib.blake2b(a).digest())


def test_memoryview_and_bytearray_inputs():
    blob = tagged()
    for b in (bytearray(blob), memoryview(blob)):
        mucsc.verify(b, keys=verify_keys(), context=CTX)


def test_size_budget_counts_the_trailer():
    x = np.random.default_rng(1).standard_t(3, 20000).astype(np.float32)
    plain = mucsc.encode(x, "mucsc", size=7920, compress="off")
    assert 7920 - len(plain) < 45  # no room left for a 45-byte trailer at this Z
    blob = mucsc.encode(x, "mucsc", size=7920, compress="off", key=K17, key_id="client-17")
    assert len(blob) <= 7920
