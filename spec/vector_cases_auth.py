"""Test-vector cases for authenticated messages (FORMAT.md 2.5), written to spec/vectors/auth/.

``auth_files()`` returns {relative path: bytes}: one ``.mucsc`` per message and ``index.json``, which
lists the test keys (BLAKE2b secrets and Ed25519 public keys, raw hex; the Ed25519 private key is
derived from the seed given there, RFC 8032) and, per case: the message file, the key set and the
context (UTF-8) a reader must use, the error it must raise with those keys (``null``: it verifies
and decodes to the values of the unauthenticated message ``body``), and the error without keys
(``null``: it decodes, unverified -- forged values included).
"""

from __future__ import annotations

import json
import struct
import zlib

import numpy as np

import mucsc
from mucsc.codec.wire import container as fmt

BLAKE2B_KEYS = {"client-17": bytes(range(32)), "client-18": bytes(range(100, 132))}
ED25519_SEEDS = {"client-17": bytes(range(32, 64))}
CONTEXT = "run-4/round-9/up"
X = (np.random.default_rng(13).normal(size=20)).astype(np.float32)
ENCODE = dict(codec="mucsc", z=4, seed=1, compress="off")


def _ed25519_keys():
    return {k: mucsc.generate_key("ed25519", seed=s) for k, s in ED25519_SEEDS.items()}


def _public_hex(sk) -> str:
    from cryptography.hazmat.primitives import serialization

    return sk.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw).hex()


def _recrc(b: bytearray, body: int) -> None:
    struct.pack_into("<I", b, body - 4, zlib.crc32(bytes(b[:body - 4])))


def _trailer_at(blob: bytes) -> int:
    return struct.unpack_from("<Q", blob, 16)[0]


def messages():
    """name -> (message, description, key set, context, error with keys, error without keys)."""
    sk = _ed25519_keys()["client-17"]
    body = mucsc.encode(X, **ENCODE)
    b2 = mucsc.encode(X, **ENCODE, key=BLAKE2B_KEYS["client-17"], key_id="client-17", context=CONTEXT)
    ed = mucsc.encode(X, **ENCODE, key=sk, key_id="client-17", context=CONTEXT)
    empty = mucsc.encode(X, **ENCODE, key=BLAKE2B_KEYS["client-18"], key_id="client-18")
    n = _trailer_at(b2)

    def flipped(i: int) -> bytes:
        b = bytearray(b2)
        b[i] ^= 0x01
        return bytes(b)

    def payload_forged() -> bytes:  # an attacker flips an id bit and fixes the CRC
        b = bytearray(b2)
        b[n - 8] ^= 0x04
        _recrc(b, n)
        return bytes(b)

    def relabeled(kid: bytes) -> bytes:
        return b2[:n + 4] + kid + b2[n + 4 + len(kid):]

    def downgraded() -> bytes:  # trailer stripped, flag cleared, version 1.0, CRC fixed: a valid 1.0 message
        b = bytearray(b2[:n])
        struct.pack_into("<BH", b, 9, 0, 0)
        _recrc(b, n)
        return bytes(b)

    def unknown_algorithm() -> bytes:
        b = bytearray(b2)
        b[n] = 200
        return bytes(b)

    def flag_in_1_0() -> bytes:
        b = bytearray(b2)
        b[9] = 0
        _recrc(b, n)
        return bytes(b)

    return {
        "auth_blake2b": (b2, "keyed BLAKE2b-256, key id client-17", "blake2b", CONTEXT, None, None),
        "auth_ed25519": (ed, "Ed25519 signature, key id client-17", "ed25519", CONTEXT, None, None),
        "auth_empty_context": (empty, "keyed BLAKE2b-256, key id client-18, empty context", "blake2b", "",
                               None, None),
        "auth_wrong_context": (b2, "auth_blake2b verified with the context of round 10", "blake2b",
                               "run-4/round-10/up", "AuthError", None),
        "auth_wrong_key": (b2, "auth_blake2b verified with client-17 mapped to client-18's key",
                           "blake2b_swapped", CONTEXT, "AuthError", None),
        "auth_algorithm_confusion": (b2, "a BLAKE2b tag checked where client-17 has an Ed25519 key",
                                     "ed25519", CONTEXT, "AuthError", None),
        "auth_tag_flipped": (flipped(len(b2) - 1), "one bit of the tag flipped", "blake2b", CONTEXT,
                             "AuthError", None),
        "auth_crc_flipped": (flipped(n - 1), "one bit of the CRC-32 flipped (the tag covers it)", "blake2b",
                             CONTEXT, "AuthError", "ChecksumError"),
        "auth_payload_forged": (payload_forged(), "an IDS_ bit flipped and the CRC recomputed", "blake2b",
                                CONTEXT, "AuthError", None),
        "auth_key_id_swapped": (relabeled(b"client-18"), "client-17's message relabeled as client-18",
                                "blake2b", CONTEXT, "AuthError", None),
        "auth_unknown_key_id": (relabeled(b"client-99"), "a key id the reader has no key for", "blake2b",
                                CONTEXT, "AuthError", None),
        "auth_trailer_stripped": (b2[:n], "trailer removed, flag still set", "blake2b", CONTEXT, "AuthError",
                                  "TruncatedError"),
        "auth_downgraded": (downgraded(), "trailer removed and the message rewritten as a valid 1.0 one",
                            "blake2b", CONTEXT, "AuthError", None),
        "auth_trailing_byte": (b2 + b"\x00", "one byte after the trailer", "blake2b", CONTEXT, "AuthError",
                               "FormatError"),
        "auth_unknown_algorithm": (unknown_algorithm(), "algorithm id 200 (not defined): decodes unverified "
                                   "without keys", "blake2b", CONTEXT, "AuthError", None),
        "auth_flag_in_1_0": (flag_in_1_0(), "the authentication flag in a message that says 1.0", "blake2b",
                             CONTEXT, "AuthError", "FormatError"),
        "body": (body, "the unauthenticated 1.0 message all of the above carry", "blake2b", CONTEXT,
                 "AuthError", None),
    }


def auth_files():
    sk = _ed25519_keys()["client-17"]
    index = {
        "encode": {"input_hex_float32": X.astype("<f4").tobytes().hex(), **ENCODE},
        "keys": {
            "blake2b": {k: v.hex() for k, v in BLAKE2B_KEYS.items()},
            "blake2b_swapped": {"client-17": BLAKE2B_KEYS["client-18"].hex()},
            "ed25519": {"client-17": _public_hex(sk)},
        },
        "ed25519_private_seeds": {k: v.hex() for k, v in ED25519_SEEDS.items()},
        "cases": {},
    }
    files = {}
    for name, (blob, desc, keyset, ctx, err, err_nokeys) in messages().items():
        files[f"auth/{name}.mucsc"] = blob
        index["cases"][name] = {"description": desc, "message": f"{name}.mucsc", "keys": keyset,
                                "context": ctx, "error": err, "error_without_keys": err_nokeys}
        _check(blob, keys_from_json(index["keys"], keyset), ctx, err, err_nokeys, name)
    files["auth/index.json"] = (json.dumps(index, indent=1, sort_keys=True) + "\n").encode()
    return files


def keys_from_json(keysets: dict[str, dict[str, str]], name: str):
    """The key map ``name`` of index.json: key id -> BLAKE2b secret, or -> Ed25519 public key."""
    if name != "ed25519":
        return {k: bytes.fromhex(v) for k, v in keysets[name].items()}
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return {k: Ed25519PublicKey.from_public_bytes(bytes.fromhex(v)) for k, v in keysets[name].items()}


def _check(blob, keys, ctx, err, err_nokeys, name):
    for kw, want in ((dict(keys=keys, context=ctx), err), ({}, err_nokeys)):
        try:
            mucsc.decode(blob, **kw)
        except mucsc.MucscError as exc:
            assert want and type(exc).__name__ == want, (name, kw.keys(), exc)
        else:
            assert want is None, (name, kw.keys(), "decoded")
