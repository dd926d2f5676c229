#!/usr/bin/env python3
"""Wall time of the goal searches (bits= / max_error= / a per-tensor Policy) and the digest of what
they write, so that two trees can be compared: same digests = same bytes, then compare the times.

    python benchmarks/bench_goal_speed.py [--d 1000000] [--repeat 2]

Inputs: Student-t(3) float32 of d elements (one tensor), and a "checkpoint" of four tensors with
d elements in all (Student-t(3), Gaussian, Laplace, a small bias) for the per-tensor Policy
(``mucsc.Policy(max_error=0.01)``, what ``mucsc compress`` does in model mode).  Prints a markdown
table: case, best wall seconds of ``--repeat``, seconds per 1e6 elements, sha256 prefix.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import numpy as np

import mucsc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    d = a.d
    x = rng.standard_t(3, d).astype(np.float32)
    q = d // 4
    ckpt = {"conv": rng.standard_t(3, q).astype(np.float32), "fc1": rng.normal(size=q).astype(np.float32),
            "fc2": rng.laplace(size=d - 2 * q - 1000).astype(np.float32),
            "bias": rng.normal(size=1000).astype(np.float32)}
    cases = [
        ("mucsc bits=1", lambda: mucsc.encode(x, "mucsc", bits=1.0)),
        ("mucsc bits=2", lambda: mucsc.encode(x, "mucsc", bits=2.0)),
        ("mucsc bits=4", lambda: mucsc.encode(x, "mucsc", bits=4.0)),
        ("mucsc max_error=0.05", lambda: mucsc.encode(x, "mucsc", max_error=0.05)),
        ("Policy max_error=0.01 (4 tensors)", lambda: mucsc.encode(ckpt, "mucsc", policy=mucsc.Policy(max_error=0.01))),
        ("bmucsc bits=1", lambda: mucsc.encode(x, "bmucsc", bits=1.0)),
        ("bmucsc max_error=0.3", lambda: mucsc.encode(x, "bmucsc", max_error=0.3)),
    ]
    print(f"d = {d:,}; best of {a.repeat}")
    print("| case | s | s per 1e6 elements | sha256 |")
    print("|---|---|---|---|")
    for name, fn in cases:
        best, blob = float("inf"), b""
        for _ in range(a.repeat):
            t = time.perf_counter()
            blob = fn()
            best = min(best, time.perf_counter() - t)
        print(f"| {name} | {best:.2f} | {best / d * 1e6:.2f} | {hashlib.sha256(blob).hexdigest()[:12]} |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
