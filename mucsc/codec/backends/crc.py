"""The step "CRC-32 of a section" on a torch device: zlib's CRC-32 of a tensor's bytes computed where
they are, only the 4-byte register crossing to the host (the host form is zlib's, taken by
:func:`mucsc.codec.parallel.copy_crc32` as the writer copies).  torch is imported only when it runs."""

from __future__ import annotations

import functools

import numpy as np

from mucsc.codec import parallel
from mucsc.codec.backends.tensors import torch_module

# ---- CRC-32 on the device ---------------------------------------------------------------------------
# zlib's CRC-32 (reflected, polynomial 0xEDB88320) is affine over GF(2): crc32(m) = crc32(0^L) ^ R(m),
# with 0^L the L zero bytes and R(m) the register after m from state 0 without the inversions (R is
# linear in m's bits).  R of a block of B bytes is an XOR of one table entry per byte,
# T_j[b] = R(byte b followed by B-1-j zero bytes); R of consecutive spans joins as
# R(A B) = shift(R(A), len B) ^ R(B), where shift (the register run over len B zero bytes) is linear in
# R(A)'s 32 bits: an XOR of 4 byte-table entries.  So the blocks' registers are one gather per byte
# and an XOR-halving tree, then a binary tree joins the blocks (zero blocks in front change nothing:
# R(0^k m) = R(m)), and only the final register leaves the device.  Temporaries are int32, a few per
# byte of one batch: memory is bounded by CRC_BATCH, never a bit per byte of the data.

CRC_BLOCK = 64  # bytes per block: a 64 x 256 int32 position table (64 KiB) stays in cache
CRC_BATCH = 1 << 24  # bytes of data per batch of blocks (~10 bytes of int32 temporaries per byte)
_crc_tables: dict = {}  # (device, what) -> table tensor


@functools.lru_cache(maxsize=1)
def _byte_table() -> np.ndarray:
    """R(b) of each single byte b: zlib's table (uint32)."""
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> 1) ^ np.uint32(0xEDB88320), t >> 1).astype(np.uint32)
    return t


@functools.lru_cache(maxsize=4)
def _position_table(block: int) -> np.ndarray:
    """T_j[b] for j < ``block`` as int32 bit patterns, flat: entry j * 256 + b."""
    t = _byte_table()
    rows = [t]
    for _ in range(block - 1):  # one zero byte more after b: the register's step with byte 0
        rows.append((rows[-1] >> 8) ^ t[rows[-1] & 0xFF])
    return np.stack(rows[::-1]).reshape(-1).view(np.int32)


@functools.lru_cache(maxsize=64)
def _shift_table(n: int) -> np.ndarray:
    """shift(v, n) = XOR over v's bytes i of entry i * 256 + byte i (int32 bit patterns, flat)."""
    basis = np.array([parallel.crc32_shift(1 << k, n) for k in range(32)], np.uint32).reshape(4, 8)
    bits = ((np.arange(256)[:, None] >> np.arange(8)) & 1).astype(bool)  # byte value x bit
    table = np.bitwise_xor.reduce(np.where(bits[None], basis[:, None, :], np.uint32(0)), axis=2)
    return table.reshape(-1).view(np.int32)


def _device_table(dev, key, make):
    """``make()`` (a numpy table) on ``dev``, copied there once."""
    torch = torch_module()
    t = _crc_tables.get((dev, key))
    if t is None:
        t = _crc_tables[(dev, key)] = torch.from_numpy(make()).to(dev)
    return t


def _block_registers(blocks, table, offsets):
    """R of each row of ``blocks`` (k x CRC_BLOCK uint8) as int32: one table entry per byte, XORed
    by halving the row."""
    vals = table.index_select(0, offsets.add(blocks).reshape(-1)).reshape(blocks.shape)
    while vals.shape[1] > 1:
        h = vals.shape[1] // 2
        vals = vals[:, :h] ^ vals[:, h:]
    return vals[:, 0]


def crc32_register(t):
    """R(the bytes of the uint8 tensor ``t``) as a 0-d int32 tensor on its device (the work is
    queued; reading it waits for it).  :func:`crc32_finish` makes zlib's CRC-32 of it."""
    torch = torch_module()
    dev, n, B = t.device, t.numel(), CRC_BLOCK
    head, full = n % B, n // B
    count = full + (head > 0)
    if count == 0:
        return torch.zeros((), dtype=torch.int32, device=dev)
    table = _device_table(dev, ("position", B), lambda: _position_table(B))
    offsets = torch.arange(0, 256 * B, 256, dtype=torch.int32, device=dev)
    regs = torch.zeros(1 << (count - 1).bit_length(), dtype=torch.int32, device=dev)  # a power of 2
    first = regs.numel() - full
    if head:  # the first, short block, with zero bytes in front
        block = torch.cat((torch.zeros(B - head, dtype=torch.uint8, device=dev), t[:head])).reshape(1, B)
        regs[first - 1] = _block_registers(block, table, offsets)[0]
    per = max(1, CRC_BATCH // B)
    for s in range(0, full, per):
        e = min(s + per, full)
        regs[first + s: first + e] = _block_registers(t[head + s * B: head + e * B].reshape(-1, B), table,
                                                      offsets)
    span, byte_offsets = B, torch.arange(0, 1024, 256, dtype=torch.int32, device=dev)
    while regs.numel() > 1:  # pairs (A, B) of spans of ``span`` bytes: shift(R(A), span) ^ R(B)
        shift = _device_table(dev, ("shift", span), lambda: _shift_table(span))
        left = regs.view(torch.uint8).reshape(-1, 8)[:, :4]  # little-endian bytes of each pair's first
        parts = shift.index_select(0, byte_offsets.add(left).reshape(-1)).reshape(-1, 4)
        regs = (parts[:, 0] ^ parts[:, 1]) ^ (parts[:, 2] ^ parts[:, 3]) ^ regs.reshape(-1, 2)[:, 1]
        span *= 2
    return regs[0]


def crc32_finish(register: int, n: int, crc: int = 0) -> int:
    """zlib's CRC-32 of ``n`` bytes whose register R is ``register``, continued from ``crc`` (the
    CRC of what came before, as ``zlib.crc32(data, crc)``)."""
    own = 0xFFFFFFFF ^ parallel.crc32_shift(0xFFFFFFFF, n) ^ (register & 0xFFFFFFFF)
    return parallel.crc32_combine(crc, own, n)


def crc32(t, crc: int = 0) -> int:
    """``zlib.crc32`` of a tensor's raw bytes, continued from ``crc``, computed on its device: only the
    4-byte register crosses to the host."""
    torch = torch_module()
    b = t.contiguous().reshape(-1).view(torch.uint8)
    return crc32_finish(int(crc32_register(b)), b.numel(), crc)
