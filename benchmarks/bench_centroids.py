"""Centroid solvers and stochastic rounding: quality (J / J(uniform)) and speed, one thread.

    OMP_NUM_THREADS=1 python benchmarks/bench_centroids.py [--quick]

Quality at d = 1e5 for paper, optimal and exact (exact only where the DP is feasible in seconds);
speed of solve + wire_centroids + stochastic_round on float32 input at d = 1e6 and 1e7 (CPU time,
best of 3, MB/s of float32 input).  Bit packing is not included (see the codec benchmark).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mucsc.codec import kernels
from mucsc.codec.numerics import centroids, quantize

DISTS = ("gauss", "laplace", "t3", "zero80")


def make(name: str, d: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = {
        "gauss": lambda: rng.standard_normal(d),
        "laplace": lambda: rng.laplace(size=d),
        "t3": lambda: rng.standard_t(3, size=d),
        "zero80": lambda: np.where(rng.random(d) < 0.8, 1e-3 * rng.standard_normal(d), rng.standard_normal(d)),
    }[name]()
    return x.astype(np.float32)


def cpu(f, reps=3):
    best, out = np.inf, None
    for _ in range(reps):
        t0 = time.process_time()
        out = f()
        best = min(best, time.process_time() - t0)
    return best, out


def quality(zs, d, exact_max_z):
    print(f"## J / J(uniform), d = {d:g}, float32 data\n")
    print("| data | Z | paper | optimal | exact | optimal/exact - 1 |")
    print("|---|---|---|---|---|---|")
    for name in DISTS:
        x = make(name, d, seed=1)
        for z in zs:
            ju = centroids.variance_J(x, centroids.solve(x, z, "uniform"))
            jp = centroids.variance_J(x, centroids.solve(x, z, "paper", rng=np.random.default_rng(0)))
            jo = centroids.variance_J(x, centroids.solve(x, z))
            if z <= exact_max_z:
                je = centroids.variance_J(x, centroids.solve(x, z, "exact"))
                ex, gap = f"{je / ju:.4f}", f"{jo / je - 1:.1e}"
            else:
                ex = gap = "n/a"
            print(f"| {name} | {z} | {jp / ju:.3f} | {jo / ju:.4f} | {ex} | {gap} |")
    print()


def speed(zs, ds):
    print("## Speed, float32 input, one thread (CPU time, best of 3)\n")
    print("| data | d | Z | solve ms | round ms | total ms | MB/s |")
    print("|---|---|---|---|---|---|---|")
    for name in DISTS:
        for d in ds:
            x = make(name, d, seed=2)
            for z in zs:
                ts, c = cpu(lambda: centroids.solve(x, z))
                tw, cw = cpu(lambda: quantize.wire_centroids(c, x, np.float32))
                tr, _ = cpu(lambda: quantize.stochastic_round(x, cw, np.random.default_rng(0)))
                tot = ts + tw + tr
                print(f"| {name} | {d:.0e} | {z} | {ts * 1e3:.1f} | {(tw + tr) * 1e3:.1f} | "
                      f"{tot * 1e3:.1f} | {x.nbytes / tot / 1e6:.0f} |")
    print()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    a = ap.parse_args()
    print(f"# kernels backend {kernels.BACKEND} (MUCSC_PURE_NUMPY=1 selects numpy)\n")
    if a.quick:
        quality((4, 16), 20_000, 16)
        speed((16,), (1_000_000,))
    else:
        quality((4, 16, 256), 100_000, 16)
        speed((4, 16, 256), (1_000_000, 10_000_000))


if __name__ == "__main__":
    main()
