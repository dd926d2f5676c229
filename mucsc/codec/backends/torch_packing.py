"""The step "IDs and bits to bytes and back", torch form (spec/FORMAT.md 4.2, LSB-first), byte-identical
to :mod:`mucsc.codec.wire.bitpack`: the packed bytes left on the IDs' device as a
``torch_transfer.DeviceBytes`` payload.  torch is imported only when it runs.

Element i occupies stream bits [i*w, (i+1)*w).  Groups of 8 elements fill exactly w bytes, so value j
of a group starts at bit j*w, i.e. byte (j*w)//8, offset (j*w)%8, and spans at most 3 bytes (w <= 16):
each of the 8 positions is a few whole-tensor shifts and masks."""

from __future__ import annotations

import numpy as np

from mucsc.codec.backends import torch_transfer
from mucsc.codec.backends.tensors import CHUNK, torch_module

# ---- bit packing (bitpack.pack / unpack on the device) -------------------------------------------
# Element i occupies stream bits [i*w, (i+1)*w), LSB-first (FORMAT.md 4.2).  Groups of 8 elements fill
# exactly w bytes, so value j of a group starts at bit j*w, i.e. byte (j*w)//8, offset (j*w)%8, and
# spans at most 3 bytes (w <= 16): each of the 8 positions is a few whole-tensor shifts and masks.

def pack(ids, width: int) -> torch_transfer.DeviceBytes:
    """LSB-first packing of ``ids`` (int tensor, values < 2**width) into FORMAT.md's IDS_ bytes, as
    a payload left on the ids' device (the writer copies only the packed bytes to the host)."""
    return torch_transfer.DeviceBytes(pack_tensor(ids, width))


def pack_tensor(ids, width: int):
    """:func:`pack`'s bytes as a uint8 tensor on the ids' device."""
    torch = torch_module()
    n = ids.numel()
    if width == 0 or n == 0:
        return torch.zeros(0, dtype=torch.uint8, device=ids.device)
    if width == 8:
        return ids.to(torch.uint8)
    if 8 % width == 0:  # 1, 2 or 4 bits: each byte holds 8 / width whole ids, id j at bit j * width
        return pack_words(ids, width).to(torch.uint8)
    parts = []
    for s in range(0, n, CHUNK):  # CHUNK is a multiple of 8: chunks fill whole bytes
        v = ids[s:s + CHUNK].to(torch.int32)
        m = v.numel()
        if m % 8:
            v = torch.cat((v, torch.zeros((-m) % 8, dtype=torch.int32, device=v.device)))
        g = v.reshape(-1, 8)
        acc = torch.zeros((g.shape[0], width + 2), dtype=torch.int32, device=v.device)
        for j in range(8):
            b, o = divmod(j * width, 8)
            sh = g[:, j] << o
            acc[:, b] |= sh & 0xFF
            acc[:, b + 1] |= (sh >> 8) & 0xFF
            acc[:, b + 2] |= sh >> 16
        parts.append(acc[:, :width].to(torch.uint8).reshape(-1)[: (m * width + 7) // 8])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def pack_words(ids, width: int):
    """The IDS_ bytes of ids packed ``width`` = 1, 2 or 4 bits wide, as int64 values (one per byte):
    the ids viewed 8 / width to a row, shifted to their bit offsets and summed (disjoint bits: the
    sum is the OR), three ops; ``pack_tensor`` narrows them to bytes, the lane coder counts them first."""
    torch = torch_module()
    per, n = 8 // width, ids.numel()
    if n % per:  # the last byte's high ids are zero bits
        ids = torch.cat((ids, torch.zeros((-n) % per, dtype=ids.dtype, device=ids.device)))
    return (ids.reshape(-1, per) << bit_offsets(ids.device, width)).sum(1)


_offsets: dict = {}


def bit_offsets(dev, width: int):
    """[0, width, 2 width, ...] below 8 as an int64 tensor on ``dev`` (made once per device)."""
    torch = torch_module()
    t = _offsets.get((dev, width))
    if t is None:
        t = _offsets[(dev, width)] = torch.arange(0, 8, width, dtype=torch.int64, device=dev)
    return t


def unpack(buf, width: int, n: int, device):
    """Inverse of :func:`pack` on ``device``: ``n`` ids as int64.  The caller has checked the
    length and padding (``bitpack.check_packed``)."""
    torch = torch_module()
    if width == 0 or n == 0:
        return torch.zeros(n, dtype=torch.int64, device=device)
    b = torch_transfer.to_device(buf, device)
    if width == 8:
        return b.to(torch.int64)
    mask = (1 << width) - 1
    if 8 % width == 0:  # whole ids per byte (see pack)
        per = 8 // width
        vals = torch.empty((b.numel(), per), dtype=torch.int64, device=device)
        for j in range(per):
            vals[:, j] = (b >> (j * width)) & mask
        return vals.reshape(-1)[:n]
    out = torch.empty(n, dtype=torch.int64, device=device)
    for s in range(0, n, CHUNK):
        m = min(CHUNK, n - s)
        groups = (m + 7) // 8
        lo = s * width // 8
        chunk = b[lo:lo + groups * width]  # the last group's bytes may be cut short: zero-fill
        flat = torch.zeros(groups * width, dtype=torch.int32, device=device)
        flat[: chunk.numel()] = chunk
        g = torch.zeros((groups, width + 2), dtype=torch.int32, device=device)  # 2 spare columns
        g[:, :width] = flat.reshape(groups, width)
        vals = torch.empty((groups, 8), dtype=torch.int64, device=device)
        for j in range(8):
            bi, o = divmod(j * width, 8)
            word = g[:, bi] | (g[:, bi + 1] << 8) | (g[:, bi + 2] << 16)
            vals[:, j] = (word >> o) & mask
        out[s:s + m] = vals.reshape(-1)[:m]
    return out


def gather(values: np.ndarray, ids):
    """values[ids] on the ids' device (the decoder's lookup of FORMAT.md 4.2)."""
    torch = torch_module()
    return torch.from_numpy(np.ascontiguousarray(values)).to(ids.device)[ids]


def unpack_bits(b, n: int):
    """The first ``n`` LSB-first bits of the uint8 tensor ``b`` as a bool tensor on its device (the
    caller has checked the length and padding)."""
    torch = torch_module()
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device)
    return ((b.unsqueeze(1) >> shifts) & 1).reshape(-1)[:n].bool()
