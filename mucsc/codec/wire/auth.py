"""Authenticated messages (format 1.1, spec/FORMAT.md section 2.5): keyed BLAKE2b-256 and Ed25519.

A writer appends a trailer after the CRC-32: algorithm id, key id, and a tag over every byte before
the tag plus a caller-given *context* that is not stored (run id, round, direction), so that a message
replayed in another round or run fails.  A reader with keys checks the tag over the raw bytes before
any section is parsed or decompressed: a forged message costs one hash, never a decode.

Keys: ``bytes`` (16..64 of them; 32 recommended) are shared BLAKE2b secrets; an Ed25519 private key
(``cryptography``, the optional extra ``mucsc[auth]``) signs, its public key verifies, so a server
holding only public keys cannot forge a client's update.  ``cryptography`` is imported only when an
Ed25519 key is used.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import re
import stat
import struct
import zlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Union

from mucsc.codec.wire import container as fmt
from mucsc.errors import AuthError, FormatError, InputError, KeyFileError, ParameterError

ALG_BLAKE2B, ALG_ED25519 = 1, 2
ALGORITHMS = {ALG_BLAKE2B: "blake2b-256", ALG_ED25519: "ed25519"}
ALGORITHM_IDS = {"blake2b": ALG_BLAKE2B, "blake2b-256": ALG_BLAKE2B, "ed25519": ALG_ED25519}
TAG_LENGTHS = fmt.AUTH_TAG_LENGTHS
MIN_SECRET, MAX_SECRET = 16, 64  # BLAKE2b keys up to 64 bytes; fewer than 16 is not a secret worth having
# Ed25519 signs this label followed by BLAKE2b-512 of the authenticated input (FORMAT.md 2.5): the label
# keeps a mucsc signature from being valid in any other protocol that uses the same key.
ED25519_LABEL = b"mucsc-1.1 ed25519 blake2b-512\x00"
MAX_KEY_FILE_BYTES = 64 << 10
# Key directories (``load_keys``): a key id names a file only if it matches this grammar, and then
# exactly DIR/<id>.key (a BLAKE2b secret or an Ed25519 private key) or DIR/<id>.pub (an Ed25519 public
# key); no other name is tried, so no two ids share a file (issue 26: "client-17.key" once found
# DIR/client-17.key, the file of "client-17").
KEY_ID_GRAMMAR = re.compile(r"[A-Za-z0-9_-]{1,64}")
SECRET_SUFFIX, PUBLIC_SUFFIX = ".key", ".pub"

Key = Any  # bytes (BLAKE2b secret) | Ed25519PrivateKey | Ed25519PublicKey
Keys = Union[Mapping[str, Key], Callable[[str], Key]]


@dataclasses.dataclass(frozen=True)
class AuthSummary:
    """The authentication trailer of a message, and whether this reader verified it."""

    algorithm: str      # "blake2b-256", "ed25519", or "unknown (id N)"
    key_id: str
    tag_bytes: int
    trailer_bytes: int  # what the trailer adds to the message: 4 + key id + tag
    verified: bool


def summary(auth: fmt.AuthTrailer, verified: bool) -> AuthSummary:
    name = ALGORITHMS.get(auth.algorithm, f"unknown (id {auth.algorithm})")
    return AuthSummary(name, auth.key_id, len(auth.tag), auth.size, verified)


# ---------------------------------------------------------------------------------------------- keys

def _is_secret(key: Any) -> bool:
    return isinstance(key, (bytes, bytearray, memoryview))


def _ed25519() -> Any:
    """The cryptography package's Ed25519 module, or a ParameterError saying how to install it."""
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise ParameterError("Ed25519 keys need the 'cryptography' package: pip install 'mucsc[auth]'") \
            from None
    return ed25519


def _secret(key: Any, what: str) -> bytes:
    key = bytes(key)
    if not MIN_SECRET <= len(key) <= MAX_SECRET:
        raise ParameterError(f"{what}: a BLAKE2b key must be {MIN_SECRET}..{MAX_SECRET} bytes, got {len(key)}")
    return key


def _algorithm_of(key: Any, what: str) -> int:
    """The algorithm a key is for: bytes -> BLAKE2b, an Ed25519 key object -> Ed25519."""
    if _is_secret(key):
        return ALG_BLAKE2B
    if type(key).__module__.startswith("cryptography"):
        ed = _ed25519()
        if isinstance(key, (ed.Ed25519PrivateKey, ed.Ed25519PublicKey)):
            return ALG_ED25519
    raise ParameterError(f"{what}: a key must be bytes (BLAKE2b) or an Ed25519 key, got {type(key).__name__}")


def generate_key(algorithm: str = "blake2b", seed: bytes | None = None) -> Any:
    """A new key: 32 random bytes for ``"blake2b"``, an Ed25519 private key for ``"ed25519"``.

    ``seed`` (32 bytes) makes it deterministic -- for simulations and tests, never for real secrets.
    """
    alg = ALGORITHM_IDS.get(algorithm)
    if alg is None:
        raise ParameterError(f"unknown authentication algorithm {algorithm!r} (blake2b or ed25519)")
    if seed is not None and len(seed) != 32:
        raise ParameterError(f"a key seed must be 32 bytes, got {len(seed)}")
    raw = os.urandom(32) if seed is None else bytes(seed)
    if alg == ALG_BLAKE2B:
        return raw
    return _ed25519().Ed25519PrivateKey.from_private_bytes(raw)


def public_key(key: Any) -> Any:
    """What a verifier needs: an Ed25519 private key's public key; a BLAKE2b secret itself."""
    if _algorithm_of(key, "public_key") == ALG_ED25519 and hasattr(key, "public_key"):
        return key.public_key()
    return key


# ---------------------------------------------------------------------------------------------- tags

def context_bytes(context: bytes | bytearray | memoryview | str | None) -> bytes:
    """The context as bytes (a str is UTF-8); None is the empty context."""
    if context is None:
        return b""
    if isinstance(context, str):
        return context.encode("utf-8")
    if isinstance(context, (bytes, bytearray, memoryview)):
        return bytes(context)
    raise ParameterError(f"context must be bytes or str, got {type(context).__name__}")


def _digest(context: bytes, covered: Iterable[bytes | memoryview], key: bytes | None, size: int) -> bytes:
    """BLAKE2b over LE64(len(context)) || context || covered (FORMAT.md 2.5), keyed when ``key``.

    The length prefix makes the split between context and message unambiguous; the chunks are hashed
    in place (memoryviews), never joined.
    """
    h = hashlib.blake2b(digest_size=size, key=key or b"")
    h.update(struct.pack("<Q", len(context)))
    h.update(context)
    for chunk in covered:
        h.update(chunk)
    return h.digest()


class Signer:
    """Appends a trailer for one key, key id and context (the writer side of :class:`fmt.AuthWriter`)."""

    def __init__(self, key: Any, key_id: str, context: Any = None) -> None:
        self.algorithm = _algorithm_of(key, "key")
        if self.algorithm == ALG_ED25519 and not hasattr(key, "sign"):
            raise ParameterError("key: signing needs an Ed25519 private key, not a public key")
        try:
            fmt.check_key_id(key_id)
        except (TypeError, ValueError) as exc:
            raise ParameterError(f"key_id: {exc}") from None
        self.key_id = key_id
        self.tag_length = TAG_LENGTHS[self.algorithm]
        self._key = _secret(key, "key") if self.algorithm == ALG_BLAKE2B else key
        self._context = context_bytes(context)

    @property
    def trailer_bytes(self) -> int:
        """What the trailer adds to a message: header, key id and tag."""
        return fmt.AUTH_HEADER.size + len(self.key_id.encode("utf-8")) + self.tag_length

    def tag(self, covered: Iterable[bytes | memoryview]) -> bytes:
        if self.algorithm == ALG_BLAKE2B:
            return _digest(self._context, covered, self._key, 32)
        return self._key.sign(ED25519_LABEL + _digest(self._context, covered, None, 64))


def sign(blob: bytes | bytearray | memoryview, key: Any, key_id: str, context: Any = None) -> bytes:
    """Authenticate an existing unauthenticated message: the same body as 1.1 with a trailer.

    The message is checked first (CRC, section table, header), so a corrupted one is never signed.
    """
    signer = Signer(key, key_id, context)
    msg = fmt.read_message(blob)
    if msg.auth is not None:
        raise InputError(f"the message is already authenticated (key id {msg.auth.key_id!r})")
    mv = fmt.as_bytes_view(blob)
    _, major, minor, flags, count, total = fmt.PREAMBLE.unpack_from(mv, 0)
    preamble = fmt.PREAMBLE.pack(fmt.MAGIC, major, max(minor, 1), flags | fmt.FLAG_AUTH, count, total)
    sections = mv[fmt.PREAMBLE.size: total - fmt.TRAILER.size]
    crc = fmt.TRAILER.pack(_crc32([preamble, sections]))
    parts = [preamble, sections, crc, *fmt.auth_trailer_head(signer.algorithm, key_id, signer.tag_length)]
    parts.append(signer.tag(parts))
    return b"".join(parts)


def _crc32(chunks: Iterable[bytes | memoryview]) -> int:
    crc = 0
    for c in chunks:
        crc = zlib.crc32(c, crc)
    return crc


# ---------------------------------------------------------------------------------------------- verify

def _lookup(keys: Keys, key_id: str) -> Any:
    if callable(keys) and not isinstance(keys, Mapping):
        try:
            key = keys(key_id)
        except KeyError:
            key = None
    elif isinstance(keys, Mapping):
        key = keys.get(key_id)
    else:
        raise ParameterError(f"keys must be a mapping key id -> key or a callable, got {type(keys).__name__}")
    if key is None:
        raise AuthError(f"unknown key id {key_id!r}: no key for it")
    return key


def authenticate(blob: bytes | bytearray | memoryview, keys: Keys, context: Any = None, *,
                 require_auth: bool = True) -> AuthSummary | None:
    """Verify a message's tag with ``keys`` (a mapping key id -> key, or a callable) and ``context``.

    Only the preamble and the trailer are read; the tag is checked over the raw bytes, in constant
    time, before anything else is parsed.  Returns the verified trailer's summary; None for a message
    without a trailer when ``require_auth`` is False.  Raises :class:`AuthError` on a bad tag, an
    unknown key id, a missing trailer, a wrong context -- and on any message too malformed to locate
    its trailer (the cause is chained).
    """
    if keys is None:
        raise ParameterError("authenticating needs keys (a mapping key id -> key, or a callable)")
    ctx = context_bytes(context)
    mv = fmt.as_bytes_view(blob)
    try:
        frame = fmt.read_frame(mv)
    except FormatError as exc:
        raise AuthError(f"cannot authenticate the message: {exc}") from exc
    auth = frame.auth
    if auth is None:
        if require_auth:
            raise AuthError("the message is not authenticated (it has no authentication trailer)")
        return None
    name = ALGORITHMS.get(auth.algorithm)
    if name is None:
        raise AuthError(f"key id {auth.key_id!r}: authentication algorithm {auth.algorithm} is not supported")
    key = _lookup(keys, auth.key_id)
    kalg = _algorithm_of(key, f"key for {auth.key_id!r}")
    if kalg != auth.algorithm:
        raise AuthError(f"key id {auth.key_id!r}: the message is tagged with {name}, "
                        f"but the key given for it is a {ALGORITHMS[kalg]} key")
    covered = mv[: auth.tag_offset]
    if auth.algorithm == ALG_BLAKE2B:
        ok = hmac.compare_digest(_digest(ctx, [covered], _secret(key, f"key for {auth.key_id!r}"), 32),
                                 auth.tag)
    else:
        ok = _ed25519_verify(public_key(key), auth.tag, ED25519_LABEL + _digest(ctx, [covered], None, 64))
    if not ok:
        raise AuthError(f"key id {auth.key_id!r}: the {name} tag does not match (altered message, "
                        "wrong key or wrong context)")
    return summary(auth, verified=True)


def _ed25519_verify(pub: Any, signature: bytes, data: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        pub.verify(signature, data)
    except InvalidSignature:
        return False
    return True


def check(blob: bytes | bytearray | memoryview, keys: Keys | None, context: Any,
          require_auth: bool | None) -> AuthSummary | None:
    """The readers' hook: verify when ``keys`` are given; ``require_auth`` defaults to ``keys is not None``."""
    if require_auth is None:
        require_auth = keys is not None
    if keys is None:
        if require_auth:
            raise ParameterError("require_auth=True needs keys to verify the message with")
        if context is not None:  # a caller who forgot keys must not get an unverified decode silently
            raise ParameterError("context is only used to verify an authentication tag: give keys too")
        return None
    return authenticate(blob, keys, context, require_auth=require_auth)


# ---------------------------------------------------------------------------------------------- key files

def load_key(path: str | os.PathLike) -> Any:
    """A key from a file: 32 raw bytes or hex text (a BLAKE2b secret), or PEM (Ed25519 private/public).

    Secret and private keys that anyone but their owner can read or write are refused (chmod 600); so
    is a public key file that others can write (whoever can replace it can forge messages), and any key
    file in a directory that others can write (they could swap it).
    """
    p = Path(path)
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):
            raise KeyFileError(f"{p}: not a regular file")
        if st.st_size > MAX_KEY_FILE_BYTES:
            raise KeyFileError(f"{p}: {st.st_size} bytes is too large for a key file")
        data = p.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"{p}: cannot read key file ({exc.strerror or exc})") from None
    if data.lstrip().startswith(b"-----BEGIN"):
        key, secret = _load_pem(p, data)
    else:
        key, secret = _load_secret(p, data), True
    if os.name == "posix":
        _check_permissions(p, st.st_mode, secret)
    return key


def _check_permissions(p: Path, mode: int, secret: bool) -> None:
    """KeyFileError when users other than the owner can read a secret, write any key file, or write the
    directory holding it."""
    what = "private key" if secret else "public key"
    denied = {"read": stat.S_IRGRP | stat.S_IROTH, "write": stat.S_IWGRP | stat.S_IWOTH}
    for access in ("read", "write") if secret else ("write",):
        bits = mode & denied[access]
        if bits:
            who = "every user" if bits & (stat.S_IROTH | stat.S_IWOTH) else "the file's group"
            raise KeyFileError(f"{p}: refusing a {what} that {who} can {access} "
                               f"(mode {stat.S_IMODE(mode):04o}); run: chmod {600 if secret else 644} {p}")
    parent = p.resolve().parent
    try:
        dmode = parent.stat().st_mode
    except OSError as exc:
        raise KeyFileError(f"{parent}: cannot check the key file's directory ({exc.strerror or exc})") from None
    if dmode & (stat.S_IWGRP | stat.S_IWOTH):
        raise KeyFileError(f"{p}: refusing a {what} in {parent}, a directory other users can write (mode "
                           f"{stat.S_IMODE(dmode):04o}: they could replace it); run: chmod go-w {parent}")


def _load_secret(p: Path, data: bytes) -> bytes:
    if len(data) == 32:
        return data
    try:
        key = bytes.fromhex(data.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise KeyFileError(f"{p}: not a key file (expected 32 raw bytes, hex text, or PEM)") from None
    if not MIN_SECRET <= len(key) <= MAX_SECRET:
        raise KeyFileError(f"{p}: a hex BLAKE2b key must be {MIN_SECRET}..{MAX_SECRET} bytes, got {len(key)}")
    return key


def _load_pem(p: Path, data: bytes) -> tuple[Any, bool]:
    """(key, is it private) from PEM text; only unencrypted Ed25519 keys."""
    ed = _ed25519()
    from cryptography.hazmat.primitives import serialization

    private = b"PRIVATE KEY" in data.split(b"\n", 1)[0]
    try:
        key = (serialization.load_pem_private_key(data, password=None) if private
               else serialization.load_pem_public_key(data))
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{p}: not a usable PEM key ({exc})") from None
    except Exception as exc:  # cryptography raises UnsupportedAlgorithm for unknown key types
        raise KeyFileError(f"{p}: not a usable PEM key ({type(exc).__name__}: {exc})") from None
    if not isinstance(key, (ed.Ed25519PrivateKey, ed.Ed25519PublicKey)):
        raise KeyFileError(f"{p}: a {type(key).__name__} is not an Ed25519 key")
    return key, private


def load_keys(directory: str | os.PathLike) -> Callable[[str], Any]:
    """A key lookup over a directory of key files, by one explicit rule: key id ``ID`` (letters,
    digits, ``-`` and ``_``, at most 64: :data:`KEY_ID_GRAMMAR`) is ``DIR/ID.key`` (a BLAKE2b secret
    or an Ed25519 private key) or ``DIR/ID.pub`` (an Ed25519 public key), never both; any other id is
    unknown.  Keys are loaded (and their permissions checked) when first asked for."""
    root = Path(directory)
    if not root.is_dir():
        raise KeyFileError(f"{root}: not a directory of key files")
    cache: dict[str, Any] = {}

    def lookup(key_id: str) -> Any:
        if key_id not in cache:
            cache[key_id] = _key_in_directory(root, key_id)
        return cache[key_id]

    return lookup


def _key_in_directory(root: Path, key_id: str) -> Any:
    """The key of ``key_id`` in ``root`` by :func:`load_keys`' rule, or None when there is none."""
    if not KEY_ID_GRAMMAR.fullmatch(key_id):
        return None
    found = [root / (key_id + s) for s in (SECRET_SUFFIX, PUBLIC_SUFFIX)
             if os.path.lexists(root / (key_id + s))]
    if len(found) > 1:
        raise KeyFileError(f"{root}: both {key_id}{SECRET_SUFFIX} and {key_id}{PUBLIC_SUFFIX} exist for "
                           f"key id {key_id!r}; keep one")
    if not found:
        return None
    key = load_key(found[0])
    public = not (isinstance(key, bytes) or hasattr(key, "sign"))
    if public != (found[0].suffix == PUBLIC_SUFFIX):
        kinds = ("a BLAKE2b secret or an Ed25519 private key", "an Ed25519 public key")
        raise KeyFileError(f"{found[0]}: holds {kinds[public]}, but a {found[0].suffix} file holds "
                           f"{kinds[found[0].suffix == PUBLIC_SUFFIX]}")
    return key
