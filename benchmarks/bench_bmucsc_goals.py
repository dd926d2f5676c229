#!/usr/bin/env python3
"""B-MUCSC with a goal (bits= / max_error=): what keep fraction and kept-set coding it picks, what
it sends and the J it reaches, against the paper's fixed setting (keep 1%, Z = 256).

    python benchmarks/bench_bmucsc_goals.py [--d 200000]

Inputs as benchmarks/bench_frontier.py's synthetic ones (float32, seed 0).  Prints one markdown
table: per input and goal, the chosen keep and Z, the ID coding, message bits per element, J / ||x||^2
(J = the kept set's variance + the rest's squared deviation from its mean), and the encode time.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_frontier import synthetic  # noqa: E402

import mucsc  # noqa: E402

GOALS = ({}, {"bits": 0.1}, {"bits": 0.25}, {"bits": 0.5}, {"bits": 1.0}, {"bits": 2.0},
         {"max_error": 0.5}, {"max_error": 0.2}, {"keep": 0.01, "bits": 0.25})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=200_000)
    a = ap.parse_args()
    print("| input | goal | keep | Z | IDs | bits/elem | J/‖x‖² | sqrt(J)/‖x‖ | encode s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, x in synthetic(a.d).items():
        x = x.astype(np.float32)
        n2 = float(np.dot(x, x.astype(np.float64)))
        for goal in GOALS:
            label = ", ".join(f"{k}={v:g}" for k, v in goal.items()) or "default (keep 0.01, z 256)"
            t = time.perf_counter()
            try:
                blob, st = mucsc.encode_with_stats(x, "bmucsc", **goal)
            except mucsc.MucscError as exc:
                print(f"| {name} | {label} | refused: {exc} | | | | | | |")
                continue
            dt = time.perf_counter() - t
            p = mucsc.inspect(blob).groups[0].params
            print(f"| {name} | {label} | {p['keep']:g} | {p['centroids']} | {p.get('id_coding', 'packed')} | "
                  f"{8 * len(blob) / x.size:.3f} | {st.J / n2:.4g} | {math.sqrt(st.J / n2):.3g} | {dt:.1f} |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
