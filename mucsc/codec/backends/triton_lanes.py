"""IDSL's lane coder (spec/FORMAT.md 4.6) as two Triton kernels, checked against the host reference.

:mod:`mucsc.codec.backends.torch_lanes` codes all lanes with one vector step per symbol row (a few dozen
kernel launches per row); these kernels run each lane's whole loop in one launch
(``_triton_lanes_kernel``).  As the fused rounding kernel (:mod:`mucsc.codec.backends.triton_round`), they
must give the reference's bytes exactly and can only be checked where they run: the first time a
(device, symbol dtype) variant is used, probes (one lane to several blocks of several lanes, partial
rows, byte and wide symbols, scale bits 16 and 22, a corrupt stream) are coded and decoded by them and
by the host reference (:mod:`mucsc.codec.wire.lanes`' numpy coder) and compared; a compile error
or any difference turns the kernels off for the process with one warning, and the torch path runs
instead.  ``MUCSC_TRITON`` selects when they run, as for the rounding kernel (CPU
tensors with ``MUCSC_TRITON=1`` and ``TRITON_INTERPRET=1``: Triton's interpreter, how the tests
run them without a GPU).
"""

from __future__ import annotations

import os
import threading

import numpy as np

from mucsc.codec.backends.tensors import torch_module
from mucsc.codec.backends import triton_round
from mucsc.codec.backends.kernel_switch import KernelSwitch
from mucsc.codec.wire import lanes

BL = 64  # lanes per program
PAD = 3  # zero bytes after a section on the device: a lane step reads 3 bytes at its position
SWITCH = KernelSwitch("the Triton lane-coding kernels are",
                      f"the torch path codes IDSL (the same bytes, more launches). Set {triton_round.ENV}=0 to "
                      "skip the kernels.")
_lock = threading.Lock()  # the jitted kernels' cache
_kernels: dict = {}


def wanted(t) -> bool:
    """Whether the kernels should be tried for tensors on t's device (MUCSC_TRITON, triton present,
    not disabled in this process)."""
    return wanted_on(t.device.type)


def wanted_on(kind: str) -> bool:
    """:func:`wanted` for a device type ("cuda", "cpu", ...), before any tensor is there."""
    m = triton_round.mode()
    if m == "off" or SWITCH.disabled is not None:
        return False
    if m == "auto" and kind != "cuda":
        return False
    return triton_round.triton_module() is not None


def disabled_reason() -> str | None:
    """Why the kernels were turned off in this process (None while they are not)."""
    return SWITCH.disabled


def _kernel(name: str):
    key = (name, os.environ.get("TRITON_INTERPRET", ""))
    with _lock:
        if key not in _kernels:
            import triton

            from mucsc.codec.backends import _triton_lanes_kernel

            _kernels[key] = triton.jit(getattr(_triton_lanes_kernel, name))
        return _kernels[key]


def _launch(name: str, dev, grid, *args) -> None:
    torch = _torch()
    with torch.cuda.device(dev) if dev.type == "cuda" else triton_round._interpret_lock:
        _kernel(name)[grid](*args, BL=BL)


class Geometry:
    """A layout's per-lane arrays as int64 tensors on a device."""

    def __init__(self, lay: lanes.Layout, dev):
        torch = _torch()
        self.layout = lay
        self.base, self.stride, self.count = (torch.from_numpy(np.array(a)).to(dev)
                                              for a in (lay.base, lay.stride, lay.count))
        self.steps = int(lay.count.max(initial=0))
        self.cap = 4 + 3 * self.steps


def tables(f: np.ndarray, cum: np.ndarray, S: int, dev):
    """(f, cum, slot -> symbol) as int64 / int32 tensors on ``dev``."""
    torch = _torch()
    slot = np.repeat(np.arange(f.size, dtype=np.int32), f)
    return (torch.from_numpy(f.astype(np.int64)).to(dev), torch.from_numpy(cum.astype(np.int64)).to(dev),
            torch.from_numpy(slot).to(dev))


def _torch():
    return torch_module()


def launch_encode(sym, f: np.ndarray, cum: np.ndarray, S: int, geo):
    """(out, ptr) as ``torch_lanes.encode_lanes_torch`` returns them, from the encode kernel."""
    torch = _torch()
    dev = sym.device
    L = geo.base.numel()
    ft, ct, _ = tables(f, cum, S, dev)
    out = torch.zeros(L * geo.cap, dtype=torch.uint8, device=dev)
    ptr = torch.empty(L, dtype=torch.int64, device=dev)
    args = torch.tensor([L, geo.steps, geo.cap, S], dtype=torch.int64).to(dev)
    if L:
        _launch("encode_kernel", dev, (-(-L // BL),), sym.contiguous(), ft, ct, geo.base, geo.stride, geo.count,
                out, ptr, args)
    return out.reshape(L, geo.cap), ptr


def launch_decode(buf, p: lanes.Parsed, geo):
    """(symbols, corrupt) as ``torch_lanes.decode_lanes_torch`` returns them, from the decode kernel."""
    torch = _torch()
    dev = buf.device
    L = geo.base.numel()
    ft, ct, slot = tables(p.f, p.cum, p.S, dev)
    starts = torch.from_numpy(p.starts).to(dev)
    ends = starts + torch.from_numpy(p.lengths).to(dev)
    out = torch.empty(geo.layout.m, dtype=torch.int32, device=dev)
    bad = torch.zeros(L, dtype=torch.int8, device=dev)
    args = torch.tensor([L, geo.steps, p.S, buf.numel()], dtype=torch.int64).to(dev)
    if L:
        _launch("decode_kernel", dev, (-(-L // BL),), buf, ft, ct, slot, geo.base, geo.stride, geo.count, starts,
                ends, out, bad, args)
    return out, bool(bad.any())


def _variant(t) -> tuple:
    return str(t.device), str(t.dtype)


def _ready(t) -> bool:
    """Whether the kernels run for tensors like ``t``: wanted, and their variant passed the probes."""
    if not wanted(t):
        return False
    return SWITCH.ready(_variant(t), lambda: _self_check(t.device, t.dtype))


def encode(sym, f, cum, S: int, geo):
    """The encode kernel's (out, ptr), or None when it does not run (the caller's torch path runs)."""
    if not _ready(sym):
        return None
    try:
        return launch_encode(sym, f, cum, S, geo)
    except Exception as exc:  # noqa: BLE001  (the reference path must still encode)
        SWITCH.disable(f"the encode kernel failed: {type(exc).__name__}: {exc}")
        return None


def decode(buf, p: lanes.Parsed, geo):
    """The decode kernel's (symbols, corrupt), or None when it does not run."""
    if not _ready(buf):
        return None
    try:
        return launch_decode(buf, p, geo)
    except Exception as exc:  # noqa: BLE001
        SWITCH.disable(f"the decode kernel failed: {type(exc).__name__}: {exc}")
        return None


def small_layout(sizes: tuple[int, ...], widths: tuple[int, ...]) -> lanes.Layout:
    """A layout like FORMAT.md's with blocks of the given sizes and lane counts (small blocks with
    several lanes: what full blocks look like, at a size Triton's interpreter runs in seconds)."""
    base, stride, count, first = [], [], [], [0]
    o = 0
    for s, W in zip(sizes, widths):
        j = np.arange(W)
        base.append(o + j)
        stride.append(np.full(W, W))
        count.append(-(-(s - j) // W))
        first.append(first[-1] + W)
        o += s
    cat = lambda a: np.concatenate(a).astype(np.int64)  # noqa: E731
    return lanes.Layout(o, np.array(widths, np.int64), np.array(first, np.int64), cat(base), cat(stride), cat(count))


def probes(wide: bool, full: bool) -> list[tuple[np.ndarray, int, lanes.Layout]]:
    """(symbols, alphabet, layout) cases: one lane, blocks of several lanes with partial rows, skewed
    and flat tables, scale bits 16 and (wide, > 4096 symbols used) 22; with ``full`` (a GPU) also
    real layouts of one block and a bit and of three blocks and a bit."""
    g = np.random.default_rng(wide)
    shapes = [((1,), (1,)), ((37,), (1,)), ((301, 64), (4, 3)), ((290, 120, 33), (32, 7, 2))]
    if full:
        shapes += [((m,), None) for m in (lanes.BLOCK + 2100, 3 * lanes.BLOCK + 5)]
    cases = []
    for (sizes, widths), conc in zip(shapes, (1.0, 0.3, 0.05, 1.0, 1.0, 0.3)):
        size = 300 if wide else 256
        lay = lanes.layout(sizes[0]) if widths is None else small_layout(sizes, widths)
        p = g.dirichlet(np.full(size, conc))
        cases.append((g.choice(size, lay.m, p=p), size, lay))
    if wide:
        cases.append((g.integers(0, 6000, 500), 6000, small_layout((500,), (3,))))
    dtype = np.int32 if wide else np.uint8
    return [(s.astype(dtype), size, lay) for s, size, lay in cases]


def _self_check(dev, dtype) -> bool:
    """Code and decode the probes with the kernels on ``dev`` and with the host reference
    (:mod:`mucsc.codec.wire.lanes`, numpy): True (and remembered) when every byte and symbol agrees and a
    corrupt stream is caught; else the kernels are disabled."""
    torch = _torch()
    wide = dtype != torch.uint8
    try:
        for sym_np, size, lay in probes(wide, dev.type == "cuda"):
            sym = torch.from_numpy(sym_np).to(dev)
            S, f = lanes.table(np.bincount(sym_np, minlength=size), sym_np.size)
            cum = np.concatenate(([0], np.cumsum(f)[:-1])).astype(np.int64)
            streams = lanes.encode_lane_set(sym_np, f, cum, S, lay.base, lay.stride, lay.count)
            geo = Geometry(lay, dev)
            out, ptr = launch_encode(sym, f, cum, S, geo)
            out, ptr = out.cpu().numpy(), ptr.cpu().numpy()
            got = [out[j, ptr[j]:].tobytes() for j in range(out.shape[0])]
            if got != streams:
                SWITCH.disable(f"the encode kernel's bytes differ from the reference on a probe ({sym_np.size} symbols "
                         f"of {size})")
                return False
            b = np.frombuffer(b"".join(streams), np.uint8)
            lens = np.array([len(x) for x in streams], np.int64)
            starts = np.concatenate(([0], np.cumsum(lens)[:-1])).astype(np.int64)
            for corrupt in (False, True):
                bb = b.copy()
                if corrupt:
                    bb[-1] ^= 0x5A
                p = lanes.Parsed(S, lanes.WIDE if wide else 8, f, cum, starts, lens, lay)
                buf = torch.from_numpy(np.concatenate((bb, np.zeros(PAD, np.uint8)))).to(dev)
                g_sym, g_bad = launch_decode(buf, p, geo)
                want = np.zeros(sym_np.size, np.int64)
                w_bad = lanes.decode_lane_set(bb, f, cum, S, starts, lens, lay.base, lay.stride, lay.count, want)
                if g_bad != w_bad or w_bad != corrupt or (not corrupt and not np.array_equal(g_sym.cpu().numpy(), want)):
                    SWITCH.disable(f"the decode kernel differs from the reference on a probe ({sym_np.size} symbols of "
                             f"{size}, {'corrupt' if corrupt else 'valid'})")
                    return False
    except Exception as exc:  # noqa: BLE001  (compile errors, missing backends: the torch path runs)
        SWITCH.disable(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return False
    SWITCH.passed((str(dev), str(dtype)))
    return True


def reset() -> None:
    """Forget the self-check results and re-enable the kernels (tests)."""
    SWITCH.reset()
