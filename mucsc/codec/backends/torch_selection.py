"""The step "which elements are kept" (the top-k family), torch form: the k largest magnitudes on the
tensor's device (a radix select, or one top-k with the positions and values brought over in one
copy), exactly ``sparse.top_k``'s set when it has no tie to break; the decoders' scatter.  torch is
imported only when it runs."""

from __future__ import annotations

import numpy as np

from mucsc.codec.backends import torch_summary, torch_transfer
from mucsc.codec.backends.tensors import torch_module

# ---- B-MUCSC's selection ----------------------------------------------------------------------------

RADIX_BITS = 11  # bits per pass of the k-th magnitude select: 2048 counters per histogram
_BITS = {2: "int16", 4: "int32", 8: "int64"}  # itemsize -> the integer type that views |x|'s bits


def kth_largest_abs(a, k: int) -> tuple[float, int, int]:
    """(t, m, need) for non-negative finite ``a`` and 1 <= k <= n: t the k-th largest value of a,
    m how many elements equal t, need how many of those the top k take (need <= m).

    A radix select on the bit patterns (for non-negative IEEE floats their order is the integers'):
    a histogram of the top RADIX_BITS bits picks the digit holding the k-th largest, the elements
    with that digit are kept, and the next bits are counted among them.  Each pass is a bincount and
    a compaction, so the work is a few streaming passes; ``torch.topk`` with a large k on one huge
    slice is a sort-like multi-pass select.  Exact: t is a value of a, whatever the distribution."""
    torch = torch_module()
    itype = getattr(torch, _BITS[a.element_size()])
    cand = a.reshape(-1).view(itype)
    need, prefix = k, 0
    shift = 8 * a.element_size() - 1  # value bits below the (clear) sign bit
    while shift > 0:
        width = min(RADIX_BITS, shift)
        shift -= width
        digit = (cand >> shift) & ((1 << width) - 1)
        counts = torch.bincount(digit.to(torch.int64) if itype == torch.int16 else digit,
                                minlength=1 << width).cpu().numpy()
        above = np.cumsum(counts[::-1])[::-1]  # above[v]: elements with a digit >= v
        v = int(np.flatnonzero(above >= need)[-1])  # the largest digit whose ">= v" count reaches need
        need -= int(above[v] - counts[v])
        prefix = (prefix << width) | v
        cand = cand[digit == v]
    t = float(torch.tensor(prefix, dtype=torch.int64).to(itype).view(a.dtype))
    return t, int(cand.numel()), need


def top_k_positions(x, k: int) -> np.ndarray | None:
    """``sparse.top_k(x, k)`` computed on x's device: sorted positions (host int64) of the k elements
    of largest |x| (all the non-zeros when k >= n or when x has fewer than k: top_k never sends a
    zero), when that set is unique; None when elements tied at the k-th magnitude make it a choice
    (the host's ``sparse.top_k`` decides)."""
    torch = torch_module()
    n = x.numel()
    if k >= n:
        return torch.nonzero(x).reshape(-1).cpu().numpy().astype(np.int64)
    if k == 0:
        return np.zeros(0, np.int64)
    a = x.abs()
    t, tied, need = kth_largest_abs(a, k)
    if t == 0.0:  # fewer than k non-zeros: all of them, as the host sends
        return torch.nonzero(a).reshape(-1).cpu().numpy().astype(np.int64)
    if tied != need:
        return None
    return torch.nonzero(a >= t).reshape(-1).cpu().numpy().astype(np.int64)


def select_top_k(x, k: int):
    """B-MUCSC's selection on x's device in one copy to the host: (sorted positions as host int64,
    the kept values on the device, the same values on the host) of the k elements of largest |x|,
    when that set is ``sparse.top_k``'s without a choice -- 0 < k < n, the k-th magnitude above the
    (k+1)-th (no tie to break) and above 0 (k non-zeros at least); None otherwise (the caller's exact
    path decides, as :func:`top_k_positions` does).  One top-k of |x| (k + 1 values, sorted), the
    positions sorted, the values gathered; the two magnitudes that decide uniqueness come over in the
    same copy as the positions and values (float64 carries all of them exactly)."""
    torch = torch_module()
    n = x.numel()
    if not 0 < k < n:
        return None
    top = x.abs().topk(k + 1)
    pos = top.indices[:k].sort().values
    kept = x[pos]
    f64 = torch.float64
    got = torch_transfer.fetch(torch.cat((top.values[k - 1:].to(f64), pos.to(f64), kept.to(f64))))
    if got[0] == 0 or got[0] == got[1]:
        return None
    return got[2:2 + k].astype(np.int64), kept, got[2 + k:].astype(torch_summary.TorchSource(kept).dtype)


def scatter(n: int, pos: np.ndarray, vals: np.ndarray, dtype: np.dtype, device):
    """A length-``n`` tensor of ``dtype`` on ``device``: zeros, ``vals`` at the host positions ``pos``
    (the decoders of the top-k family; only the k positions and values are copied over)."""
    torch = torch_module()
    out = torch.zeros(n, dtype=getattr(torch, np.dtype(dtype).name), device=device)
    if pos.size:
        out[torch.from_numpy(np.ascontiguousarray(pos, np.int64)).to(device)] = \
            torch.from_numpy(np.array(vals)).to(device=device, dtype=out.dtype)  # a writable copy
    return out


def rest_sq_bias(x, pos: np.ndarray, mean: float) -> float:
    """sum over the elements not at ``pos`` of (x - mean)^2, in float64 (B-MUCSC's bias term)."""
    torch = torch_module()
    rest = torch.ones(x.numel(), dtype=torch.bool, device=x.device)
    rest[torch.from_numpy(pos).to(x.device)] = False
    return float(((x[rest].to(torch.float64) - mean) ** 2).sum())
