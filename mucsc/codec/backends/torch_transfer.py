"""The step "where the values live", torch form: a group's vector joined and checked on its device, the
host <-> device copies through a pinned staging buffer, and :class:`DeviceBytes`, a section payload
left on its device until the message writer copies it out (its CRC-32 taken there:
:mod:`mucsc.codec.backends.crc`).  Each copy to the host is one of the device path's counted
round-trips (tests lift ``torch.cuda.set_sync_debug_mode`` at :func:`fetch`, :func:`fetch_list`,
:func:`copy_out` and :func:`to_host` only).  torch is imported only when it runs."""

from __future__ import annotations

import math
import threading
import warnings

import numpy as np

from mucsc.codec import parallel
from mucsc.codec.backends import crc as crc_step
from mucsc.codec.backends.tensors import is_torch_tensor, name_label, torch_module

def as_tensor(x):
    """``x`` as a 1-D torch tensor (numpy arrays are wrapped without a copy; never written)."""
    torch = torch_module()
    if is_torch_tensor(x):
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
    return torch_module().from_numpy(a).to(dev, non_blocking=True)


def fetch_list(t):
    """A small tensor's values as Python numbers: a round-trip like :func:`fetch`, without a host array."""
    return t.tolist()


def device(spec):
    """``spec`` ("cuda", "cuda:1", "cpu" or a torch.device) as a torch.device; a clear error when
    that device is not available here."""
    from mucsc.errors import ParameterError

    torch = torch_module()
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
    torch = torch_module()
    dt = getattr(torch, float_dtype)
    dev = next(a.device for _, a in parts if is_torch_tensor(a))
    ts = [a if is_torch_tensor(a) else as_tensor(a) for _, a in parts]
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

    torch = torch_module()
    for name, a in parts:
        t = (a if is_torch_tensor(a) else as_tensor(a)).reshape(-1).to(device=dev, dtype=dt)
        if t.numel() and not bool(torch.isfinite(t).all()):
            raise InputError(f"{name_label(name)} contains NaN or Inf")
        if t.numel() and limit is not None:
            big = float(t.abs().max())
            if big > limit:
                raise InputError(f"{name_label(name)} holds a magnitude of "
                                 f"{big:.9g}, beyond the largest codec {codec!r} can carry ({limit:.9g}); "
                                 "scale it, or use a codec with a wider wire (raw is lossless)")


# ---- host <-> device transfers through a pinned staging buffer ------------------------------------
# A pageable copy runs at ~2 GB/s (the driver stages it through its own small pinned buffer); a copy
# from/to page-locked memory runs at the link's speed.  One staging buffer per device, reused.

STAGE = 1 << 26  # bytes per staged copy (64 MiB); copies to the host use it as two halves in turn
_stages: dict = {}


# groups are encoded and decoded side by side on several threads (parallel.run_groups): one copy at a
# time goes through the shared staging buffer
_stage_lock = threading.Lock()


def _stage(dev):
    torch = torch_module()
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
    torch = torch_module()
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
    torch = torch_module()
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
        torch = torch_module()
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
        return crc if reg is None else crc_step.crc32_finish(int(reg), self.nbytes)

    def _crc_on_side_stream(self):
        """(:func:`crc32_register` of the bytes, the stream it runs on or None): on CUDA queued on a
        second stream, ordered after the work that made the bytes, so that it overlaps the copy to
        the host (not measured on a GPU); the caller synchronises that stream before reading it."""
        t = self.tensor
        if t.device.type != "cuda":
            return crc_step.crc32_register(t), None
        torch = torch_module()
        side = torch.cuda.Stream(t.device)
        side.wait_stream(torch.cuda.current_stream(t.device))
        with torch.cuda.stream(side):
            reg = crc_step.crc32_register(t)
        t.record_stream(side)
        return reg, side


def to_device(buf, dev):
    """Host bytes as a uint8 tensor on ``dev`` (staged through pinned memory on CUDA)."""
    torch = torch_module()
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
