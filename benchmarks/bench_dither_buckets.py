#!/usr/bin/env python3
"""Dithered grid: one step for the whole vector against QSGD-style bucketed steps, at equal bits.

    python benchmarks/bench_dither_buckets.py [--d 200000] [--bucket 512] [--updates DIR]

Should ``rounding="dithered"`` scale its grid per bucket, as QSGD does (a step per ``--bucket``
elements, proportional to the bucket's RMS or its max |x|, its float32 scale sent: 32 / bucket bits
per element)?  Both variants are evaluated with the same ideal model, so that only the grid differs:
indices q = round(x / step + u) with the dither u uniform in [-1/2, 1/2), their rate the empirical
entropy of q given the dither's context (16 bins of u, as the codec's rANS coder conditions on the
dither), plus the scales; J the exact expected error with the J-minimising share of the dither
subtracted (docs/codecs.md "Rounding": element variance step^2 (f(1-f)(1-share) + share^2/12)).
At each budget b the step (or the bucket steps' common factor) is bisected to the largest J whose rate
fits b.  The real codec's ``mucsc bits=b rounding=dithered`` message (bits and J) is printed next to
the one-step model to show how close the model is to it.

Inputs: Gaussian and Student-t(3) (``bench_frontier.synthetic(d)``, float32) and, with ``--updates``,
every update a ``mucsc sim --save-updates`` directory holds (bench_frontier's real inputs).  For
those a second table: the real codec on the update as its dict of tensors, one grid for all
(``shared=True``) against a grid per tensor (``shared=False``, the codec splits the bits to minimise
the total J).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np

import mucsc

BUDGETS = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)
CONTEXTS = 16


def bench_frontier():
    """benchmarks/bench_frontier.py as a module: its inputs are this benchmark's."""
    spec = importlib.util.spec_from_file_location("bench_frontier", Path(__file__).with_name("bench_frontier.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def cond_entropy_bits(q: np.ndarray, ctx: np.ndarray) -> float:
    """Total bits of q coded with its empirical distribution given ctx (an ideal adaptive coder)."""
    key = q.astype(np.int64) * CONTEXTS + ctx
    _, joint = np.unique(key, return_counts=True)
    ctx_counts = np.bincount(ctx, minlength=CONTEXTS)
    h_joint = -np.sum(joint * np.log2(joint))
    h_ctx = -np.sum(ctx_counts[ctx_counts > 0] * np.log2(ctx_counts[ctx_counts > 0]))
    return float(h_joint - h_ctx)  # n H(q | ctx) = -sum log2 p(q, ctx) + sum log2 p(ctx)


def model(x: np.ndarray, steps: np.ndarray, u: np.ndarray, ctx: np.ndarray, scale_bits: float) -> tuple[float, float]:
    """Bits per element and J (share chosen) of the dithered grid with per-element ``steps``."""
    v = x / steps
    q = np.floor(v + u + 0.5)
    f = v - np.floor(v)
    s2 = steps * steps
    a = float(np.sum(s2 * f * (1 - f)))
    share = min(1.0, 6 * a / float(np.sum(s2))) if a > 0 else 0.0
    J = a * (1 - share) + share * share * float(np.sum(s2)) / 12
    return (cond_entropy_bits(q, ctx) + scale_bits) / x.size, J


def best_within(x, shape: np.ndarray, u, ctx, scale_bits: float, b: float) -> tuple[float, float]:
    """Bisect the factor c of steps = c * shape (log scale) to the smallest J whose rate fits b."""
    lo, hi = -40.0, 20.0  # log2 c: hi fits (one index), lo does not
    for _ in range(30):
        mid = (lo + hi) / 2
        bits, _ = model(x, 2.0 ** mid * shape, u, ctx, scale_bits)
        lo, hi = (lo, mid) if bits <= b else (mid, hi)
    return model(x, 2.0 ** hi * shape, u, ctx, scale_bits)


def bucket_shape(x: np.ndarray, bucket: int, kind: str) -> np.ndarray:
    """Per-element relative step: each bucket's RMS or max |x| (the last bucket may be short)."""
    n = x.size
    pad = np.zeros(-n % bucket, x.dtype)
    xb = np.abs(np.concatenate([x, pad])).reshape(-1, bucket)
    s = np.sqrt(np.mean(xb * xb, axis=1)) if kind == "rms" else xb.max(axis=1)
    s = np.where(s > 0, s, max(float(s.max()), 1e-30))
    return np.repeat(s, bucket)[:n]


def codec_point(data, n: int, n2: float, b: float, **params) -> str:
    """The real codec's ``bits=b`` dithered message as "bits | J/||x||^2", or why it has none."""
    try:
        blob, st = mucsc.encode_with_stats(data, "mucsc", bits=b, rounding="dithered", **params)
    except mucsc.MucscError as exc:  # a budget below the smallest message
        return f"{exc} | -"
    return f"{8 * len(blob) / n:.3f} | {st.J / n2:.4g}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", type=int, default=200_000)
    ap.add_argument("--bucket", type=int, default=512)
    ap.add_argument("--updates", metavar="DIR", help="also every update saved there by mucsc sim --save-updates")
    ap.add_argument("--inputs", default="gaussian,student_t3", help="synthetic inputs (comma-separated)")
    a = ap.parse_args()
    bf = bench_frontier()
    inputs = {k: v.astype(np.float32) for k, v in bf.synthetic(a.d).items() if k in a.inputs.split(",")}
    models = {}
    if a.updates:
        from mucsc.fedsim.updates import read_updates

        for u in read_updates(a.updates):
            e = u.entry
            name = f"{e['dataset']}_{e['model']}_{e['codec']}_round{e['round']}_client{e['client']}"
            inputs[name], models[name] = u.flat(), dict(u.tensors)
    print(f"bucket {a.bucket} elements, float32 scale: {32 / a.bucket:.4f} bits per element; J relative to ||x||^2\n")
    print("| input | b | codec bits | codec J | model, one step: J | bucket steps by RMS: J | by max abs: J "
          "| best bucket J / one-step J |")
    print("|---|---|---|---|---|---|---|---|")
    for name, x32 in inputs.items():
        t = time.perf_counter()
        x = x32.astype(np.float64)
        n2 = float(np.dot(x, x))
        u = np.random.default_rng(1).random(x.size) - 0.5
        ctx = np.minimum(((u + 0.5) * CONTEXTS).astype(np.int64), CONTEXTS - 1)
        scale_bits = 32.0 * -(-x.size // a.bucket)
        shapes = {"rms": bucket_shape(x, a.bucket, "rms"), "max": bucket_shape(x, a.bucket, "max")}
        for b in BUDGETS:
            one = best_within(x, np.ones_like(x), u, ctx, 0.0, b)
            per = {k: best_within(x, s, u, ctx, scale_bits, b) for k, s in shapes.items()}
            best = min(J for _, J in per.values())
            print(f"| {name} | {b:g} | {codec_point(x32, x.size, n2, b)} | {one[1] / n2:.4g} "
                  f"| {per['rms'][1] / n2:.4g} | {per['max'][1] / n2:.4g} | {best / one[1]:.3f} |")
            sys.stdout.flush()
        print(f"<!-- {name}: {time.perf_counter() - t:.0f} s -->")
    if models:
        print("\n| input | b | one grid (shared=True): bits | J | a grid per tensor (shared=False): bits | J "
              "| per-tensor J / one-grid J |")
        print("|---|---|---|---|---|---|---|")
    for name, sd in models.items():
        n2 = sum(float(np.dot(v.reshape(-1), v.reshape(-1).astype(np.float64))) for v in sd.values())
        n = sum(v.size for v in sd.values())
        for b in BUDGETS:
            one, per = (codec_point(sd, n, n2, b, shared=sh) for sh in (True, False))
            ratio = (f"{float(per.rsplit('|', 1)[1]) / float(one.rsplit('|', 1)[1]):.3f}"
                     if "-" not in (one[-1], per[-1]) else "-")
            print(f"| {name} | {b:g} | {one} | {per} | {ratio} |")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
