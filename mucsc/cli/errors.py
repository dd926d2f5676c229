"""The one place where errors become what the user sees: a single ``mucsc: error: FILE: problem`` line.

Every error, ours and click's own (usage errors keep click's usage line and help hint above it),
starts with the one prefix ``mucsc: error:`` (notes and warnings: ``mucsc: note:``, ``mucsc: warning:``).
Exit codes (also in README.md and docs/cli.md): 0 success; 1 bad or unreadable data, I/O failure,
an output that exists (without -f); 2 usage (unknown option, bad parameter value, option the codec
does not have, unknown file suffix).  Library errors never reach the user as tracebacks; genuine
bugs still do.
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from typing import IO, Any

import click

from mucsc.errors import MucscError, ParameterError, UnknownCodecError
from mucsc.tensorfiles import TensorFileError

EXIT_OK, EXIT_DATA, EXIT_USAGE = 0, 1, 2
PREFIX = "mucsc: error: "


class Failure(click.ClickException):
    """A one-line error, exit status 1."""

    exit_code = EXIT_DATA

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(PREFIX + self.format_message(), err=True)


class Prefixed(click.ClickException):
    """Any other click error (a usage error, a bad parameter, the simulator's failures) shown with the
    one prefix: click's usage line and help hint for usage errors, then ``mucsc: error: ...``."""

    def __init__(self, exc: click.ClickException) -> None:
        super().__init__(exc.format_message())
        self.exit_code = exc.exit_code
        self.ctx = getattr(exc, "ctx", None) if isinstance(exc, click.UsageError) else None

    def show(self, file: IO[Any] | None = None) -> None:
        ctx = self.ctx
        if ctx is not None:
            hint = (f"Try '{ctx.command_path} {ctx.help_option_names[0]}' for help.\n"
                    if ctx.command.get_help_option(ctx) is not None else "")
            click.echo(f"{ctx.get_usage()}\n{hint}", err=True, color=ctx.color)
        click.echo(PREFIX + self.format_message(), err=True)


def prefixed(exc: click.ClickException) -> click.ClickException:
    """``exc`` as shown with the one prefix (ours already are)."""
    return exc if isinstance(exc, (Failure, Prefixed)) else Prefixed(exc)


class FileProblem(Exception):
    """An error tied to a file; converted to a :class:`Failure` by :func:`to_click_error`."""

    def __init__(self, path: str, exc: BaseException) -> None:
        super().__init__(path, exc)
        self.path, self.exc = path, exc


@contextlib.contextmanager
def about(path: str | os.PathLike) -> Iterator[None]:
    """Attribute library and I/O errors raised inside the block to ``path``."""
    try:
        yield
    except (MucscError, OSError, MemoryError) as exc:
        if isinstance(exc, (TensorFileError, click.ClickException)):
            raise
        raise FileProblem(os.fspath(path), exc) from exc


def to_click_error(exc: BaseException) -> click.ClickException | None:
    """The click exception to raise for ``exc``, or None when it is not ours to translate."""
    path = None
    if isinstance(exc, FileProblem):
        path, exc = exc.path, exc.exc
    if isinstance(exc, (UnknownCodecError, ParameterError)):
        return Prefixed(click.UsageError(str(exc)))
    if isinstance(exc, TensorFileError):
        return Failure(str(exc))
    if isinstance(exc, MucscError):
        kind = _kind(exc)
        text = str(exc)
        if kind and (kind.split(":")[0] in text.lower() or "mucsc message" in text):
            kind = ""  # the library's message already says it
        return Failure(_prefix(path, f"{kind}{text}"))
    if isinstance(exc, MemoryError):
        return Failure(_prefix(path, "out of memory"))
    if isinstance(exc, OSError):
        where = path or exc.filename
        return Failure(_prefix(os.fspath(where) if where else None,
                               exc.strerror or os.strerror(exc.errno or errno.EIO) if exc.errno else str(exc)))
    return None


def _kind(exc: MucscError) -> str:
    # the class name tells a truncated file from a corrupted one; the message says where
    names = {"TruncatedError": "truncated: ", "ChecksumError": "corrupt: ", "VersionError": "",
             "LimitError": "over a limit: ", "FormatError": "not a valid mucsc message: ",
             "AuthError": "authentication failed: "}
    return names.get(type(exc).__name__, "")


def _prefix(path: str | None, message: str) -> str:
    return f"{path}: {message}" if path else message
