"""The step "the random stream" (spec/FORMAT.md 4.3): SplitMix64's outputs and the uniforms eq. 7 draws
from them.  The host form is :func:`mucsc.codec.kernels.splitmix64` (the compiled kernel or numpy, as
:mod:`mucsc.codec.kernels` chose); the Triton form is inlined in the fused kernel
(:mod:`mucsc.codec.backends._triton_kernel`); this module is the torch form: the counter stream in int64
arithmetic (two's-complement wrap-around is arithmetic mod 2^64; a logical right shift is an
arithmetic shift with the sign-extended bits masked off).  torch is imported only when it runs."""

from __future__ import annotations

import sys

from mucsc.codec import kernels
from mucsc.codec.backends.tensors import torch_module

GAMMA = kernels.GAMMA
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def i64(v: int) -> int:
    """An unsigned 64-bit value as the int64 with the same bits."""
    v &= kernels.MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


def srl(z, s: int):
    """Logical right shift of int64 bit patterns by ``s`` (1..63)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def splitmix64(key: int, start: int, count: int, device):
    """Outputs start+1 .. start+count of SplitMix64 with state ``key`` as int64 bit patterns
    (``kernels.splitmix64``'s numbers, on ``device``).  In place: the counters and one temporary."""
    return _rounds(_counters(key, start, count, device))


GAMMA_INV = pow(GAMMA, -1, 1 << 64)  # GAMMA is odd: invertible mod 2^64


def _counters(key: int, start: int, count: int, device):
    """key + (start + 1 + j) * GAMMA for j < count (mod 2^64, int64 bit patterns) in two ops: the
    range (j + c) * GAMMA with c = start + 1 + key * GAMMA^-1; three (a range, a multiply, an add)
    in the rare case where c + count would pass the int64 range."""
    torch = torch_module()
    c = i64(start + 1 + key * GAMMA_INV)
    if c <= (1 << 63) - 1 - count:
        z = torch.arange(c, c + count, dtype=torch.int64, device=device)
        if z.numel() == count:
            return z.mul_(i64(GAMMA))
    z = torch.arange(start + 1, start + count + 1, dtype=torch.int64, device=device)
    return z.mul_(i64(GAMMA)).add_(i64(key))


def _rounds(z):
    """SplitMix64's finaliser of FORMAT.md 4.3 on the int64 words ``z`` (overwritten: returned)."""
    for shift, mult in ((30, _M1), (27, _M2), (31, None)):
        t = z >> shift
        z ^= t.bitwise_and_((1 << (64 - shift)) - 1)  # logical shift: drop the sign copies
        if mult is not None:
            z.mul_(i64(mult))
    return z


def _mix(z, key: int):
    """mix(key + z * GAMMA) of FORMAT.md 4.3 for the int64 counters ``z`` (overwritten: returned)."""
    return _rounds(z.mul_(i64(GAMMA)).add_(i64(key)))


UNIFORM_BITS = {True: 24, False: 53}  # float32 / float64 work: a uniform is an integer m times 2^-bits


def uniform_ints(key: int, start: int, n: int, float32: bool, device):
    """The integers m of the uniforms m * 2^-UNIFORM_BITS of elements start .. start+n-1 (FORMAT.md
    4.3; ``start`` even for float32 work).  float32: bits 8..31 and 40..63 of each word are the
    int32 halves of the word (little-endian) shifted by 8 and masked: one view, two ops."""
    torch = torch_module()
    if not float32:
        return srl(splitmix64(key, start, n, device), 11)
    words = (n + 1) // 2
    w = splitmix64(key, start // 2, words, device)
    if sys.byteorder == "little":
        m = (w.view(torch.int32) >> 8).bitwise_and_(0xFFFFFF)
        return m if m.numel() == n else m[:n]
    return torch.stack((srl(w, 8) & 0xFFFFFF, srl(w, 40)), dim=1).reshape(-1)[:n]


def uniforms(key: int, start: int, n: int, float32: bool, device):
    """Uniforms of elements start .. start+n-1 (FORMAT.md 4.3; ``start`` even for float32 work)."""
    torch = torch_module()
    m = uniform_ints(key, start, n, float32, device)
    return m.to(torch.float32 if float32 else torch.float64) * 2.0 ** -UNIFORM_BITS[float32]


def uniforms_at(key: int, idx, float32: bool):
    """Uniforms of the elements at positions ``idx`` (an int64 tensor): :func:`uniforms`' values there."""
    torch = torch_module()
    if not float32:
        return srl(_mix(idx + 1, key), 11).to(torch.float64) * 2.0**-53
    w = _mix((idx >> 1) + 1, key)
    return torch.where((idx & 1) == 0, srl(w, 8) & 0xFFFFFF, srl(w, 40)).to(torch.float32) * 2.0**-24
