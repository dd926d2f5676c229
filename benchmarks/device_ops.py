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
import os
import sys
from pathlib import Path

os.environ.setdefault("MUCSC_BACKEND", "torch")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # devicetools: the counting harness the tests use too

import torch  # noqa: E402
from devicetools import count, state  # noqa: E402

import mucsc  # noqa: E402


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
            e = count(lambda: mucsc.encode(x, codec, seed=0, **kw))
            d = count(lambda: mucsc.decode(blob, as_torch=True, device=a.device))
            print(f"| {label} | {codec} | {e.ops} | {e.trips} | {d.ops} | {d.trips} |")
            if isinstance(x, dict) and codec == "mucsc":  # a codebook per tensor: one group each
                e = count(lambda: mucsc.encode(x, codec, seed=0, shared=False, **kw))
                print(f"| {label}, shared=False | {codec} | {e.ops} | {e.trips} | | |")
            if a.top:
                print("|  | top ops |", ", ".join(f"{k} {v}" for k, v in e.by_op.most_common(a.top)),
                      "| calls |", dict(e.calls), "| |")


if __name__ == "__main__":
    main()
