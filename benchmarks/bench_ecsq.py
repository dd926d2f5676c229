#!/usr/bin/env python3
"""Entropy-constrained levels (mucsc.codec.numerics.ecsq): J, the DP's rate estimate and the real rANS size.

    python benchmarks/bench_ecsq.py [--d 200000]

For each test distribution and a few multipliers mu (lambda = mu ||x||^2 / d) prints the number of
levels, J / ||x||^2 (the DP's and the one measured in the rounding pass), the DP's estimate of the ID
bits per element, the IDSA payload size per element, and the DP time.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mucsc.codec.numerics import ecsq, quantize
from mucsc.codec.wire import rans


def inputs(d: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"gaussian": rng.normal(size=d), "laplace": rng.laplace(size=d), "student_t3": rng.standard_t(3, d),
            "near_zero_80": np.where(rng.random(d) < 0.8, rng.normal(size=d) * 0.01, rng.normal(size=d))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=200_000)
    a = ap.parse_args()
    print("| data | mu | levels | J/||x||^2 (DP) | J/||x||^2 (rounding) | DP bits/elem | rANS bits/elem | DP s |")
    print("|---|---|---|---|---|---|---|---|")
    for name, x in inputs(a.d).items():
        x = x.astype(np.float32)
        P = ecsq.prepare(x)
        n2 = float(np.dot(x, x.astype(np.float64)))
        for mu in (30, 10, 3, 1, 0.3, 0.1, 0.03, 0.01):
            t = time.perf_counter()
            lv, J, bits = ecsq.solve(P, mu * n2 / a.d)
            dt = time.perf_counter() - t
            w = quantize.wire_centroids(lv, x, np.float32)
            ids, Jr = quantize.stochastic_round(x, w, np.random.default_rng(1), return_J=True)
            size = len(rans.encode(ids, w.size))
            print(f"| {name} | {mu:g} | {lv.size} | {J / n2:.4g} | {Jr / n2:.4g} | {bits / a.d:.3f} | "
                  f"{8 * size / a.d:.3f} | {dt:.2f} |")


if __name__ == "__main__":
    main()
