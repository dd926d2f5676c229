"""Atomic writes: a temporary file in the destination's directory, then a rename, so a failed or
interrupted write never leaves a half-written file; and :class:`WriteAll` for pipes."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from collections.abc import Iterator
from typing import IO, Any

from mucsc.tensorfiles._common import TensorFileError


class WriteAll(io.RawIOBase):
    """A write-only stream that never loses a short write.

    Seen here: when the reader of a pipe exits mid-write, ``sys.stdout.buffer.write`` returned the
    partial count instead of raising; this wrapper retries the rest, so the next write raises EPIPE.
    """

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__()
        self._stream = stream

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        mv = memoryview(data).cast("B")
        total = len(mv)
        while len(mv):
            n = self._stream.write(mv)
            if not n:
                raise BrokenPipeError(32, "short write")
            mv = mv[n:]
        return total

    def flush(self) -> None:
        self._stream.flush()



@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, *, force: bool = False) -> Iterator[IO[bytes]]:
    """Open a temporary file beside ``path``; on success it becomes ``path``, on any error it vanishes.

    Without ``force`` an existing ``path`` is refused up front and, at the end, the rename is done with
    ``os.link`` so a file created meanwhile is not clobbered either.
    """
    path = os.fspath(path)
    if not force and os.path.lexists(path):
        raise TensorFileError(f"{path}: already exists (use -f to overwrite)")
    if os.path.isdir(path):
        raise TensorFileError(f"{path}: is a directory")
    directory = os.path.dirname(path) or "."
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp", dir=directory)
    except OSError as exc:
        raise TensorFileError(f"{path}: cannot create a file in {directory}: "
                              f"{exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
            os.fchmod(f.fileno(), 0o666 & ~_umask())
        _commit(tmp, path, force)
    except BaseException as exc:  # also SIGTERM/SIGHUP, which the CLI turns into an exception
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # e.g. ENOSPC: name the file, not only the errno
            raise TensorFileError(f"{path}: {exc.strerror or exc}") from None
        raise


def _commit(tmp: str, path: str, force: bool) -> None:
    if force:
        os.replace(tmp, path)
        return
    try:
        os.link(tmp, path)  # fails if path appeared meanwhile; never overwrites
    except FileExistsError:
        raise TensorFileError(f"{path}: already exists (use -f to overwrite)") from None
    except OSError:  # file systems without hard links
        if os.path.lexists(path):
            raise TensorFileError(f"{path}: already exists (use -f to overwrite)") from None
        os.replace(tmp, path)
        return
    os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask

