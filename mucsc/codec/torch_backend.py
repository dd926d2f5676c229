"""The torch backend: MUCSC's encoder steps on torch tensors, byte-identical to the reference.

Used for tensors on a non-CPU device (a CUDA update is encoded where it lives: only the solver's small
summary and the packed IDs cross to the host), and for CPU tensors when ``MUCSC_BACKEND=torch`` (how CI
tests it without a GPU).  Every step follows spec/FORMAT.md 4.3 operation by operation:

* the SplitMix64 counter stream in int64 arithmetic (two's-complement wrap-around is arithmetic mod
  2^64; a logical right shift is an arithmetic shift with the sign-extended bits masked off);
* k = the number of interior centroids <= x (``searchsorted(right=True)``), then
  ``u * (c[k+1] - c[k]) < x - c[k]`` with each operation a separate kernel in the working precision,
  so no fused multiply-add can change a decision;
* LSB-first bit packing of FORMAT.md's ``IDS_``.

The solver runs on the host from a summary computed on the device (``TorchSource``): the sorted data
for small inputs, or the stratified subsample and the exact tails of ``centroids._sample_sorted`` for
large ones.  torch is imported only when this module is used.
"""

from __future__ import annotations

import warnings

import numpy as np

from mucsc.codec import kernels
from mucsc.optional import require_torch

GAMMA = kernels.GAMMA
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
CHUNK = 1 << 22  # elements per device chunk: bounds the int64 temporaries (~8 bytes x a few per element)


def _torch():
    """torch, or a ParameterError saying the torch backend needs it."""
    return require_torch("the torch backend (MUCSC_BACKEND=torch or a device tensor)")


def is_torch(x) -> bool:
    """True for a torch tensor (without importing torch)."""
    return type(x).__module__.startswith("torch") and hasattr(x, "detach") and hasattr(x, "dtype")


def _i64(v: int) -> int:
    """An unsigned 64-bit value as the int64 with the same bits."""
    v &= kernels.MASK64
    return v - (1 << 64) if v >= 1 << 63 else v


def _srl(z, s: int):
    """Logical right shift of int64 bit patterns by ``s`` (1..63)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def applies(x) -> bool:
    """Whether ``x`` is encoded on this backend: a torch tensor, or any data when
    ``MUCSC_BACKEND=torch`` selected it for CPU data too."""
    return is_torch(x) or kernels.TORCH


def as_tensor(x):
    """``x`` as a 1-D torch tensor (numpy arrays are wrapped without a copy; never written)."""
    torch = _torch()
    if is_torch(x):
        return x.reshape(-1)
    with warnings.catch_warnings():  # read-only views of the caller's buffers: we only read them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(x).reshape(-1))


def device(spec):
    """``spec`` ("cuda", "cuda:1", "cpu" or a torch.device) as a torch.device; a clear error when
    that device is not available here."""
    from mucsc.errors import ParameterError

    torch = _torch()
    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError) as exc:
        raise ParameterError(f"device {spec!r} is not a torch device ({exc})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ParameterError(f"device {spec!r} requested but CUDA is not available on this machine")
    return dev


def group_vector(parts, float_dtype: str, limit: float | None = None, codec: str = ""):
    """One flat torch vector of the (name, tensor or array) ``parts`` in ``float_dtype``, on the device
    of the first device tensor, checked finite and within ``limit`` (the codec's ``input_limit``)
    there (InputError names the tensor, as the host path's does)."""
    from mucsc.errors import InputError

    torch = _torch()
    dt = getattr(torch, float_dtype)
    dev = next(a.device for _, a in parts if is_torch(a))
    flat = []
    for name, a in parts:
        t = (a if is_torch(a) else as_tensor(a)).reshape(-1).to(device=dev, dtype=dt)
        if t.numel() and not bool(torch.isfinite(t).all()):
            raise InputError(f"{'tensor ' + repr(name) if name else 'input'} contains NaN or Inf")
        if t.numel() and limit is not None:
            big = float(t.abs().max())
            if big > limit:
                raise InputError(f"{'tensor ' + repr(name) if name else 'input'} holds a magnitude of "
                                 f"{big:.9g}, beyond the largest codec {codec!r} can carry ({limit:.9g}); "
                                 "scale it, or use a codec with a wider wire (raw is lossless)")
        flat.append(t)
    return flat[0] if len(flat) == 1 else torch.cat(flat)


def splitmix64(key: int, start: int, count: int, device):
    """Outputs start+1 .. start+count of SplitMix64 with state ``key`` as int64 bit patterns
    (``kernels.splitmix64``'s numbers, on ``device``).  In place, one temporary."""
    torch = _torch()
    z = torch.arange(start + 1, start + count + 1, dtype=torch.int64, device=device)
    z.mul_(_i64(GAMMA)).add_(_i64(key))
    t = torch.empty_like(z)
    for shift, mult in ((30, _M1), (27, _M2), (31, None)):
        torch.bitwise_right_shift(z, shift, out=t)
        z.bitwise_xor_(t.bitwise_and_((1 << (64 - shift)) - 1))  # logical shift: drop the sign copies
        if mult is not None:
            z.mul_(_i64(mult))
    return z


def uniforms(key: int, start: int, n: int, float32: bool, device):
    """Uniforms of elements start .. start+n-1 (FORMAT.md 4.3; ``start`` even for float32 work)."""
    torch = _torch()
    if not float32:
        w = splitmix64(key, start, n, device)
        return _srl(w, 11).to(torch.float64) * 2.0**-53
    words = (n + 1) // 2
    w = splitmix64(key, start // 2, words, device)
    t = torch.stack((_srl(w, 8) & 0xFFFFFF, _srl(w, 40)), dim=1).reshape(-1)[:n]
    return t.to(torch.float32) * 2.0**-24


def work_float32(x, c: np.ndarray) -> bool:
    """float32 arithmetic exactly when the reference uses it (``quantize._work_dtype``)."""
    torch = _torch()
    return x.dtype == torch.float32 and np.array_equal(c.astype(np.float32).astype(c.dtype), c)


def round_supported(x, c: np.ndarray) -> bool:
    """Whether every level gap c[k+1] - c[k] is finite in the working precision (a float32 range
    wider than FLT_MAX is not: the host path's rule covers it)."""
    f32 = work_float32(x, c)
    with np.errstate(over="ignore"):
        return bool(np.all(np.isfinite(np.diff(c.astype(np.float32 if f32 else np.float64)))))


def stochastic_round(x, c: np.ndarray, key: int, *, return_J: bool = False):
    """Cluster ids (uint8 tensor for <= 256 levels, else int32, on x's device) of eq. 7 against wire centroids ``c`` (host, sorted,
    bracketing x), identical to ``quantize.stochastic_round`` given the same key; and J (float64) of
    eq. 8-9 when ``return_J``.  Every level gap must be finite in the working precision (the
    caller checks :func:`round_supported` first and otherwise uses the reference path)."""
    torch = _torch()
    n = x.numel()
    if c.size == 1 or n == 0:
        return torch.zeros(n, dtype=torch.uint8, device=x.device), (0.0 if return_J else None)
    f32 = work_float32(x, c)
    wdt = torch.float32 if f32 else torch.float64
    cw_np = c.astype(np.float32 if f32 else np.float64)
    dev = x.device
    cw = torch.from_numpy(cw_np).to(dev)
    gw = torch.from_numpy(np.diff(cw_np)).to(dev)  # c_{k+1} - c_k in the working precision
    c64 = torch.from_numpy(c.astype(np.float64)).to(dev)
    interior = cw[1:-1].contiguous()
    # narrow ids (1 byte for Z <= 256): the packing reads them back, so this is memory traffic saved twice
    ids = torch.empty(n, dtype=torch.uint8 if c.size <= 256 else torch.int32, device=dev)
    J = torch.zeros((), dtype=torch.float64, device=dev)
    step = CHUNK
    for s in range(0, n, step):
        xc = x[s:s + step].to(wdt)
        k = torch.searchsorted(interior, xc, right=True)
        d = xc - cw[k]
        up = uniforms(key, s, xc.numel(), f32, dev) * gw[k] < d
        ids[s:s + step] = k + up
        if return_J:
            x64 = x[s:s + step].to(torch.float64)
            J += ((c64[k + 1] - x64) * (x64 - c64[k])).sum()
    return ids, (float(J) if return_J else None)


def variance_J(x, c: np.ndarray) -> float:
    """J of eq. 8-9 for wire centroids ``c`` (float64, on x's device): the same sum the rounding pass
    accumulates with ``return_J``, as a separate pass for callers that need J only sometimes."""
    torch = _torch()
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


# ---- host <-> device transfers through a pinned staging buffer ------------------------------------
# A pageable copy runs at ~2 GB/s (the driver stages it through its own small pinned buffer); a copy
# from/to page-locked memory runs at the link's speed.  One staging buffer per device, reused.

STAGE = 1 << 26  # bytes per staged copy (64 MiB)
_stages: dict = {}


def _stage(dev):
    torch = _torch()
    buf = _stages.get(dev)
    if buf is None:
        buf = _stages[dev] = torch.empty(STAGE, dtype=torch.uint8, pin_memory=True)
    return buf


def to_host(t) -> np.ndarray:
    """A uint8 device tensor's bytes as a new host array (staged through pinned memory on CUDA)."""
    torch = _torch()
    t = t.reshape(-1)
    if t.device.type != "cuda":
        return t.cpu().numpy()
    out = np.empty(t.numel(), np.uint8)
    buf = _stage(t.device)
    view = buf.numpy()
    for s in range(0, t.numel(), STAGE):
        m = min(STAGE, t.numel() - s)
        buf[:m].copy_(t[s:s + m])  # synchronous: the buffer is reused next
        out[s:s + m] = view[:m]
    return out


def to_device(buf, dev):
    """Host bytes as a uint8 tensor on ``dev`` (staged through pinned memory on CUDA)."""
    torch = _torch()
    src = np.frombuffer(buf, np.uint8)
    if getattr(dev, "type", str(dev)) != "cuda":
        return torch.from_numpy(src.copy()).to(dev)
    out = torch.empty(src.size, dtype=torch.uint8, device=dev)
    stage = _stage(out.device)
    view = stage.numpy()
    for s in range(0, src.size, STAGE):
        m = min(STAGE, src.size - s)
        view[:m] = src[s:s + m]
        out[s:s + m].copy_(stage[:m])
        torch.cuda.current_stream(out.device).synchronize()  # before the buffer is refilled
    return out


# ---- bit packing (bitpack.pack / unpack on the device) -------------------------------------------
# Element i occupies stream bits [i*w, (i+1)*w), LSB-first (FORMAT.md 4.2).  Groups of 8 elements fill
# exactly w bytes, so value j of a group starts at bit j*w, i.e. byte (j*w)//8, offset (j*w)%8, and
# spans at most 3 bytes (w <= 16): each of the 8 positions is a few whole-tensor shifts and masks.

def pack(ids, width: int) -> np.ndarray:
    """LSB-first packing of ``ids`` (int tensor, values < 2**width) into FORMAT.md's IDS_ bytes (a
    host uint8 array); only the packed bytes are copied to the host."""
    return to_host(pack_tensor(ids, width))


def pack_tensor(ids, width: int):
    """:func:`pack`'s bytes as a uint8 tensor on the ids' device."""
    torch = _torch()
    n = ids.numel()
    if width == 0 or n == 0:
        return torch.zeros(0, dtype=torch.uint8, device=ids.device)
    if width == 8:
        return ids.to(torch.uint8)
    if 8 % width == 0:  # 1, 2 or 4 bits: each byte holds 8 / width whole ids, id j at bit j * width
        per = 8 // width
        v = ids.to(torch.uint8)
        if n % per:
            v = torch.cat((v, torch.zeros((-n) % per, dtype=torch.uint8, device=v.device)))
        g = v.reshape(-1, per)
        out = g[:, 0].clone()
        for j in range(1, per):
            out |= g[:, j] << (j * width)
        return out
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


def unpack(buf, width: int, n: int, device):
    """Inverse of :func:`pack` on ``device``: ``n`` ids as int64.  The caller has checked the
    length and padding (``bitpack.check_packed``)."""
    torch = _torch()
    if width == 0 or n == 0:
        return torch.zeros(n, dtype=torch.int64, device=device)
    b = to_device(buf, device)
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
    torch = _torch()
    return torch.from_numpy(np.ascontiguousarray(values)).to(ids.device)[ids]


# ---- B-MUCSC's selection ----------------------------------------------------------------------------

def top_k_positions(x, k: int) -> np.ndarray | None:
    """Sorted positions (host int64) of the k elements of largest |x|, when that set is unique; None
    when elements tied at the k-th magnitude make it a choice (the host's ``sparse.top_k`` decides)."""
    torch = _torch()
    n = x.numel()
    if k >= n:
        return np.arange(n, dtype=np.int64)
    if k == 0:
        return np.zeros(0, np.int64)
    a = x.abs()
    t = torch.topk(a, k, sorted=False).values.min()
    above = a >= t
    if int(above.sum()) != k:
        return None
    return torch.nonzero(above).reshape(-1).cpu().numpy().astype(np.int64)


def host_sums(x) -> bool:
    """Whether reductions that reach the wire (B-MUCSC's mean) are taken on the host in the
    reference order: for CPU tensors, where the host sees the data without a copy."""
    return x.device.type == "cpu"


def sum64(x) -> float:
    """The float64 sum of x's values (order of the device's reduction)."""
    torch = _torch()
    return float(x.sum(dtype=torch.float64))


def rest_sq_bias(x, pos: np.ndarray, mean: float) -> float:
    """sum over the elements not at ``pos`` of (x - mean)^2, in float64 (B-MUCSC's bias term)."""
    torch = _torch()
    rest = torch.ones(x.numel(), dtype=torch.bool, device=x.device)
    rest[torch.from_numpy(pos).to(x.device)] = False
    return float(((x[rest].to(torch.float64) - mean) ** 2).sum())


# ---- what the centroid solver needs from the data -------------------------------------------------

class TorchSource:
    """What ``centroids.solve`` reads from a device tensor (the duck type it accepts besides arrays).

    Every answer equals the same computation on the host copy of the data, and is small: a strided
    probe, the stratified subsample, the elements beyond two thresholds (in index order; the solver
    sorts them on the host, as ``centroids._outside`` does, so signed zeros order identically).
    ``all()`` is the whole vector on the host, for small inputs and the rare paths."""

    def __init__(self, x):
        torch = _torch()
        self.x = x
        self.size = x.numel()
        self.dtype = np.dtype({torch.float32: np.float32, torch.float64: np.float64}[x.dtype])

    def all(self) -> np.ndarray:
        return self.x.cpu().numpy()

    def bounds(self) -> tuple[float, float]:
        torch = _torch()
        lo, hi = torch.aminmax(self.x)
        return float(lo), float(hi)

    def gather(self, idx: np.ndarray) -> np.ndarray:
        torch = _torch()
        return self.x[torch.from_numpy(idx).to(self.x.device)].cpu().numpy()

    def strided(self, step: int) -> np.ndarray:
        return self.x[::step].cpu().numpy()

    def outside(self, t_lo, t_hi) -> tuple[np.ndarray, np.ndarray]:
        return self.x[self.x < float(t_lo)].cpu().numpy(), self.x[self.x > float(t_hi)].cpu().numpy()

    def equals_levels(self, probe: np.ndarray) -> bool:
        """Whether every element is one of the sorted values ``probe`` (exact comparison)."""
        torch = _torch()
        p = torch.from_numpy(probe).to(self.x.device)
        k = torch.clamp(torch.searchsorted(p, self.x), max=p.numel() - 1)
        return bool(torch.equal(p[k], self.x))
