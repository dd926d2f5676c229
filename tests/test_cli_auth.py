"""mucsc compress --key-file/--key-id/--context; decompress/test/info --key-file/--keys/--context:
tags made and checked from the command line, one-line errors with exit 1, key files refused clearly."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import mucsc
from clitools import run

pytest.importorskip("cryptography")
SECRET = bytes(range(32))


def one_line(result, *fragments):
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("mucsc: error: ") and "Traceback" not in err, err
    for f in fragments:
        assert f in err, (f, err)


def _file(path, data, mode=0o600):
    path.write_bytes(data)
    os.chmod(path, mode)
    return path


@pytest.fixture
def files(tmp_path):
    from cryptography.hazmat.primitives import serialization as s

    np.save(tmp_path / "x.npy", np.random.default_rng(0).normal(size=500).astype(np.float32))
    sk = mucsc.generate_key("ed25519", seed=bytes(32))
    keys = tmp_path / "keys"
    keys.mkdir()
    return {
        "dir": tmp_path, "x": tmp_path / "x.npy", "keys": keys,
        "secret": _file(tmp_path / "c17.key", SECRET),
        "hex": _file(keys / "client-17.key", SECRET.hex().encode() + b"\n"),
        "pem": _file(tmp_path / "ed.pem", sk.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption())),
        "pub": _file(keys / "signer.pub", sk.public_key().public_bytes(
            s.Encoding.PEM, s.PublicFormat.SubjectPublicKeyInfo), 0o644),
    }


def test_round_trip_blake2b_and_ed25519(files):
    d = files["dir"]
    run(["compress", files["x"], "-o", d / "a.mucsc", "--key-file", files["secret"], "--key-id", "client-17",
         "--context", "run-1/round-3/up", "-q"])
    run(["compress", files["x"], "-o", d / "b.mucsc", "--key-file", files["pem"], "--key-id", "signer",
         "--context", "run-1/round-3/up", "-q"])
    r = run(["test", d / "a.mucsc", d / "b.mucsc", "--keys", files["keys"], "--context", "run-1/round-3/up"])
    assert "a.mucsc: OK (authenticated: key id 'client-17')" in r.stdout and "key id 'signer'" in r.stdout
    r = run(["info", d / "b.mucsc", "--keys", files["keys"], "--context", "run-1/round-3/up", "--json"])
    auth = json.loads(r.stdout)["auth"]
    assert auth == {"algorithm": "ed25519", "key_id": "signer", "tag_bytes": 64, "trailer_bytes": 74,
                    "verified": True}
    assert "not verified" in run(["info", d / "a.mucsc"]).stdout
    run(["decompress", d / "a.mucsc", "-o", d / "a.npy", "--key-file", files["secret"], "--key-id", "client-17",
         "--context", "run-1/round-3/up", "-q"])
    np.testing.assert_array_equal(np.load(d / "a.npy"), mucsc.decode((d / "a.mucsc").read_bytes()))
    r = run(["decompress", d / "b.mucsc", "-o", d / "b.npy"])  # no keys: decoded, with a note
    assert "authenticated (ed25519, key id 'signer') but was not verified" in r.stderr


def test_failures_are_one_line_exit_1_and_write_nothing(files):
    d = files["dir"]
    run(["compress", files["x"], "-o", d / "a.mucsc", "--key-file", files["secret"], "--key-id", "client-17",
         "--context", "r3", "-q"])
    blob = (d / "a.mucsc").read_bytes()
    (d / "flipped.mucsc").write_bytes(blob[:100] + bytes([blob[100] ^ 1]) + blob[101:])
    (d / "plain.mucsc").write_bytes(mucsc.encode(np.ones(4, np.float32)))
    cases = [
        (["decompress", d / "a.mucsc", "-o", d / "o1.npy", "--keys", files["keys"], "--context", "r4"], "does not match"),
        (["decompress", d / "flipped.mucsc", "-o", d / "o2.npy", "--keys", files["keys"], "--context", "r3"],
         "does not match"),
        (["decompress", d / "a.mucsc", "-o", d / "o3.npy", "--key-file", files["secret"], "--key-id", "client-18",
          "--context", "r3"], "unknown key id 'client-17'"),
        (["decompress", d / "plain.mucsc", "-o", d / "o4.npy", "--keys", files["keys"]], "not authenticated"),
        (["decompress", d / "a.mucsc", "-o", d / "o5.npy", "--key-file", files["pub"], "--context", "r3"],
         "ed25519 key"),
    ]
    for args, fragment in cases:
        one_line(run(args, code=1), "authentication failed", fragment)
    assert not list(d.glob("o*.npy"))
    r = run(["test", d / "a.mucsc", d / "flipped.mucsc", "--keys", files["keys"], "--context", "r3"], code=1)
    assert "a.mucsc: OK" in r.stdout and "flipped.mucsc: authentication failed" in r.stderr


def test_key_file_refusals_and_usage_errors(files):
    d = files["dir"]
    world = _file(d / "world.key", SECRET, 0o644)
    one_line(run(["compress", files["x"], "-o", d / "w.mucsc", "--key-file", world, "--key-id", "a"], code=1),
             "every user can read", "chmod 600")
    one_line(run(["compress", files["x"], "-o", d / "w.mucsc", "--key-file", d / "missing", "--key-id", "a"],
                 code=1), "cannot read key file")
    assert not (d / "w.mucsc").exists()
    for args in (["compress", files["x"], "-o", d / "u.mucsc", "--key-file", files["secret"]],
                 ["compress", files["x"], "-o", d / "u.mucsc", "--context", "r"],
                 ["compress", files["x"], "-o", d / "u.mucsc", "--key-file", files["pub"], "--key-id", "a"],
                 ["test", files["x"], "--key-file", files["secret"], "--keys", files["keys"]],
                 ["info", files["x"], "--context", "r"]):
        assert "\nmucsc: error: " in run(args, code=2).stderr
