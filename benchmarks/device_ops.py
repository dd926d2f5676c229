#!/usr/bin/env python3
"""How many aten ops and host round-trips one message costs on the torch backend (issue 36's CPU targets).

    MUCSC_BACKEND=torch python benchmarks/device_ops.py [--device cpu|cuda]

Encodes (and decodes) fedsim's LeNet and ALL-CNN state_dicts (random values) and one d = 1e6 vector as torch
tensors and counts, per message, the aten ops dispatched (a ``TorchDispatchMode``) and the host round-trips: calls
of ``Tensor.item/tolist/cpu/numpy/__bool__/__int__/__float__/__index__`` plus the aten ops ``nonzero`` and
``_local_scalar_dense`` (each makes the host wait for the device).  On CPU tensors this counts what the same code
launches on a GPU: the device path and the CPU torch path are one code.  Prints a table; the second encode is
counted (the first warms caches and self-checks).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import sys
from pathlib import Path

os.environ.setdefault("MUCSC_BACKEND", "torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import mucsc  # noqa: E402
from mucsc.fedsim import models  # noqa: E402

SYNC_OPS = {"nonzero", "_local_scalar_dense"}
SYNC_METHODS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")


class Counter(TorchDispatchMode):
    """Counts aten ops by name; ``syncs`` counts the round-trip ops among them."""

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


def count(fn):
    fn()  # warm-up: first-use self-checks, caches
    with counted_methods() as calls, Counter() as c:
        fn()
    ops = sum(c.ops.values())
    trips = sum(calls.values()) + sum(c.ops[o] for o in SYNC_OPS)
    return ops, trips, c.ops, calls


def state(name: str, device: str) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    m = models.build_model(name, (1, 28, 28) if name == "lenet" else (3, 32, 32), 62 if name == "lenet" else 10)
    return {k: torch.randn_like(v).to(device) * 0.01 for k, v in m.state_dict().items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--top", type=int, default=0, help="also list the N most frequent ops per row")
    a = ap.parse_args()
    inputs = {"LeNet (8 tensors)": state("lenet", a.device), "ALL-CNN (18 tensors)": state("allcnn", a.device),
              "vector d = 1e6": torch.randn(1_000_000, device=a.device)}
    print(f"MUCSC_BACKEND={os.environ['MUCSC_BACKEND']}, device {a.device}, torch {torch.__version__}")
    print("| input | codec | encode aten ops | encode round-trips | decode aten ops | decode round-trips |")
    print("|---|---|---|---|---|---|")
    for label, x in inputs.items():
        for codec in ("mucsc", "bmucsc", "signsgd"):
            kw = {"z": 16} if codec == "mucsc" else {}
            blob = mucsc.encode(x, codec, seed=0, **kw)
            e_ops, e_trips, e_by, e_calls = count(lambda: mucsc.encode(x, codec, seed=0, **kw))
            d_ops, d_trips, _, _ = count(lambda: mucsc.decode(blob, as_torch=True, device=a.device))
            print(f"| {label} | {codec} | {e_ops} | {e_trips} | {d_ops} | {d_trips} |")
            if a.top:
                print("|  | top ops |", ", ".join(f"{k} {v}" for k, v in e_by.most_common(a.top)),
                      "| calls |", dict(e_calls), "| |")


if __name__ == "__main__":
    main()
