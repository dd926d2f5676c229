"""The CLI's authentication options (docs/security.md): signing keys for ``compress``, verifying keys
for ``decompress``, ``test`` and ``info``.  Keys are loaded through the public API
(:func:`mucsc.load_key`, :func:`mucsc.load_keys`), which refuses secrets that other users can read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

import mucsc

KEY_FILE_HELP = ("Key file: 32 raw bytes or hex (BLAKE2b secret), or PEM (Ed25519); must not be readable "
                 "by other users if secret.")
CONTEXT_HELP = "Context the tag also covers, not stored in the message (e.g. run-4/round-9/up); UTF-8."


def signing_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--key-file / --key-id / --context for ``compress``."""
    for opt in reversed([
        click.option("--key-file", metavar="FILE", help="Authenticate the message with this key. " + KEY_FILE_HELP),
        click.option("--key-id", metavar="ID", help="Key id stored in the message (how the receiver finds "
                     "the key); needed with --key-file."),
        click.option("--context", metavar="TEXT", help=CONTEXT_HELP),
    ]):
        f = opt(f)
    return f


def verifying_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """--key-file / --keys / --key-id / --context for the commands that read messages."""
    for opt in reversed([
        click.option("--key-file", metavar="FILE", help="Verify the authentication tag with this key "
                     "(a message without a valid tag fails). " + KEY_FILE_HELP),
        click.option("--keys", "keys_dir", metavar="DIR", help="Verify with the key named by the message's "
                     "key id ID (letters, digits, '-', '_'): DIR/ID.key (secret) or DIR/ID.pub (public key)."),
        click.option("--key-id", metavar="ID", help="With --key-file: the key id the message must name."),
        click.option("--context", metavar="TEXT", help=CONTEXT_HELP),
    ]):
        f = opt(f)
    return f


def signing_kwargs(key_file: str | None, key_id: str | None, context: str | None) -> dict[str, Any]:
    """``encode`` keyword arguments for the signing options (a usage error when they do not fit)."""
    if key_file is None:
        if key_id is not None or context is not None:
            raise click.UsageError("--key-id and --context need --key-file")
        return {}
    if key_id is None:
        raise click.UsageError("--key-file needs --key-id (the receiver looks the key up by it)")
    key = mucsc.load_key(key_file)
    if not isinstance(key, bytes) and not hasattr(key, "sign"):
        raise click.UsageError(f"{key_file}: a public key cannot sign; give the private key")
    return {"key": key, "key_id": key_id, "context": context}


def verifying_kwargs(key_file: str | None, keys_dir: str | None, key_id: str | None,
                     context: str | None) -> dict[str, Any]:
    """``decode``/``verify``/``inspect`` keyword arguments for the verifying options."""
    if key_file is not None and keys_dir is not None:
        raise click.UsageError("give --key-file or --keys, not both")
    if key_file is None and keys_dir is None:
        if key_id is not None or context is not None:
            raise click.UsageError("--key-id and --context need --key-file or --keys")
        return {}
    if keys_dir is not None:
        if key_id is not None:
            raise click.UsageError("--key-id goes with --key-file (with --keys the message names its key)")
        return {"keys": mucsc.load_keys(keys_dir), "context": context}
    key = mucsc.public_key(mucsc.load_key(key_file))
    keys: Any = {key_id: key} if key_id is not None else (lambda _kid: key)
    return {"keys": keys, "context": context}


def unverified_note(info: Any) -> str | None:
    """A note for a message whose tag was not checked (no keys given), else None."""
    a = info.auth
    if a is None or a.verified:
        return None
    return (f"the message is authenticated ({a.algorithm}, key id {a.key_id!r}) but was not verified: "
            "give --key-file or --keys")
