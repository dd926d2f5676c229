#!/usr/bin/env python3
"""mucsc rounding="dithered" against today's stochastic rounding at the same bits (issue 24).

    python benchmarks/bench_dither.py [--d 200000] [--seeds 10] [--decodes 200]
    python benchmarks/bench_dither.py --speed [--repeat 7] [--updates DIR | --data-dir DIR]

For Gaussian and Student-t(3) vectors (float32, d elements) and b = 1, 2, 3, 4: the message bits per
element and J of ``mucsc bits=b`` (stochastic) and ``mucsc bits=b rounding=dithered``, their J ratio
(issue 24: <= 0.65 at b = 1, <= 0.6 above), the dithered error measured over ``--seeds`` seeds
against the reported J (within 15%), and unbiasedness: the squared norm of the mean of ``--decodes``
decodes (seeds 0..decodes-1) minus x against J / decodes (within 30%; the grid of a fixed z, so every
seed uses the same step).  Exit status 1 when a check fails.

``--speed`` (issue 37) times instead ``bits=b rounding="dithered"`` against the stochastic ``bits=b``
(b = 1, 2), encode and decode, one thread, on the update-like input (d = 1,331,758 float32:
Student-t(3) times 1e-3 with 27% of it zero, ``default_rng(0)``) and on a round-1 FEMNIST update
(the first participant's raw LeNet update from ``mucsc sim --save-updates``; the benchmark runs that
command into a temporary directory from ``--data-dir``, or reads ``--updates DIR``).  Each time is
the best of ``--repeat`` CPU times (``time.process_time``: on a shared machine the wall clock counts
the other jobs), the two roundings alternated; the ratio passes at <= 1.5.  It prints J too: the
dithered message's J must not rise when only its speed is worked on.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import mucsc

TARGET = {1: 0.65, 2: 0.6, 3: 0.6, 4: 0.6}


def inputs(d: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"gaussian": rng.normal(size=d).astype(np.float32),
            "student_t3": rng.standard_t(3, d).astype(np.float32)}


def sq_err(blob: bytes, x: np.ndarray) -> float:
    return float(np.sum((mucsc.decode(blob).astype(np.float64) - x) ** 2))


SPEED_TARGET = 1.5  # dithered / stochastic time, encode and decode (issue 37)


def update_like(d: int = 1_331_758) -> np.ndarray:
    """A synthetic model update: Student-t(3) scaled by 1e-3, 27% of it exactly zero (float32)."""
    rng = np.random.default_rng(0)
    x = rng.standard_t(3, d).astype(np.float32) * np.float32(1e-3)
    x[rng.random(d) < 0.27] = 0
    return x


def femnist_update(data_dir: str, updates_dir: str | None) -> np.ndarray:
    """The first saved update of round 1 (``bench_frontier.fl_updates``: runs ``mucsc sim`` unless
    ``updates_dir``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_frontier import fl_updates

    ups = fl_updates(1, data_dir, updates_dir)
    return next(x for name, x in sorted(ups.items()) if "_round1_" in name).astype(np.float32)


def cpu_best(fns: list, repeat: int) -> list[float]:
    """The least CPU seconds of each of ``fns`` over ``repeat`` rounds, the functions alternated."""
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t = time.process_time()
            fn()
            best[i] = min(best[i], time.process_time() - t)
    return best


def speed(inputs: dict[str, np.ndarray], repeat: int) -> list:
    """The dithered / stochastic time table (encode and decode, b = 1, 2) -> the failed checks."""
    fails = []
    print("| input | b | encode stochastic / dithered ms | ratio | decode stochastic / dithered ms | ratio "
          "| bytes stochastic / dithered | dithered J |")
    print("|---|---|---|---|---|---|---|---|")
    for name, x in inputs.items():
        for b in (1, 2):
            sto = mucsc.encode(x, "mucsc", bits=b)
            dit, st = mucsc.encode_with_stats(x, "mucsc", bits=b, rounding="dithered")
            es, ed = cpu_best([lambda: mucsc.encode(x, "mucsc", bits=b),
                               lambda: mucsc.encode(x, "mucsc", bits=b, rounding="dithered")], repeat)
            ds, dd = cpu_best([lambda: mucsc.decode(sto), lambda: mucsc.decode(dit)], 3 * repeat)
            marks = []
            for what, r in (("encode", ed / es), ("decode", dd / ds)):
                if r > SPEED_TARGET:
                    fails.append((name, b, what))
                    marks.append(" FAIL")
                else:
                    marks.append("")
            print(f"| {name} (d = {x.size:,}) | {b} | {es * 1e3:.1f} / {ed * 1e3:.1f} | {ed / es:.2f}x{marks[0]} "
                  f"| {ds * 1e3:.1f} / {dd * 1e3:.1f} | {dd / ds:.2f}x{marks[1]} | {len(sto):,} / {len(dit):,} "
                  f"| {st.J:.6g} |")
            sys.stdout.flush()
    return fails


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=200_000)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--decodes", type=int, default=200)
    ap.add_argument("--speed", action="store_true", help="the dithered / stochastic time table instead")
    ap.add_argument("--repeat", type=int, default=7, help="--speed: encodes per timing (decodes: 3x)")
    ap.add_argument("--data-dir", default=str(Path(__file__).resolve().parents[2] / "shared/data/femnist-sample"),
                    help="--speed: the FEMNIST sample mucsc sim trains on")
    ap.add_argument("--updates", help="--speed: a directory mucsc sim --save-updates wrote (instead of running it)")
    a = ap.parse_args()
    if a.speed:
        cases = {"update-like": update_like(), "FEMNIST round 1": femnist_update(a.data_dir, a.updates)}
        fails = speed(cases, a.repeat)
        print(f"\nchecks failed: {fails}" if fails else f"\nall ratios <= {SPEED_TARGET}")
        return 1 if fails else 0
    fails = []
    print("| input | b | stochastic bits/elem | stochastic J/||x||^2 | dithered bits/elem | dithered J/||x||^2 "
          "| J ratio (target) | measured / reported J over seeds |")
    print("|---|---|---|---|---|---|---|---|")
    data = inputs(a.d)
    for name, x in data.items():
        n2 = float(np.dot(x, x.astype(np.float64)))
        for b in (1, 2, 3, 4):
            sb, ss = mucsc.encode_with_stats(x, "mucsc", bits=b)
            db, ds = mucsc.encode_with_stats(x, "mucsc", bits=b, rounding="dithered")
            errs, Js = [], []
            for seed in range(a.seeds):
                blob, st = mucsc.encode_with_stats(x, "mucsc", bits=b, rounding="dithered", seed=seed)
                errs.append(sq_err(blob, x))
                Js.append(st.J)
            ratio = ds.J / ss.J
            match = float(np.mean(errs) / np.mean(Js))
            ok = ratio <= TARGET[b] and 8 * len(db) <= b * x.size and abs(match - 1) <= 0.15
            if not ok:
                fails.append((name, b))
            print(f"| {name} | {b} | {8 * len(sb) / x.size:.4f} | {ss.J / n2:.4g} | {8 * len(db) / x.size:.4f} "
                  f"| {ds.J / n2:.4g} | {ratio:.3f} ({TARGET[b]}){'' if ok else ' FAIL'} | {match:.4f} |")
            sys.stdout.flush()
    print(f"\nunbiasedness: mean of {a.decodes} decodes (z = 64 grid, seeds 0..{a.decodes - 1})\n")
    print("| input | ||mean - x||^2 | mean J / decodes | ratio (pass: within 30% of 1) | seconds |")
    print("|---|---|---|---|---|")
    for name, x in data.items():
        t = time.perf_counter()
        total, Js = np.zeros(x.size), []
        for seed in range(a.decodes):
            blob, st = mucsc.encode_with_stats(x, "mucsc", z=64, rounding="dithered", seed=seed)
            total += mucsc.decode(blob)
            Js.append(st.J)
        err = float(np.sum((total / a.decodes - x) ** 2))
        want = float(np.mean(Js)) / a.decodes
        ok = abs(err / want - 1) <= 0.3
        if not ok:
            fails.append((name, "unbiased"))
        print(f"| {name} | {err:.5g} | {want:.5g} | {err / want:.4f}{'' if ok else ' FAIL'} "
              f"| {time.perf_counter() - t:.0f} |")
    print(f"\nchecks failed: {fails}" if fails else "\nall checks pass")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
