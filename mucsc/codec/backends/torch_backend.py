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

import functools
import math
import sys
import threading
import warnings

import numpy as np

from mucsc.codec import kernels, parallel
from mucsc.codec.backends.tensors import name_label
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
        return x if x.dim() == 1 else x.reshape(-1)  # a 1-D tensor as it is: no view op
    with warnings.catch_warnings():  # read-only views of the caller's buffers: we only read them
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(x).reshape(-1))


def fetch(t) -> np.ndarray:
    """A tensor's values on the host (a view of a CPU tensor, a copy from elsewhere): one of the device
    path's few counted round-trips (tests lift ``torch.cuda.set_sync_debug_mode`` here only)."""
    return t.numpy(force=True)


def to_dev(a: np.ndarray, dev):
    """A small host array (levels, tables) on ``dev``, queued without waiting for the device (a
    pageable source is staged by the driver before the call returns; nothing synchronises)."""
    return _torch().from_numpy(a).to(dev, non_blocking=True)


def histogram(v, size: int):
    """Counts of the values of the int64 tensor ``v`` (all in [0, size)), ``size`` of them, on v's
    device: ``bincount`` on the CPU; elsewhere a scatter-add into zeros, since CUDA's bincount reads
    the input's min and max back to the host (two synchronisations) to size its output."""
    torch = _torch()
    if v.device.type == "cpu":
        return torch.bincount(v, minlength=size)
    out = torch.zeros(size, dtype=torch.int64, device=v.device)
    return out.scatter_add_(0, v, _one(v.device).expand(v.numel()))


_ones: dict = {}


def _one(dev):
    """A 1-element int64 tensor of 1 on ``dev`` (made once per device; expanded, never written)."""
    t = _ones.get(dev)
    if t is None:
        t = _ones[dev] = _torch().ones(1, dtype=_torch().int64, device=dev)
    return t


def fetch_list(t):
    """A small tensor's values as Python numbers: a round-trip like :func:`fetch`, without a host array."""
    return t.tolist()


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
    there (InputError names the tensor, as the host path's does).

    One pipeline for the whole group: the parts are joined in one op (``torch._chunk_cat`` where all
    are already of the work dtype and device) and checked by one reduction, max |x| (NaN
    propagates), read back once; only a failing check walks the parts to name the culprit."""
    torch = _torch()
    dt = getattr(torch, float_dtype)
    dev = next(a.device for _, a in parts if is_torch(a))
    ts = [a if is_torch(a) else as_tensor(a) for _, a in parts]
    if len(ts) == 1:
        flat = as_tensor(ts[0]).to(device=dev, dtype=dt)
    elif hasattr(torch, "_chunk_cat") and all(t.dtype == dt and t.device == dev and t.numel() for t in ts):
        flat = torch._chunk_cat(ts, 0, 1).view(-1)  # one launch: each part flattened into its place
    else:
        flat = torch.cat([as_tensor(t).to(device=dev, dtype=dt) for t in ts])
    if flat.numel():
        big = fetch_list(torch.linalg.vector_norm(flat, float("inf")))  # max |x| (NaN when any is): one read
        if not math.isfinite(big) or (limit is not None and big > limit):
            _check_parts(parts, dt, dev, limit, codec)  # raises, naming the first offending part
    return flat


def _check_parts(parts, dt, dev, limit: float | None, codec: str) -> None:
    """The per-part check behind :func:`group_vector`'s: InputError for the first part that holds a
    NaN or Inf, or a magnitude beyond ``limit`` (in that order per part, as the host path checks)."""
    from mucsc.errors import InputError

    torch = _torch()
    for name, a in parts:
        t = (a if is_torch(a) else as_tensor(a)).reshape(-1).to(device=dev, dtype=dt)
        if t.numel() and not bool(torch.isfinite(t).all()):
            raise InputError(f"{name_label(name)} contains NaN or Inf")
        if t.numel() and limit is not None:
            big = float(t.abs().max())
            if big > limit:
                raise InputError(f"{name_label(name)} holds a magnitude of "
                                 f"{big:.9g}, beyond the largest codec {codec!r} can carry ({limit:.9g}); "
                                 "scale it, or use a codec with a wider wire (raw is lossless)")


def splitmix64(key: int, start: int, count: int, device):
    """Outputs start+1 .. start+count of SplitMix64 with state ``key`` as int64 bit patterns
    (``kernels.splitmix64``'s numbers, on ``device``).  In place: the counters and one temporary."""
    return _rounds(_counters(key, start, count, device))


GAMMA_INV = pow(GAMMA, -1, 1 << 64)  # GAMMA is odd: invertible mod 2^64


def _counters(key: int, start: int, count: int, device):
    """key + (start + 1 + j) * GAMMA for j < count (mod 2^64, int64 bit patterns) in two ops: the
    range (j + c) * GAMMA with c = start + 1 + key * GAMMA^-1; three (a range, a multiply, an add)
    in the rare case where c + count would pass the int64 range."""
    torch = _torch()
    c = _i64(start + 1 + key * GAMMA_INV)
    if c <= (1 << 63) - 1 - count:
        z = torch.arange(c, c + count, dtype=torch.int64, device=device)
        if z.numel() == count:
            return z.mul_(_i64(GAMMA))
    z = torch.arange(start + 1, start + count + 1, dtype=torch.int64, device=device)
    return z.mul_(_i64(GAMMA)).add_(_i64(key))


def _rounds(z):
    """SplitMix64's finaliser of FORMAT.md 4.3 on the int64 words ``z`` (overwritten: returned)."""
    for shift, mult in ((30, _M1), (27, _M2), (31, None)):
        t = z >> shift
        z ^= t.bitwise_and_((1 << (64 - shift)) - 1)  # logical shift: drop the sign copies
        if mult is not None:
            z.mul_(_i64(mult))
    return z


def _mix(z, key: int):
    """mix(key + z * GAMMA) of FORMAT.md 4.3 for the int64 counters ``z`` (overwritten: returned)."""
    return _rounds(z.mul_(_i64(GAMMA)).add_(_i64(key)))


UNIFORM_BITS = {True: 24, False: 53}  # float32 / float64 work: a uniform is an integer m times 2^-bits


def uniform_ints(key: int, start: int, n: int, float32: bool, device):
    """The integers m of the uniforms m * 2^-UNIFORM_BITS of elements start .. start+n-1 (FORMAT.md
    4.3; ``start`` even for float32 work).  float32: bits 8..31 and 40..63 of each word are the
    int32 halves of the word (little-endian) shifted by 8 and masked: one view, two ops."""
    torch = _torch()
    if not float32:
        return _srl(splitmix64(key, start, n, device), 11)
    words = (n + 1) // 2
    w = splitmix64(key, start // 2, words, device)
    if sys.byteorder == "little":
        m = (w.view(torch.int32) >> 8).bitwise_and_(0xFFFFFF)
        return m if m.numel() == n else m[:n]
    return torch.stack((_srl(w, 8) & 0xFFFFFF, _srl(w, 40)), dim=1).reshape(-1)[:n]


def uniforms(key: int, start: int, n: int, float32: bool, device):
    """Uniforms of elements start .. start+n-1 (FORMAT.md 4.3; ``start`` even for float32 work)."""
    torch = _torch()
    m = uniform_ints(key, start, n, float32, device)
    return m.to(torch.float32 if float32 else torch.float64) * 2.0 ** -UNIFORM_BITS[float32]


def uniforms_at(key: int, idx, float32: bool):
    """Uniforms of the elements at positions ``idx`` (an int64 tensor): :func:`uniforms`' values there."""
    torch = _torch()
    if not float32:
        return _srl(_mix(idx + 1, key), 11).to(torch.float64) * 2.0**-53
    w = _mix((idx >> 1) + 1, key)
    return torch.where((idx & 1) == 0, _srl(w, 8) & 0xFFFFFF, _srl(w, 40)).to(torch.float32) * 2.0**-24


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
    """Cluster ids (on x's device: uint8 for <= 256 levels, else int32) of eq. 7 against wire
    centroids ``c`` (host, sorted, bracketing x), identical to ``quantize.stochastic_round`` given
    the same key; and J (float64) of
    eq. 8-9 when ``return_J``.  Every level gap must be finite in the working precision (the
    caller checks :func:`round_supported` first and otherwise uses the reference path)."""
    torch = _torch()
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
    torch = _torch()
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
        torch = _torch()
        self.f32 = f32
        cw = c.astype(np.float32 if f32 else np.float64)
        gw = np.diff(cw)
        bits = UNIFORM_BITS[f32]
        # u * g = (m * 2^-bits) * g is m * (g * 2^-bits) exactly (one rounding of the same product)
        # while g * 2^-bits stays a normal number: then the scaling is folded into the gaps
        self.scaled = bool(gw.min() * 2.0 ** -bits >= np.finfo(cw.dtype).tiny)
        if self.scaled:
            gw = gw * cw.dtype.type(2.0 ** -bits)
        self.interior = to_dev(cw[1:-1].copy(), dev)
        # (c[k], gap k) side by side: one copy over, one gather per element for both
        self.table = to_dev(np.stack((cw[:-1], gw), axis=1), dev)
        self.dtype = self.table.dtype

    def round(self, x, key: int, start: int):
        """Eq. 7's ids (int64) of the elements start .. of ``x`` (a slice of the vector)."""
        xw = x.to(self.dtype)
        k = self.bracket(xw)
        return k.add_(self.up(xw, k, key, start))

    def bracket(self, xw):
        """k: the number of interior levels <= x (x in the working precision)."""
        return _torch().searchsorted(self.interior, xw, right=True)

    def up(self, xw, k, key: int, start: int):
        """Where u * (c[k+1] - c[k]) < x - c[k] (FORMAT.md 4.3): each arithmetic step a separate op in
        the working precision, so no fused multiply-add can change a decision."""
        u = uniform_ints(key, start, xw.numel(), self.f32, xw.device).to(self.dtype)
        if not self.scaled:
            u.mul_(2.0 ** -UNIFORM_BITS[self.f32])
        ck, gk = self.table[k].unbind(1)
        return u.mul_(gk) < (xw - ck)


def working_levels(c: np.ndarray, f32: bool, dev):
    """(c, c[k+1] - c[k]) in the working precision of FORMAT.md 4.3, on ``dev``: the gaps are taken
    after the cast, as the reference takes them."""
    torch = _torch()
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
    k = _torch().searchsorted(cw[1:-1].contiguous(), xw, right=True)
    return k + _up(xw, k, uniforms_at(key, idx, f32), cw, gw)


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

STAGE = 1 << 26  # bytes per staged copy (64 MiB); copies to the host use it as two halves in turn
_stages: dict = {}
# groups are encoded and decoded side by side on several threads (parallel.run_groups): one copy at a
# time goes through the shared staging buffer
_stage_lock = threading.Lock()


def _stage(dev):
    torch = _torch()
    buf = _stages.get(dev)
    if buf is None:
        buf = _stages[dev] = torch.empty(STAGE, dtype=torch.uint8, pin_memory=True)
    return buf


def copy_out(t, out: np.ndarray, crc: int | None = None) -> int | None:
    """Copy the uint8 CUDA tensor ``t`` into the host uint8 array ``out`` (as long) through the
    pinned staging buffer, and return ``zlib.crc32`` of the bytes continued from ``crc`` (None:
    no CRC).  The buffer's two halves are used in turn: the DMA of one chunk runs while the host
    copies the previous chunk on into ``out`` (on ``parallel.current()`` threads), taking its
    CRC while it is in cache."""
    torch = _torch()
    n, half = t.numel(), STAGE // 2
    spans = [(s, min(half, n - s)) for s in range(0, n, half)]
    with _stage_lock:
        buf = _stage(t.device)
        halves, views = (buf[:half], buf[half:]), (buf[:half].numpy(), buf[half:].numpy())
        stream = torch.cuda.current_stream(t.device)
        landed = (torch.cuda.Event(), torch.cuda.Event())

        def drain(i: int, crc: int | None) -> int | None:
            s, m = spans[i]
            landed[i % 2].synchronize()
            return parallel.copy_crc32(views[i % 2][:m], out[s:s + m], crc)

        try:
            for i, (s, m) in enumerate(spans):  # half i % 2 was drained two steps ago: free again
                halves[i % 2][:m].copy_(t[s:s + m], non_blocking=True)
                landed[i % 2].record(stream)
                if i:
                    crc = drain(i - 1, crc)
            if spans:
                crc = drain(len(spans) - 1, crc)
        finally:
            stream.synchronize()  # on an error too: no DMA may still write the buffer once it is released
    return crc


def to_host(t) -> np.ndarray:
    """A uint8 device tensor's bytes as a new host array (staged through pinned memory on CUDA)."""
    t = t.reshape(-1)
    if t.device.type != "cuda":
        return t.numpy(force=True)  # one call: a view of a CPU tensor, a copy from elsewhere
    out = np.empty(t.numel(), np.uint8)
    copy_out(t, out)
    return out


def bytes_to_host(t) -> np.ndarray:
    """A tensor's raw (native, little-endian) bytes as a host uint8 array: its wire form."""
    torch = _torch()
    if t.numel() == 0:
        return np.zeros(0, np.uint8)
    return to_host(t.contiguous().reshape(-1).view(torch.uint8))


class DeviceBytes:
    """A section payload left on its device (``format.Payload``): a tensor's raw (native,
    little-endian) bytes.  The message writer copies them straight into the message through the
    pinned staging buffer (:func:`copy_out`), with their CRC-32 computed on the device when
    ``device_crc`` (the default off the CPU: only 4 bytes cross, see :func:`crc32`); they are
    brought to the host as an array of their own only when something needs them there (zstd,
    rate control, a decode of the encoding), once."""

    def __init__(self, t, device_crc: bool | None = None) -> None:
        torch = _torch()
        self.tensor = t.contiguous().reshape(-1).view(torch.uint8)
        self.nbytes = self.tensor.numel()
        self.device_crc = self.tensor.device.type != "cpu" if device_crc is None else device_crc
        self._host: np.ndarray | None = None

    def host(self) -> np.ndarray:
        """The bytes as a host uint8 array (a view for a CPU tensor; copied once elsewhere)."""
        if self._host is None:
            self._host = to_host(self.tensor)
        return self._host

    def tobytes(self) -> bytes:
        return self.host().tobytes()

    def write_into(self, out) -> int:
        """Copy the bytes into the writable buffer ``out`` (``nbytes`` long); their CRC-32."""
        dest = np.frombuffer(out, np.uint8)
        # the device CRC is queued before the copy and read after it: the copy does not wait on the host;
        # on CUDA it runs on a side stream, beside the copy's DMA (not measured on a GPU)
        reg, side = self._crc_on_side_stream() if self.device_crc and self._host is None else (None, None)
        host_crc = 0 if reg is None else None
        if self._host is None and self.tensor.device.type == "cuda":
            crc = copy_out(self.tensor, dest, host_crc)
        else:  # not kept: a later write takes the same path (a CPU tensor's host bytes are a view)
            crc = parallel.copy_crc32(self._host if self._host is not None else to_host(self.tensor), dest,
                                      host_crc)
        if side is not None:
            side.synchronize()  # the register was computed on the side stream
        return crc if reg is None else crc32_finish(int(reg), self.nbytes)

    def _crc_on_side_stream(self):
        """(:func:`crc32_register` of the bytes, the stream it runs on or None): on CUDA queued on a
        second stream, ordered after the work that made the bytes, so that it overlaps the copy to
        the host (not measured on a GPU); the caller synchronises that stream before reading it."""
        t = self.tensor
        if t.device.type != "cuda":
            return crc32_register(t), None
        torch = _torch()
        side = torch.cuda.Stream(t.device)
        side.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(side):
            reg = crc32_register(t)
        t.record_stream(side)
        return reg, side


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
    torch = _torch()
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
    torch = _torch()
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
    torch = _torch()
    b = t.contiguous().reshape(-1).view(torch.uint8)
    return crc32_finish(int(crc32_register(b)), b.numel(), crc)


def to_device(buf, dev):
    """Host bytes as a uint8 tensor on ``dev`` (staged through pinned memory on CUDA)."""
    torch = _torch()
    src = np.frombuffer(buf, np.uint8)
    if getattr(dev, "type", str(dev)) != "cuda":
        return torch.from_numpy(src.copy()).to(dev)
    out = torch.empty(src.size, dtype=torch.uint8, device=dev)
    with _stage_lock:
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

def pack(ids, width: int) -> DeviceBytes:
    """LSB-first packing of ``ids`` (int tensor, values < 2**width) into FORMAT.md's IDS_ bytes, as
    a payload left on the ids' device (the writer copies only the packed bytes to the host)."""
    return DeviceBytes(pack_tensor(ids, width))


def pack_tensor(ids, width: int):
    """:func:`pack`'s bytes as a uint8 tensor on the ids' device."""
    torch = _torch()
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
    torch = _torch()
    per, n = 8 // width, ids.numel()
    if n % per:  # the last byte's high ids are zero bits
        ids = torch.cat((ids, torch.zeros((-n) % per, dtype=ids.dtype, device=ids.device)))
    return (ids.reshape(-1, per) << _bit_offsets(ids.device, width)).sum(1)


_offsets: dict = {}


def _bit_offsets(dev, width: int):
    """[0, width, 2 width, ...] below 8 as an int64 tensor on ``dev`` (made once per device)."""
    torch = _torch()
    t = _offsets.get((dev, width))
    if t is None:
        t = _offsets[(dev, width)] = torch.arange(0, 8, width, dtype=torch.int64, device=dev)
    return t


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
    torch = _torch()
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
    torch = _torch()
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
    torch = _torch()
    n = x.numel()
    if not 0 < k < n:
        return None
    top = x.abs().topk(k + 1)
    pos = top.indices[:k].sort().values
    kept = x[pos]
    f64 = torch.float64
    got = fetch(torch.cat((top.values[k - 1:].to(f64), pos.to(f64), kept.to(f64))))
    if got[0] == 0 or got[0] == got[1]:
        return None
    return got[2:2 + k].astype(np.int64), kept, got[2 + k:].astype(TorchSource(kept).dtype)


def scatter(n: int, pos: np.ndarray, vals: np.ndarray, dtype: np.dtype, device):
    """A length-``n`` tensor of ``dtype`` on ``device``: zeros, ``vals`` at the host positions ``pos``
    (the decoders of the top-k family; only the k positions and values are copied over)."""
    torch = _torch()
    out = torch.zeros(n, dtype=getattr(torch, np.dtype(dtype).name), device=device)
    if pos.size:
        out[torch.from_numpy(np.ascontiguousarray(pos, np.int64)).to(device)] = \
            torch.from_numpy(np.array(vals)).to(device=device, dtype=out.dtype)  # a writable copy
    return out


def host_sums(x) -> bool:
    """Whether float64 sums that reach the wire (B-MUCSC's mean, signSGD's and STC's scales) are
    taken by numpy itself: for CPU tensors, where the host sees the data without a copy (elsewhere
    :func:`pairwise_sum64` rebuilds numpy's order on the device)."""
    return x.device.type == "cpu"


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
        return self.x[torch.tensor(idx, device=self.x.device)].cpu().numpy()  # idx may be read-only: a copy

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


def solver_source(x, z: int, solver: str, host: np.ndarray | None = None) -> "DeviceSummary":
    """What ``centroids.solve`` reads of the device vector ``x`` for ``z`` levels, brought to the host
    in ONE copy: the whole vector when the solver reads all of it (small inputs, solvers other than
    the optimal one), else the optimal solver's summary -- the stratified subsample, the strided
    probe of its distinct-value check, and the K smallest and K largest values (two top-k ops, sorted:
    their ends are min x and max x, NaN first among the largest), from which the host takes the
    elements beyond the subsample's thresholds.  Anything the summary cannot answer exactly (more
    tail elements than K, a zero in a tail: see :meth:`DeviceSummary.outside`) is asked of the device
    as :class:`TorchSource` asks it.  ``host``: x's values on the host when the caller brought them
    over already (B-MUCSC's kept values come with their positions): then nothing more is copied."""
    from mucsc.codec.numerics import centroids

    torch = _torch()
    d = x.numel()
    if host is not None:
        return DeviceSummary(x, host=host)
    if d <= centroids.FULL_SORT_MAX or solver != "optimal":
        return DeviceSummary(x, host=fetch(x))
    step = max(1, d // max(4096, 2 * z))  # centroids._distinct_if_at_most's probe
    sub = centroids._subsample_index(d)
    index = _summary_index(x.device, d, step, sub)
    K = min(d, int(TAIL_ROOM * (d * (centroids.TAIL_RANK + 1) // centroids.SUBSAMPLE)) + TAIL_SLACK)
    low, high = x.topk(K, largest=False).values, x.topk(K).values
    got = fetch(torch.cat((low, high, x[index])))
    return DeviceSummary(x, low=got[:K], high=got[K:2 * K], sub=(sub, got[2 * K:2 * K + sub.size]),
                         probe=(step, got[2 * K + sub.size:]))


# the top-k tails hold TAIL_ROOM times the expected tail beyond the subsample's thresholds, plus TAIL_SLACK;
# a longer tail is asked of the device (exact, a copy more).  The threshold is the subsample's 257th value,
# so the tail's share varies by ~1/sqrt(257) = 6%: 1.25x + 512 is > 7 standard deviations at d = 1.3e6.
# (A CPU top-k costs about its k: 72 ms for k = 14.5k of 1.33M elements, 20 ms for 3.8k, one thread.)
TAIL_ROOM, TAIL_SLACK = 1.25, 512
_summary_indexes: dict = {}
_cache_lock = threading.Lock()


def _summary_index(dev, d: int, step: int, sub: np.ndarray):
    """The subsample's positions followed by the probe's (0, step, 2 step, ...) as an int64 tensor on
    ``dev``, made once per (device, d, step) and kept (a handful: an FL client sends the same shapes
    every round)."""
    key = (dev, d, step)
    t = _summary_indexes.get(key)
    if t is None:
        t = to_dev(np.concatenate((sub, np.arange(0, d, step, dtype=np.int64))), dev)
        with _cache_lock:  # groups encode on several threads
            if len(_summary_indexes) >= 8:
                _summary_indexes.pop(next(iter(_summary_indexes)))
            _summary_indexes[key] = t
    return t


class DeviceSummary(TorchSource):
    """:class:`TorchSource` answered from one host copy (:func:`solver_source`): ``host`` the whole
    vector, or ``low``/``high`` the K smallest (ascending) and K largest (descending) values,
    ``sub`` (positions, values) the subsample and ``probe`` (step, values) the strided probe."""

    def __init__(self, x, host=None, low=None, high=None, sub=None, probe=None):
        super().__init__(x)
        self.host, self.low, self.high, self.sub, self.probe = host, low, high, sub, probe

    def all(self) -> np.ndarray:
        return self.host if self.host is not None else super().all()

    def bounds(self) -> tuple[float, float]:
        if self.host is not None:
            return (float(self.host.min()), float(self.host.max())) if self.host.size else (0.0, 0.0)
        return float(self.low[0]), float(self.high[0])

    def gather(self, idx: np.ndarray) -> np.ndarray:
        if self.host is not None:
            return self.host[idx]
        if self.sub is not None and idx is self.sub[0]:
            return self.sub[1]
        return super().gather(idx)

    def strided(self, step: int) -> np.ndarray:
        if self.host is not None:
            return self.host[::step]
        if self.probe is not None and step == self.probe[0]:
            return self.probe[1]
        return super().strided(step)

    def equals_levels(self, probe: np.ndarray) -> bool:
        if self.host is not None:
            k = np.minimum(np.searchsorted(probe, self.host), probe.size - 1)
            return bool(np.array_equal(probe[k], self.host))
        return super().equals_levels(probe)

    def outside(self, t_lo, t_hi) -> tuple[np.ndarray, np.ndarray]:
        """The elements below ``t_lo`` and above ``t_hi`` from the K smallest and K largest: complete
        when the K-th smallest is >= t_lo (and the K-th largest <= t_hi) or K is every element.  A
        tail holding a zero comes from the device in index order (the solver's sort then places
        -0.0 and +0.0 as the host path's does)."""
        if self.host is not None:  # in index order, as the device's answer
            return self.host[self.host < t_lo], self.host[self.host > t_hi]
        if self.low is None:
            return super().outside(t_lo, t_hi)
        every = self.low.size == self.size
        low, high = self.low[self.low < t_lo], self.high[self.high > t_hi]
        complete = every or (self.low[-1] >= t_lo and self.high[-1] <= t_hi)
        if not complete or not (np.all(low != 0) and np.all(high != 0)):
            return super().outside(t_lo, t_hi)
        return low, high


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
    torch = _torch()
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
    torch = _torch()
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
    torch = _torch()
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


# ---- casts and bits ---------------------------------------------------------------------------------

def to_float16(x):
    """``x.astype(np.float16)`` (round to nearest even, once) for a float32/float64 tensor.

    torch converts float64 to float16 through float32, rounding twice; a value just off a float16 tie
    would then land on the tie and round to even where numpy's direct conversion does not.  Rounding
    to float32 *to odd* first (truncate, then set the last bit when inexact) keeps the single
    rounding's result: float32 has more than two extra bits over float16 at every float16 exponent."""
    torch = _torch()
    if x.dtype != torch.float64:
        return x.to(torch.float16)
    y = x.to(torch.float32)
    inexact = y.to(torch.float64) != x
    bits = y.view(torch.int32)
    away = inexact & (y.to(torch.float64).abs() > x.abs())  # rounded away from zero: step back
    bits = torch.where(away, bits - 1, bits)  # sign-magnitude: -1 shrinks |y| for either sign
    bits = torch.where(inexact, bits | 1, bits)
    return bits.view(torch.float32).to(torch.float16)


def unpack_bits(b, n: int):
    """The first ``n`` LSB-first bits of the uint8 tensor ``b`` as a bool tensor on its device (the
    caller has checked the length and padding)."""
    torch = _torch()
    shifts = torch.arange(8, dtype=torch.uint8, device=b.device)
    return ((b.unsqueeze(1) >> shifts) & 1).reshape(-1)[:n].bool()
