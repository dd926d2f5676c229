"""Every test vector in spec/vectors: valid ones decode to the expected values and re-encode to the
same bytes; invalid ones raise the error class they name."""

import json
from pathlib import Path

import numpy as np
import pytest

import mucsc
import mucsc.errors

pytestmark = pytest.mark.backends  # .ci/run's torch and numpy passes run it too

VECTORS = Path(__file__).resolve().parent.parent / "spec" / "vectors"
VALID = sorted((VECTORS / "valid").glob("*.json"))
INVALID = json.loads((VECTORS / "invalid" / "index.json").read_text())


def unhex(t):
    return np.frombuffer(bytes.fromhex(t["hex"]), np.dtype(t["dtype"]).newbyteorder("<")).reshape(t["shape"])


def test_vector_counts():
    assert len(VALID) >= 10 and len(INVALID) >= 6


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
def test_valid_vector(path):
    case = json.loads(path.read_text())
    blob = (path.parent / case["message"]).read_bytes()
    assert len(blob) == case["message_bytes"]
    decoded = mucsc.decode(blob)
    if case["container"] == "tensor":
        decoded = {"": decoded}
    assert list(decoded) == [t["name"] for t in case["expected"]]
    for t in case["expected"]:
        exp, got = unhex(t), decoded[t["name"]]
        assert got.dtype == exp.dtype and got.shape == exp.shape
        assert got.tobytes() == exp.astype(exp.dtype.newbyteorder("=")).tobytes()
    inputs = {t["name"]: unhex(t) for t in case["input"]}
    data = inputs[""] if case["container"] == "tensor" else inputs
    policy = {"policy": mucsc.Policy(**case["policy"])} if "policy" in case else {}
    again = mucsc.encode(data, case["codec"], seed=case["seed"], shared=case["shared"],
                         compress=case["compress"], **policy, **case["params"])
    assert again == blob, "the reference encoder is not deterministic for this vector"


@pytest.mark.parametrize("name", sorted(INVALID))
def test_invalid_vector(name):
    blob = (VECTORS / "invalid" / f"{name}.mucsc").read_bytes()
    error = getattr(mucsc.errors, INVALID[name]["error"])
    with pytest.raises(error):
        mucsc.decode(blob)


def test_fingerprint_vector():
    """FORMAT.md 2.4.1: the base fingerprint, recomputed here independently of mucsc.fingerprint."""
    import hashlib
    import struct

    case = json.loads((VECTORS / "fingerprint" / "base_fingerprint.json").read_text())
    tensors = {t["name"]: unhex(t) for t in case["input"]}
    assert mucsc.fingerprint(tensors) == case["fingerprint"]
    assert mucsc.fingerprint(dict(reversed(list(tensors.items())))) == case["fingerprint"]  # order-free
    h = hashlib.blake2b(digest_size=32)
    h.update(b"mucsc base fingerprint v1\x00")
    for t in sorted(case["input"], key=lambda t: t["name"].encode()):
        name, data = t["name"].encode(), bytes.fromhex(t["hex"])
        h.update(struct.pack("<I", len(name)) + name + struct.pack("<B", len(t["dtype"])) + t["dtype"].encode()
                 + struct.pack("<B", len(t["shape"])) + b"".join(struct.pack("<Q", d) for d in t["shape"])
                 + struct.pack("<Q", len(data)) + data)
    assert case["fingerprint"] == "blake2b-256:" + h.hexdigest()
    first = case["input"][0]
    assert mucsc.fingerprint(unhex(first)) == case["fingerprint_of_bare_first_tensor"]
