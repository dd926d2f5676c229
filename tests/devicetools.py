"""Counting what one message costs on the torch backend (issue 36's measure), shared by
tests/test_device_ops.py and benchmarks/device_ops.py.

Aten ops are counted with a ``TorchDispatchMode``; host round-trips are the calls of the Tensor methods
that bring values to the host (``item/tolist/cpu/numpy/__bool__/__int__/__float__/__index__``) plus the
aten ops ``nonzero`` and ``_local_scalar_dense`` (each makes the host wait for the device).  On CPU
tensors this counts what the same code launches on a GPU: the device path and the CPU torch path are one
code.  torch is imported here: import this module only where torch is installed.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = ("nonzero", "_local_scalar_dense")
SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class Counter(TorchDispatchMode):
    """Counts aten ops by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func._overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counted_methods():
    """Wraps the Tensor methods that bring a value to the host; yields their call counter."""
    calls: collections.Counter[str] = collections.Counter()
    saved = {m: getattr(torch.Tensor, m) for m in SYNC_METHODS}

    def wrap(name, f):
        def g(self, *a, **k):
            calls[name] += 1
            return f(self, *a, **k)
        return g

    for m, f in saved.items():
        setattr(torch.Tensor, m, wrap(m, f))
    try:
        yield calls
    finally:
        for m, f in saved.items():
            setattr(torch.Tensor, m, f)


class Count:
    """One call's cost: aten ops and host round-trips in all, and both by name."""

    def __init__(self, ops: collections.Counter, calls: collections.Counter) -> None:
        self.by_op, self.calls = ops, calls
        self.ops = sum(ops.values())
        self.trips = sum(calls.values()) + sum(ops[o] for o in SYNC_OPS)


def count(fn: Callable[[], object], warm: bool = True) -> Count:
    """The cost of ``fn()``, after one uncounted call when ``warm`` (first-use self-checks, caches)."""
    if warm:
        fn()
    with counted_methods() as calls, Counter() as c:
        fn()
    return Count(c.ops, calls)


def state(name: str, device: str = "cpu") -> dict[str, torch.Tensor]:
    """fedsim's LeNet (FEMNIST-shaped) or ALL-CNN (CIFAR-shaped) state_dict with random values."""
    from mucsc.fedsim import models

    torch.manual_seed(0)
    m = models.build_model(name, (1, 28, 28) if name == "lenet" else (3, 32, 32), 62 if name == "lenet" else 10)
    return {k: torch.randn_like(v).to(device) * 0.01 for k, v in m.state_dict().items()}
