"""Fingerprint of a set of named tensors: which base an update was made against.

``mucsc compress NEW --base OLD`` stores OLD's fingerprint in the message (meta key
``mucsc.base_fingerprint``, spec/FORMAT.md 2.4.1) so that ``decompress --base`` can refuse a different
OLD instead of silently adding the update to the wrong weights.  The fingerprint covers every tensor's
name, dtype, shape and bytes, and does not depend on the order of the tensors or on the file format
they were read from (.pt, .safetensors and .npz of the same state_dict agree).
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import numpy as np

from mucsc.codec.backends.tensors import on_host, to_tensors

PREFIX = "blake2b-256:"
DOMAIN = b"mucsc base fingerprint v1\x00"  # domain separation from any other use of BLAKE2b
CHUNK = 1 << 24  # bytes hashed at a time (no copy of a whole tensor)


def fingerprint(data: Any) -> str:
    """``"blake2b-256:<64 hex digits>"`` of an array, a torch tensor or a mapping of them.

    BLAKE2b-256 (RFC 7693, no key) over DOMAIN, then for each tensor in order of its name's UTF-8
    bytes: u32 name length, name, u8 dtype-name length, dtype name, u8 rank, u64 per dimension,
    u64 data length, data (little-endian; bfloat16 as its 16-bit pattern; bool as bytes 0/1).  A bare
    array counts as the tensor named "" (all integers little-endian).
    """
    _, tensors = to_tensors(data)
    h = hashlib.blake2b(digest_size=32)
    h.update(DOMAIN)
    for t in sorted((on_host(t) for t in tensors), key=lambda t: t.name.encode("utf-8")):
        shape = tuple(int(s) for s in t.array.shape)
        a = np.ascontiguousarray(t.array).reshape(-1)  # (ascontiguousarray makes a 0-d array 1-d)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        name, dtype = t.name.encode("utf-8"), t.dtype.encode("ascii")
        h.update(struct.pack("<I", len(name)) + name + struct.pack("<B", len(dtype)) + dtype
                 + struct.pack("<B", len(shape)) + b"".join(struct.pack("<Q", s) for s in shape)
                 + struct.pack("<Q", a.nbytes))
        flat = a.view(np.uint8) if a.size else np.zeros(0, np.uint8)
        for i in range(0, flat.size, CHUNK):
            h.update(memoryview(flat[i: i + CHUNK]))
    return PREFIX + h.hexdigest()
