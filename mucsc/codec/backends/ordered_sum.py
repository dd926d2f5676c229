"""The step "a float64 sum that reaches the wire" (signSGD's and STC's scales, B-MUCSC's mean):
``np.sum(x, dtype=np.float64)`` bit for bit, whatever holds x.

``Host`` is numpy's own sum; ``Torch`` is numpy itself over a view for a CPU tensor, and numpy's
pairwise order rebuilt on the device elsewhere (:func:`pairwise_sum64`).  torch is imported only when
the torch form runs."""

from __future__ import annotations

from typing import Any

import numpy as np

from mucsc.codec.backends.tensors import CHUNK, torch_module


class Host:
    @staticmethod
    def sum64(x: np.ndarray) -> float:
        """``np.sum(x, dtype=np.float64)`` as a Python float."""
        return float(x.sum(dtype=np.float64))


class Torch:
    @staticmethod
    def sum64(x: Any) -> float:
        return sum64_like_numpy(x)


def host_sums(x) -> bool:
    """Whether float64 sums that reach the wire (B-MUCSC's mean, signSGD's and STC's scales) are
    taken by numpy itself: for CPU tensors, where the host sees the data without a copy (elsewhere
    :func:`pairwise_sum64` rebuilds numpy's order on the device)."""
    return x.device.type == "cpu"


# ---- float64 sums in numpy's order ------------------------------------------------------------------
# A value on the wire that is a float64 sum (signSGD's and STC's scales) is only byte-identical if it is
# summed in the order numpy sums it.  ``np.sum(a, dtype=np.float64)`` runs numpy's pairwise_sum over
# the whole vector for float64 data and adds it to +0.0; for float32 data it runs it over buffers of
# ``np.getbufsize()`` elements (cast to float64) and adds the buffer sums one after another to +0.0.  pairwise_sum(n):
# n < 8: a sequential sum from +0.0; n <= 128: eight accumulators r[j] = a[j] + a[8+j] + ... over
# the whole octets, ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), then the n % 8 rest added in order; else
# pairwise(n2) + pairwise(n - n2) with n2 = n/2 rounded down to a multiple of 8.  The recursion is
# rebuilt below as a fixed tree of torch additions (padding adds -0.0, the exact identity of IEEE
# addition: x + -0.0 == x for every x, signed zeros included).

PW_BLOCK = 128  # numpy's PW_BLOCKSIZE


def _pairwise_tree(n: int):
    """numpy's pairwise_sum recursion for n >= 8 elements: the leaves (start, length) in index order,
    and per level, top-down, each node's leaf number (-1 for a node that adds its two children, which
    are the next level's nodes 2i and 2i+1 for the i-th such node)."""
    starts, lens = np.zeros(1, np.int64), np.array([n], np.int64)
    levels, leaf_starts, leaf_lens = [], [], []
    count = 0
    while starts.size:
        leaf = lens <= PW_BLOCK
        num = np.full(starts.size, -1, np.int64)
        num[leaf] = count + np.arange(int(leaf.sum()))
        count += int(leaf.sum())
        levels.append(num)
        leaf_starts.append(starts[leaf])
        leaf_lens.append(lens[leaf])
        s, m = starts[~leaf], lens[~leaf]
        n2 = m // 2
        n2 -= n2 % 8
        starts = np.stack((s, s + n2), axis=1).reshape(-1)
        lens = np.stack((n2, m - n2), axis=1).reshape(-1)
    st, ln = np.concatenate(leaf_starts), np.concatenate(leaf_lens)
    order = np.argsort(st, kind="stable")  # leaf numbers follow the levels; values are needed per level
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return st[order], ln[order], [np.where(v >= 0, rank[np.maximum(v, 0)], -1) for v in levels]


def _leaf_sums(rows, starts: np.ndarray, lens: np.ndarray):
    """pairwise_sum's block sums (8 accumulators, then the rest) of the leaves (start, length) of
    each row of ``rows`` (m x L float64 tensor; every start a multiple of 8): an m x leaves tensor."""
    torch = torch_module()
    m, L = rows.shape
    dev = rows.device
    out = torch.empty((m, starts.size), dtype=torch.float64, device=dev)
    per = max(1, CHUNK // max(m * PW_BLOCK, 1))  # leaves per batch: bounds the padded copy
    for b0 in range(0, starts.size, per):
        st, ln = starts[b0:b0 + per], lens[b0:b0 + per]
        e0, e1 = int(st[0]), int(st[-1] + ln[-1])
        width = -(-(e1 - e0) // 8) * 8 + 8  # whole octets, then one octet of -0.0 to point padding at
        pad = torch.full((m, width), -0.0, dtype=torch.float64, device=dev)
        pad[:, : e1 - e0] = rows[:, e0:e1]
        octets = pad.view(m, width // 8, 8)
        first = torch.from_numpy((st - e0) // 8).to(dev)
        whole = torch.from_numpy(ln // 8).to(dev)
        blank = width // 8 - 1
        acc = octets[:, first, :]
        for g in range(1, int((ln // 8).max())):
            acc = acc + octets[:, torch.where(whole > g, first + g, blank), :]
        res = (acc[..., 0] + acc[..., 1] + (acc[..., 2] + acc[..., 3])) \
            + (acc[..., 4] + acc[..., 5] + (acc[..., 6] + acc[..., 7]))
        rest = ln % 8
        if rest.any():
            tail = torch.from_numpy(st - e0 + ln - rest).to(dev)
            rest_t = torch.from_numpy(rest).to(dev)
            for j in range(int(rest.max())):
                res = res + pad[:, torch.where(rest_t > j, tail + j, width - 1)]
        out[:, b0:b0 + per] = res
    return out


def _balanced_rows(rows):
    """:func:`_pairwise_rows` for L = 128 * 2^j (numpy's full float32 buffers): every split halves
    exactly, so the leaves are the 128-element blocks and the tree adds neighbours level by level."""
    m, L = rows.shape
    blocks = rows.reshape(m, L // PW_BLOCK, PW_BLOCK // 8, 8)
    acc = blocks[:, :, 0, :]
    for g in range(1, PW_BLOCK // 8):
        acc = acc + blocks[:, :, g, :]
    vals = (acc[..., 0] + acc[..., 1] + (acc[..., 2] + acc[..., 3])) \
        + (acc[..., 4] + acc[..., 5] + (acc[..., 6] + acc[..., 7]))
    while vals.shape[1] > 1:
        pairs = vals.reshape(m, -1, 2)
        vals = pairs[..., 0] + pairs[..., 1]
    return vals[:, 0]


def _pairwise_rows(rows):
    """numpy's pairwise_sum of each row of ``rows`` (m x L float64 tensor): an m float64 tensor."""
    torch = torch_module()
    m, L = rows.shape
    if L >= PW_BLOCK and L % PW_BLOCK == 0 and (L // PW_BLOCK) & (L // PW_BLOCK - 1) == 0:
        return _balanced_rows(rows)
    if L < 8:  # a sequential sum from +0.0
        res = torch.zeros(m, dtype=torch.float64, device=rows.device)
        for j in range(L):
            res = res + rows[:, j]
        return res
    starts, lens, levels = _pairwise_tree(L)
    leaves = _leaf_sums(rows, starts, lens)
    vals = None
    for num in reversed(levels):
        cur = torch.empty((m, num.size), dtype=torch.float64, device=rows.device)
        is_leaf = num >= 0
        at = torch.from_numpy(np.flatnonzero(is_leaf)).to(rows.device)
        cur[:, at] = leaves[:, torch.from_numpy(num[is_leaf]).to(rows.device)]
        if vals is not None:
            cur[:, torch.from_numpy(np.flatnonzero(~is_leaf)).to(rows.device)] = vals[:, 0::2] + vals[:, 1::2]
        vals = cur
    return vals[:, 0]


def pairwise_sum64(x) -> float:
    """``np.sum(x, dtype=np.float64)`` of a 1-D float32/float64 tensor, bit for bit, computed on its
    device in numpy's order (see above); only the per-buffer sums of float32 data reach the host."""
    torch = torch_module()
    n = x.numel()
    if x.dtype == torch.float64:
        return 0.0 + float(_pairwise_rows(x.reshape(1, n))[0]) if n else 0.0  # the reduction starts at +0.0
    buf = int(np.getbufsize())
    sums = []
    full = n // buf
    rows_per = max(1, (4 * CHUNK) // buf)  # 16M elements a batch: 128 MiB of float64 rows
    for r0 in range(0, full, rows_per):
        r1 = min(full, r0 + rows_per)
        sums.append(_pairwise_rows(x[r0 * buf:r1 * buf].to(torch.float64).reshape(r1 - r0, buf)))
    if n > full * buf:
        sums.append(_pairwise_rows(x[full * buf:].to(torch.float64).reshape(1, -1)))
    acc = 0.0
    for v in (torch.cat(sums).cpu().numpy().tolist() if sums else []):
        acc += v  # the buffers one after another, as numpy's reduction loop adds them
    return acc


def sum64_like_numpy(x) -> float:
    """``np.sum(host copy of x, dtype=np.float64)`` exactly: numpy itself on a CPU tensor (a view, no
    copy), :func:`pairwise_sum64` elsewhere."""
    if host_sums(x):
        return float(x.numpy().sum(dtype=np.float64))
    return pairwise_sum64(x)
