"""The one way zip-based inputs (.npz, torch zip checkpoints) are opened: every member's declared size
is checked against the load limit before anything inflates, and what cannot be bounded that way is
refused (issue 26: a 2 MB .pt whose storage member inflated to 2 GiB before torch noticed).

Both readers behind it (Python's ``zipfile`` for .npz, torch's miniz for checkpoints) produce at most
a member's declared uncompressed size (more is a CRC/size error), so the declared sizes bound the
work once they are known to be consistent: a stored member's sizes agree, a deflated member declares
no more than deflate can produce from its compressed bytes, nothing is encrypted or uses another
method.
"""

from __future__ import annotations

import zipfile
from typing import IO

from mucsc.tensorfiles._common import TensorFileError, _over_limit

MAX_MEMBERS = 1_000_000
#: compression methods whose output is bounded by the declared size and the compressed size
BOUNDED_METHODS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}
# deflate cannot expand more than ~1032:1 (a 258-byte match costs at least 2 bits); with slack for
# block headers of tiny members
DEFLATE_MAX_RATIO = 1032
DEFLATE_SLACK_BYTES = 1024
ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")


def is_zip(head: bytes) -> bool:
    """A zip archive's first bytes (an .npz, or a torch zip checkpoint)."""
    return head.startswith(ZIP_MAGIC)


def open_checked(f: IO[bytes], label: str, limit: float, size: int, explicit: bool,
                 what: str = "zip file") -> zipfile.ZipFile:
    """``f`` as a :class:`zipfile.ZipFile` whose members were all checked by :func:`check_members`
    (TensorFileError otherwise, naming the member and the problem)."""
    try:
        zf = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError, NotImplementedError) as exc:
        raise TensorFileError(f"{label}: not a valid {what} ({exc})") from None
    try:
        check_members(zf, label, limit, size, explicit)
    except BaseException:
        zf.close()
        raise
    return zf


def check_members(zf: zipfile.ZipFile, label: str, limit: float, size: int, explicit: bool) -> None:
    """Refuse, before anything is inflated: more than MAX_MEMBERS members, encrypted members, methods
    other than stored and deflate, sizes that contradict each other, and members that declare more
    than ``limit`` bytes in all."""
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise TensorFileError(f"{label}: {len(infos)} members exceed the limit {MAX_MEMBERS}")
    total = 0
    for info in infos:
        where = f"{label}: member {info.filename!r}"
        if info.flag_bits & 0x1:
            raise TensorFileError(f"{where} is encrypted")
        if info.compress_type not in BOUNDED_METHODS:
            raise TensorFileError(f"{where} uses compression method {info.compress_type}; only stored and "
                                  "deflate members are read (their size is bounded before inflating)")
        if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
            raise TensorFileError(f"{where} is stored but declares {info.file_size} bytes in "
                                  f"{info.compress_size}")
        if info.file_size > DEFLATE_MAX_RATIO * info.compress_size + DEFLATE_SLACK_BYTES:
            raise TensorFileError(f"{where} declares {info.file_size} bytes from {info.compress_size} "
                                  "compressed ones, more than deflate can produce")
        total += info.file_size
        if total > limit:
            raise _over_limit(label, "members declare", total, limit, size, explicit)


def check_member_name(name: str) -> str:
    """``name`` as a path inside an archive, refused (TensorFileError) when a naive unzip would write
    it outside the target directory: a NUL, a leading ``/`` or ``\\``, or a ``..`` component.  The
    wire format carries any UTF-8 name; only formats whose names are paths apply this."""
    if "\0" in name:
        raise TensorFileError(f"tensor name {name!r} contains a NUL character, which cannot be an archive "
                              "member name")
    if name.startswith(("/", "\\")):
        raise TensorFileError(f"tensor name {name!r} is an absolute path; refusing to write it as an "
                              "archive member (rename the tensor, or write .safetensors or .pt)")
    if ".." in name.replace("\\", "/").split("/"):
        raise TensorFileError(f"tensor name {name!r} has a '..' component, which would let unzip write "
                              "outside its directory; refusing (rename the tensor, or write .safetensors or .pt)")
    return name
