"""Fixed-width bit packing of small unsigned integers (cluster IDs), LSB-first.

Element i occupies stream bits [i*w, (i+1)*w); stream bit k is bit (k % 8) of byte k // 8; the last
byte is zero-padded.  This is the order of FORMAT.md section "IDS_" and equals little-endian packing of
whole words, which is what makes the widths 1, 2, 4, 8 and 16 pure reshapes.
"""

from __future__ import annotations

import numpy as np

from mucsc.errors import FormatError

MAX_WIDTH = 16


def ceil_log2(x: int) -> int:
    """ceil(log2 x) for an integer x >= 1 (0 for x = 1), exactly (no float rounding): the bits that
    address x distinct values."""
    return max(0, int(x - 1).bit_length())


def packed_size(n: int, width: int) -> int:
    """Bytes needed for ``n`` values of ``width`` bits."""
    return (n * width + 7) // 8


def pack(values: np.ndarray, width: int) -> bytes:
    """Pack non-negative integers < 2**width (width 0..16) into bytes; width 0 gives b''."""
    if not 0 <= width <= MAX_WIDTH:
        raise ValueError(f"bit width must be in 0..{MAX_WIDTH}, got {width}")
    v = np.ascontiguousarray(values).reshape(-1)
    n = v.size
    if width == 0 or n == 0:
        return b""
    if width == 8:
        return v.astype(np.uint8, copy=False).tobytes()
    if width == 16:
        return v.astype("<u2", copy=False).tobytes()
    if width in (1, 2, 4):
        per = 8 // width
        v = v.astype(np.uint8, copy=False)
        pad = (-n) % per
        if pad:
            v = np.concatenate([v, np.zeros(pad, np.uint8)])
        g = v.reshape(-1, per)
        out = g[:, 0].copy()
        for j in range(1, per):
            out |= g[:, j] << np.uint8(j * width)
        return out.tobytes()
    return _pack_generic(v, width)


def _pack_generic(v: np.ndarray, width: int) -> bytes:
    """Widths 3, 5-7, 9-15: groups of 8 values fill exactly ``width`` bytes."""
    n = v.size
    pad = (-n) % 8
    v64 = v.astype(np.uint64)
    if pad:
        v64 = np.concatenate([v64, np.zeros(pad, np.uint64)])
    g = v64.reshape(-1, 8)
    if width <= 8:  # 8 values * width bits <= 64 bits: one uint64 per group
        word = np.zeros(g.shape[0], np.uint64)
        for j in range(8):
            word |= g[:, j] << np.uint64(j * width)
        out = word.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :width]
    else:  # up to 128 bits per group: low and high uint64 words
        lo = np.zeros(g.shape[0], np.uint64)
        hi = np.zeros(g.shape[0], np.uint64)
        for j in range(8):
            s = j * width
            if s + width <= 64:
                lo |= g[:, j] << np.uint64(s)
            elif s >= 64:
                hi |= g[:, j] << np.uint64(s - 64)
            else:  # straddles the word boundary
                lo |= g[:, j] << np.uint64(s)
                hi |= g[:, j] >> np.uint64(64 - s)
        both = np.stack([lo.astype("<u8"), hi.astype("<u8")], axis=1).view(np.uint8).reshape(-1, 16)
        out = both[:, :width]
    return np.ascontiguousarray(out).tobytes()[: packed_size(n, width)]


def check_packed(buf: bytes | memoryview, width: int, n: int) -> None:
    """The checks :func:`unpack` makes before unpacking (width, exact length, zero padding bits), for
    decoders that unpack elsewhere (the torch backend on a device)."""
    if not 0 <= width <= MAX_WIDTH:
        raise FormatError(f"bit width must be in 0..{MAX_WIDTH}, got {width}")
    need = packed_size(n, width)
    if len(buf) != need:
        raise FormatError(f"packed ids: {len(buf)} bytes for {n} values of {width} bits, expected {need}")
    if need:
        _check_padding(np.frombuffer(buf, np.uint8), n, width)


def unpack(buf: bytes | memoryview, width: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack`: ``n`` values as uint8 (width <= 8) or uint16.

    The buffer length must be exactly ``packed_size(n, width)`` and padding bits must be zero.
    """
    if not 0 <= width <= MAX_WIDTH:
        raise FormatError(f"bit width must be in 0..{MAX_WIDTH}, got {width}")
    out_dtype = np.uint8 if width <= 8 else np.uint16
    need = packed_size(n, width)
    if len(buf) != need:
        raise FormatError(f"packed ids: {len(buf)} bytes for {n} values of {width} bits, expected {need}")
    if width == 0 or n == 0:
        return np.zeros(n, out_dtype)
    b = np.frombuffer(buf, np.uint8)
    _check_padding(b, n, width)
    if width == 8:
        return b.copy()
    if width == 16:
        return b.view("<u2").astype(np.uint16)
    if width in (1, 2, 4):
        per = 8 // width
        mask = np.uint8((1 << width) - 1)
        out = np.empty((b.size, per), np.uint8)
        for j in range(per):
            np.bitwise_and(b >> np.uint8(j * width), mask, out=out[:, j])
        return out.reshape(-1)[:n]
    return _unpack_generic(b, width, n, out_dtype)


def _unpack_generic(b: np.ndarray, width: int, n: int, out_dtype: type) -> np.ndarray:
    groups = (n + 7) // 8
    padded = np.zeros(groups * width, np.uint8)
    padded[: b.size] = b
    g = padded.reshape(groups, width)
    mask = np.uint64((1 << width) - 1)
    out = np.empty((groups, 8), out_dtype)
    if width <= 8:
        w8 = np.zeros((groups, 8), np.uint8)
        w8[:, :width] = g
        word = w8.view("<u8").reshape(-1)
        for j in range(8):
            out[:, j] = (word >> np.uint64(j * width)) & mask
    else:
        w16 = np.zeros((groups, 16), np.uint8)
        w16[:, :width] = g
        words = w16.view("<u8").reshape(groups, 2)
        lo, hi = words[:, 0], words[:, 1]
        for j in range(8):
            s = j * width
            if s + width <= 64:
                val = lo >> np.uint64(s)
            elif s >= 64:
                val = hi >> np.uint64(s - 64)
            else:
                val = (lo >> np.uint64(s)) | (hi << np.uint64(64 - s))
            out[:, j] = val & mask
    return out.reshape(-1)[:n]


def _check_padding(b: np.ndarray, n: int, width: int) -> None:
    used = n * width
    spare = b.size * 8 - used
    if spare and int(b[-1]) >> (8 - spare):
        raise FormatError("packed ids: padding bits in the last byte are not zero")
