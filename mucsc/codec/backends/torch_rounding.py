"""The step "eq. 7's rounding", torch form (spec/FORMAT.md 4.3), byte-identical to
:func:`mucsc.codec.numerics.quantize.stochastic_round`: k = the number of interior centroids <= x
(``searchsorted(right=True)``), then ``u * (c[k+1] - c[k]) < x - c[k]`` with each operation a separate
kernel in the working precision, so no fused multiply-add can change a decision.  The fused Triton
form is :mod:`mucsc.codec.backends.triton_round`; the lazy choice between them is
:mod:`mucsc.codec.backends.device_rounding`.  torch is imported only when it runs."""

from __future__ import annotations

import numpy as np

from mucsc.codec.backends import random_stream, torch_transfer
from mucsc.codec.backends.tensors import CHUNK, torch_module

def work_float32(x, c: np.ndarray) -> bool:
    """float32 arithmetic exactly when the reference uses it (``quantize._work_dtype``)."""
    torch = torch_module()
    return x.dtype == torch.float32 and np.array_equal(c.astype(np.float32).astype(c.dtype), c)


def round_supported(x, c: np.ndarray) -> bool:
    """Whether every level gap c[k+1] - c[k] is finite in the working precision (a float32 range
    wider than FLT_MAX is not: the host path's rule covers it)."""
    f32 = work_float32(x, c)
    with np.errstate(over="ignore"):
        return bool(np.all(np.isfinite(np.diff(c.astype(np.float32 if f32 else np.float64)))))


def stochastic_round(x, c: np.ndarray, key: int, *, return_J: bool = False):
    """Cluster ids (on x's device: uint8 for <= 256 levels, else int32) of eq. 7 against wire
    centroids ``c`` (host, sorted, bracketing x), identical to ``quantize.stochastic_round`` given
    the same key; and J (float64) of
    eq. 8-9 when ``return_J``.  Every level gap must be finite in the working precision (the
    caller checks :func:`round_supported` first and otherwise uses the reference path)."""
    torch = torch_module()
    n = x.numel()
    if c.size == 1 or n == 0:
        return torch.zeros(n, dtype=torch.uint8, device=x.device), (0.0 if return_J else None)
    narrow = torch.uint8 if c.size <= 256 else torch.int32
    if not return_J:
        return round_ids(x, c, key).to(narrow), None
    f32 = work_float32(x, c)
    dev = x.device
    levels = Levels(c, f32, dev)
    c64 = torch.from_numpy(c.astype(np.float64)).to(dev)
    # narrow ids (1 byte for Z <= 256): the packing reads them back, so this is memory traffic saved twice
    ids = torch.empty(n, dtype=narrow, device=dev)
    J = torch.zeros((), dtype=torch.float64, device=dev)
    for s in range(0, n, CHUNK):
        xw = x[s:s + CHUNK].to(levels.dtype)
        k = levels.bracket(xw)
        ids[s:s + CHUNK] = k + levels.up(xw, k, key, s)
        x64 = x[s:s + CHUNK].to(torch.float64)
        J += ((c64[k + 1] - x64) * (x64 - c64[k])).sum()
    return ids, float(J)


def round_ids(x, c: np.ndarray, key: int):
    """:func:`stochastic_round`'s ids as int64 (c has >= 2 levels): for x of at most CHUNK
    elements ~25 tensor ops in all, the ids left as searchsorted made them (no narrowing copy)."""
    torch = torch_module()
    n = x.numel()
    levels = Levels(c, work_float32(x, c), x.device)
    if n <= CHUNK:
        return levels.round(x, key, 0)
    ids = torch.empty(n, dtype=torch.int64, device=x.device)
    for s in range(0, n, CHUNK):
        ids[s:s + CHUNK] = levels.round(x[s:s + CHUNK], key, s)
    return ids


class Levels:
    """Wire centroids ``c`` on ``dev`` in the working precision of FORMAT.md 4.3: the interior levels
    (searched), the levels and their gaps c[k+1] - c[k] (taken after the cast, as the reference takes
    them), each copied over once."""

    def __init__(self, c: np.ndarray, f32: bool, dev):
        torch = torch_module()
        self.f32 = f32
        cw = c.astype(np.float32 if f32 else np.float64)
        gw = np.diff(cw)
        bits = random_stream.UNIFORM_BITS[f32]
        # u * g = (m * 2^-bits) * g is m * (g * 2^-bits) exactly (one rounding of the same product)
        # while g * 2^-bits stays a normal number: then the scaling is folded into the gaps
        self.scaled = bool(gw.min() * 2.0 ** -bits >= np.finfo(cw.dtype).tiny)
        if self.scaled:
            gw = gw * cw.dtype.type(2.0 ** -bits)
        self.interior = torch_transfer.to_dev(cw[1:-1].copy(), dev)
        # (c[k], gap k) side by side: one copy over, one gather per element for both
        self.table = torch_transfer.to_dev(np.stack((cw[:-1], gw), axis=1), dev)
        self.dtype = self.table.dtype

    def round(self, x, key: int, start: int):
        """Eq. 7's ids (int64) of the elements start .. of ``x`` (a slice of the vector)."""
        xw = x.to(self.dtype)
        k = self.bracket(xw)
        return k.add_(self.up(xw, k, key, start))

    def bracket(self, xw):
        """k: the number of interior levels <= x (x in the working precision)."""
        return torch_module().searchsorted(self.interior, xw, right=True)

    def up(self, xw, k, key: int, start: int):
        """Where u * (c[k+1] - c[k]) < x - c[k] (FORMAT.md 4.3): each arithmetic step a separate op in
        the working precision, so no fused multiply-add can change a decision."""
        u = random_stream.uniform_ints(key, start, xw.numel(), self.f32, xw.device).to(self.dtype)
        if not self.scaled:
            u.mul_(2.0 ** -random_stream.UNIFORM_BITS[self.f32])
        ck, gk = self.table[k].unbind(1)
        return u.mul_(gk) < (xw - ck)


def working_levels(c: np.ndarray, f32: bool, dev):
    """(c, c[k+1] - c[k]) in the working precision of FORMAT.md 4.3, on ``dev``: the gaps are taken
    after the cast, as the reference takes them."""
    torch = torch_module()
    cw = c.astype(np.float32 if f32 else np.float64)
    return torch.from_numpy(cw).to(dev), torch.from_numpy(np.diff(cw)).to(dev)


def _up(xw, k, u, cw, gw):
    """Eq. 7's decision u * (c[k+1] - c[k]) < x - c[k] (FORMAT.md 4.3): one tensor operation per
    arithmetic step, so each is rounded once in the working precision and none is fused."""
    d = xw - cw[k]
    return u * gw[k] < d


def round_at(x, c: np.ndarray, key: int, idx):
    """The ids (int64) that :func:`stochastic_round` gives the elements at positions ``idx`` (an
    int64 tensor on x's device), computed for those elements only."""
    f32 = work_float32(x, c)
    cw, gw = working_levels(c, f32, x.device)
    xw = x[idx].to(cw.dtype)
    k = torch_module().searchsorted(cw[1:-1].contiguous(), xw, right=True)
    return k + _up(xw, k, random_stream.uniforms_at(key, idx, f32), cw, gw)


def variance_J(x, c: np.ndarray) -> float:
    """J of eq. 8-9 for wire centroids ``c`` (float64, on x's device): the same sum the rounding pass
    accumulates with ``return_J``, as a separate pass for callers that need J only sometimes."""
    torch = torch_module()
    n = x.numel()
    if c.size == 1 or n == 0:
        return 0.0
    dev = x.device
    c64 = torch.from_numpy(c.astype(np.float64)).to(dev)
    interior = torch.from_numpy(c[1:-1].astype(np.float64)).to(dev)
    J = torch.zeros((), dtype=torch.float64, device=dev)
    for s in range(0, n, CHUNK):
        x64 = x[s:s + CHUNK].to(torch.float64)
        k = torch.clamp(torch.searchsorted(interior, x64, right=True), max=c.size - 2)
        J += ((c64[k + 1] - x64) * (x64 - c64[k])).sum()
    return float(J)
