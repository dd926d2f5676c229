#!/usr/bin/env python3
"""Bytes of an error bound on small isolated vectors: the summary search (what ``max_error=`` runs)
against the trial-encoding search it replaced for them (``ClusterSearch``, still there for budgets on
small groups), in one run.

    python benchmarks/bench_small_goals.py [--repeat 3] [--trial/--no-trial]

Inputs: standard Gaussian and Student-t(3) float32 vectors of 500-8,000 elements at ``max_error=0.01``
and of 8,000-30,000 at ``0.001`` (seed = the length).  Prints a markdown table: input, elements,
bound, bytes of each search, the difference, the summary search's J / the bound's J, and the best
process CPU time of ``--repeat`` encodes each (the machine is shared: CPU time, one BLAS thread).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

import mucsc  # noqa: E402
from mucsc.codec.ratecontrol import summary_search  # noqa: E402

CASES = ([(d, n, 0.01) for d in ("gauss", "t3") for n in (500, 1000, 2000, 4000, 8000)]
         + [(d, n, 0.001) for d in ("gauss", "t3") for n in (8000, 15000, 30000)])


def encoded(x: np.ndarray, max_error: float, repeat: int, trial: bool) -> tuple[int, float, float]:
    """(bytes, J, best CPU seconds) of ``encode(x, max_error=)`` by the summary or the trial search."""
    applies = summary_search.applies
    if trial:
        summary_search.applies = lambda trials, goal=None: False
    try:
        best = float("inf")
        for _ in range(repeat):
            t = time.process_time()
            blob, stats = mucsc.encode_with_stats(x, "mucsc", max_error=max_error)
            best = min(best, time.process_time() - t)
    finally:
        summary_search.applies = applies
    return len(blob), float(stats.J), best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--trial", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the trial search (0.4-6 s per case)")
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} at start; CPU ms, best of {a.repeat}")
    print("| input | n | max_error | summary search B | trial search B | difference | J / bound's J | "
          "summary ms | trial ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for dist, n, bound in CASES:
        rng = np.random.default_rng(n)
        x = (rng.standard_normal(n) if dist == "gauss" else rng.standard_t(3, n)).astype(np.float32)
        size, J, t = encoded(x, bound, a.repeat, False)
        J_goal = bound ** 2 * float(np.square(x.astype(np.float64)).sum())
        trial = ["", "", ""]
        if a.trial:
            tsize, _, tt = encoded(x, bound, 1, True)
            trial = [f"{tsize:,}", f"{100 * (size / tsize - 1):+.1f}%", f"{tt * 1e3:.0f}"]
        print(f"| {dist} | {n:,} | {bound:g} | {size:,} | {trial[0]} | {trial[1]} | {J / J_goal:.4f} | {t * 1e3:.1f} | "
              f"{trial[2]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
