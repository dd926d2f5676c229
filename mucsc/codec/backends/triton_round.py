"""One fused Triton kernel for MUCSC's rounding + ID packing, checked against the torch reference.

The torch form (:mod:`mucsc.codec.backends.torch_rounding`) rounds with one torch operation per step and
packs the IDs in a second pass; this kernel does both in one pass over x: per element the
SplitMix64 counter stream, the interval search and eq. 7's decision (spec/FORMAT.md 4.3), and per
group of 8 elements the ``w`` bytes of the LSB-first ``IDS_`` stream (FORMAT.md 4.2).  It never
writes the IDs themselves, so it reads x once and writes n*w/8 bytes.

It must give the torch path's bytes exactly, and a GPU kernel can only be checked where it runs.
So :func:`round_pack` protects itself: the first time a (device, data dtype, working precision,
byte span) variant is used, it runs the kernel and the torch reference on probes (odd sizes, tails
across programs, every width of the variant, subnormals, values on the centroids) and compares
bytes; a compile error or any difference disables the kernel for the process with one warning, and
the caller's torch path runs instead.

When it runs: ``MUCSC_TRITON`` unset (or ``auto``): for CUDA tensors when ``triton`` imports;
``0``: never; ``1``: for every tensor (CPU tensors need ``TRITON_INTERPRET=1``, Triton's numpy
interpreter: how the tests run the kernel without a GPU).  triton and torch are imported only here,
only when used.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from mucsc.codec.backends import random_stream

from mucsc.codec.backends.tensors import torch_module

from mucsc.codec.backends import torch_packing

from mucsc.codec.backends import torch_rounding
from mucsc.codec.backends.kernel_switch import KernelSwitch

ENV = "MUCSC_TRITON"
TILE = 4096  # G * SPAN * 8: the size of one program's packing tile [G groups, SPAN bytes, 8 ids]
SWITCH = KernelSwitch("the fused Triton rounding kernel is",
                      f"the torch path encodes (the same bytes, unfused). Set {ENV}=0 to skip the kernel.")
_lock = threading.Lock()  # the jitted kernels' cache
# Triton's interpreter (CPU tensors) rebinds triton.language's functions while a kernel runs, for the
# whole process: two threads interpreting at once break each other (seen with triton 3.9: "Did you
# forget to add @triton.jit ?").  Interpreted launches take turns; compiled GPU launches do not need to.
_interpret_lock = threading.Lock()
_kernels: dict = {}  # TRITON_INTERPRET setting -> the jitted kernel


def mode() -> str:
    """``MUCSC_TRITON`` as "auto" (unset), "off" (0) or "on" (1); a clear error for anything else."""
    from mucsc.errors import ParameterError

    v = os.environ.get(ENV, "").strip().lower()
    if v in ("", "auto"):
        return "auto"
    if v in ("0", "1"):
        return "off" if v == "0" else "on"
    raise ParameterError(f"{ENV} must be 0, 1 or auto; got {v!r}")


def triton_module():
    """The ``triton`` module, or None when it is not installed (or fails to import)."""
    try:
        import triton
    except Exception:  # noqa: BLE001  (a broken install must not break encoding: the torch path runs)
        return None
    return triton


def wanted(x) -> bool:
    """Whether :func:`round_pack` should be tried for tensor ``x`` (mode, device, triton present,
    not disabled in this process)."""
    m = mode()
    if m == "off" or SWITCH.disabled is not None:
        return False
    if m == "auto" and x.device.type != "cuda":
        return False
    return triton_module() is not None


def disabled_reason() -> str | None:
    """Why the kernel was turned off in this process (None while it is not)."""
    return SWITCH.disabled


def _build():
    """The jitted kernel (built on first use, once per interpreter setting: ``triton.jit`` reads
    ``TRITON_INTERPRET`` when it decorates)."""
    import triton

    from mucsc.codec.backends import _triton_kernel

    # no specialisation on the pointers' alignment either: one binary per (dtype, F32, SPAN, G)
    return triton.jit(_triton_kernel.round_pack_kernel, do_not_specialize=[0, 1, 2, 3, 4])


def _kernel():
    key = os.environ.get("TRITON_INTERPRET", "")
    with _lock:
        if key not in _kernels:
            _kernels[key] = _build()
        return _kernels[key]


def _span(width: int) -> int:
    """Bytes per 8-element group rounded up to a power of two (Triton tiles are powers of two), at
    least 2 (no size-1 tiles)."""
    return max(2, 1 << (width - 1).bit_length())


def launch(x, c: np.ndarray, key: int, width: int, start: int = 0):
    """The packed ``IDS_`` bytes (uint8 tensor on x's device) of eq. 7's rounding of ``x`` (float32 or
    float64, 1-D) to the sorted wire centroids ``c`` (2..65536 of them, every gap finite in the
    working precision: ``torch_rounding.round_supported``) with stream ``key``, ``width`` (1..16,
    2^width >= len(c)) bits per id; x[0] is element ``start`` (a multiple of 8) of the stream.  No
    self-check: :func:`round_pack` is what encoders call."""

    torch = torch_module()
    n = x.numel()
    nbytes = (n * width + 7) // 8
    out = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    if n == 0:
        return out
    f32 = torch_rounding.work_float32(x, c)
    cdev, gdev = torch_rounding.working_levels(c, f32, x.device)  # c and c[k+1] - c[k] in the working precision
    span = _span(width)
    groups = TILE // (8 * span)
    grid = (-(-n // (8 * groups)),)
    args = torch.tensor([n, c.size - 2, nbytes, random_stream.i64(key), start, width], dtype=torch.int64).to(x.device)
    # Triton launches on the current CUDA device's current stream: make x's device the current one
    with torch.cuda.device(x.device) if x.device.type == "cuda" else _interpret_lock:
        _kernel()[grid](x.contiguous(), cdev, gdev, out, args, F32=f32, SPAN=span, G=groups, enable_fp_fusion=False)
    return out


def _applies(x, c: np.ndarray, width: int, start: int) -> bool:
    """Whether the kernel covers this call (else the caller's torch path runs)."""

    torch = torch_module()
    return (x.dtype in (torch.float32, torch.float64) and 2 <= c.size <= 1 << 16 and 1 <= width <= 16
            and c.size <= 1 << width and start % 8 == 0 and start >= 0 and torch_rounding.round_supported(x, c))


def round_pack(x, c: np.ndarray, key: int, width: int, start: int = 0):
    """:func:`launch`'s bytes when the kernel is wanted for ``x`` and its variant passed the
    self-check; None otherwise (the caller then rounds and packs with the torch path)."""
    if not wanted(x) or not _applies(x, c, width, start):
        return None

    variant = (str(x.device), str(x.dtype), torch_rounding.work_float32(x, c), _span(width))
    if not SWITCH.ready(variant, lambda: _self_check(x.device, variant)):
        return None
    try:
        return launch(x, c, key, width, start)
    except Exception as exc:  # noqa: BLE001  (the reference path must still encode)
        SWITCH.disable(f"the kernel failed: {type(exc).__name__}: {exc}")
        return None


def reference(x, c: np.ndarray, key: int, width: int, start: int = 0):
    """The torch path's bytes for what :func:`launch` computes: ``stochastic_round`` + ``pack_tensor``
    (for ``start`` > 0 the stream of x's elements from ``start``: rounded as the tail of a longer x)."""

    torch = torch_module()
    if start:
        x = torch.cat((torch.zeros(start, dtype=x.dtype, device=x.device) + float(c[0]), x))
    ids, _ = torch_rounding.stochastic_round(x, c, key)
    return torch_packing.pack_tensor(ids, width)[start * width // 8:]


def probes(xdtype: str, f32: bool, span: int) -> list[tuple[np.ndarray, np.ndarray, int, int, int]]:
    """(x, centroids, key, width, start) cases for one kernel variant (data dtype, working precision
    ``f32``, byte span): every width with this span at a Z that needs all its bits, a size that
    crosses a program and ends in a partial group, start offsets, values on the centroids, signed
    zeros, and subnormal data, gaps and products (a flush-to-zero would show)."""
    g = np.random.default_rng([span, f32, xdtype == "float64"])
    widths = [w for w in range(1, 17) if _span(w) == span]
    cases = []
    for w in widths:
        z = (1 << w) if w <= 9 else (1 << (w - 1)) + 3 + w
        n = TILE // span + 13 if w == widths[0] else 203  # TILE // span elements per program
        c = np.unique(g.normal(size=2 * z).astype(np.float32))[:z].astype(np.float64)
        x = g.uniform(c[0], c[-1], n)
        x[: n // 8] = g.choice(c, n // 8)
        x[n // 8: n // 8 + 2] = 0.0, -0.0
        cases.append((x, c, w, 8 * (w % 3)))
    tiny = float(np.finfo(np.float32).tiny)  # the smallest normal float32
    w = widths[-1]
    c = np.array([-4.0, -1 / 8, 0.0, 1 / 64, 1 / 2, 3.0])[{1: [1, 3], 2: [1, 2, 3, 4]}.get(w, slice(None))]
    c = c * tiny * (2.0**-900 if xdtype == "float64" else 1.0)
    x = g.uniform(c[0], c[-1], 99)
    x[: c.size] = c
    cases.append((x, c, w, 0))
    out = []
    for x, c, w, start in cases:
        if not f32:  # levels off the float32 grid: float64 work
            c = c + np.linspace(0.0, 1e-9 * max(abs(c[0]), abs(c[-1])), c.size)
        x = np.clip(x.astype(xdtype), c[0], c[-1]).astype(xdtype)
        out.append((x, c, int(g.integers(0, 2**64, dtype=np.uint64)), w, start))
    return out


def _self_check(dev, variant) -> bool:
    """Run the probes of ``variant`` on ``dev``: True (and remembered) when every byte equals the
    torch reference's; else the kernel is disabled for the process (one warning)."""

    torch = torch_module()
    _, xdtype, f32, span = variant
    xdtype = xdtype.replace("torch.", "")
    try:
        for x, c, key, w, start in probes(xdtype, f32, span):
            t = torch.from_numpy(x).to(dev)
            got, want = launch(t, c, key, w, start).cpu(), reference(t, c, key, w, start).cpu()
            if not torch.equal(got, want):
                bad = int((got != want).nonzero()[0]) if got.shape == want.shape else -1
                SWITCH.disable(f"its bytes differ from the torch path on a probe ({xdtype}, width {w}, "
                         f"{x.size} elements, first difference at byte {bad})")
                return False
    except Exception as exc:  # noqa: BLE001  (compile errors, missing backends: the torch path runs)
        SWITCH.disable(f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        return False
    SWITCH.passed(variant)
    return True


def reset() -> None:
    """Forget the self-check results and re-enable the kernel (tests)."""
    SWITCH.reset()

