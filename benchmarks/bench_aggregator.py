#!/usr/bin/env python3
"""mucsc.Aggregator against decoding every message: accuracy, memory and time of a server's FedAvg sum.

    python benchmarks/bench_aggregator.py [--messages 150] [--d 1000000] [--server-d 100000]
                                          [--clients 10,100,1000] [--codec mucsc] [--repeat 3]

Part 1: ``--messages`` messages of ``--d`` elements (float32 Gaussian updates, each its own vector and
seed, the codec's defaults), weights 1..M: the largest |Aggregator.result() - weighted mean of the
decodes| (that mean summed in float64), the peak memory the M ``add`` calls allocate on top of what is
alive before them (``tracemalloc``, which sees numpy's buffers; the float64 sum is 8 bytes per
element of it), and ``add()`` time against one ``mucsc.decode`` of the same message (each message
decoded, then added, interleaved so both see the same load, each ``--repeat`` times keeping the
fastest; the median of the per-message ratios, and the ratio of the fastest of all).

Part 2: a server's peak memory for K = ``--clients`` messages of ``--server-d`` elements: summing them
with an Aggregator as they arrive, against decoding them all into a list and then averaging (what a
server does that hands the decoded replies to its strategy).  K messages are cycled from 16 encoded
ones (the memory does not depend on which bytes they hold).  Prints markdown tables.
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

import numpy as np

import mucsc


def _update(i: int, d: int) -> np.ndarray:
    return np.random.default_rng(i).normal(scale=1e-3, size=d).astype(np.float32)


def part1(messages: int, d: int, codec: str, repeat: int) -> None:
    t0 = time.perf_counter()
    blobs = [mucsc.encode(_update(i, d), codec, seed=i) for i in range(messages)]
    weights = [float(i + 1) for i in range(messages)]
    print(f"Part 1: {messages} messages of d = {d:,} ({codec}, mean {np.mean([len(b) for b in blobs]):,.0f} B each; "
          f"encoded in {time.perf_counter() - t0:.0f} s)\n")
    ref = np.zeros(d, np.float64)
    for b, w in zip(blobs, weights):
        ref += np.float64(w) * mucsc.decode(b).astype(np.float64)
    ref /= sum(weights)
    t_dec, t_add = [], []
    timed = mucsc.Aggregator()
    for b, w in zip(blobs, weights):  # interleaved, so that both see the same load; best of `repeat`
        dec, add = [], []
        for _ in range(repeat):
            t = time.perf_counter()
            mucsc.decode(b)
            dec.append(time.perf_counter() - t)
            t = time.perf_counter()
            timed.add(b, weight=w)
            add.append(time.perf_counter() - t)
        t_dec.append(min(dec))
        t_add.append(min(add))
    agg = mucsc.Aggregator()
    tracemalloc.start()  # (not while timing: it slows every allocation)
    base = tracemalloc.get_traced_memory()[0]
    for b, w in zip(blobs, weights):
        agg.add(b, weight=w)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    mean = agg.result()
    err = float(np.max(np.abs(mean.astype(np.float64) - ref)))
    print("| messages | d | max abs error vs mean of decodes | peak memory growth of the adds | "
          "decode median (best) | add median (best) | add / decode: median of the pairs (of the bests) |")
    print("|---|---|---|---|---|---|---|")
    md, ma = statistics.median(t_dec), statistics.median(t_add)
    pairs = statistics.median(a / b for a, b in zip(t_add, t_dec))
    print(f"| {messages} | {d:,} | {err:.2e} | {peak / 2**20:.1f} MiB | {md * 1e3:.2f} ms ({min(t_dec) * 1e3:.2f}) | "
          f"{ma * 1e3:.2f} ms ({min(t_add) * 1e3:.2f}) | {pairs:.2f}x ({min(t_add) / min(t_dec):.2f}x) |\n")


def _peak(fn) -> int:
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    fn()
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return peak


def part2(clients: list[int], d: int, codec: str) -> None:
    distinct = [mucsc.encode(_update(i, d), codec, seed=i) for i in range(16)]
    print(f"Part 2: a server's peak memory for K messages of d = {d:,} ({codec}; float32 model {4 * d / 2**20:.1f} MiB)\n")
    print("| K | Aggregator (sum as they arrive) | decode all, then average | ratio |")
    print("|---|---|---|---|")
    for k in clients:
        blobs = [distinct[i % len(distinct)] for i in range(k)]

        def summed() -> None:
            agg = mucsc.Aggregator()
            for i, b in enumerate(blobs):
                agg.add(b, weight=float(i + 1))
            agg.result()

        def listed() -> None:
            decoded = [mucsc.decode(b) for b in blobs]
            total = sum(float(i + 1) for i in range(k))
            acc = np.zeros(d, np.float64)
            for i, x in enumerate(decoded):
                acc += float(i + 1) * x.astype(np.float64)
            (acc / total).astype(np.float32)

        a, b = _peak(summed), _peak(listed)
        print(f"| {k:,} | {a / 2**20:.1f} MiB | {b / 2**20:.1f} MiB | {b / a:.0f}x |")
    print()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=150)
    ap.add_argument("--d", type=int, default=1_000_000)
    ap.add_argument("--server-d", type=int, default=100_000)
    ap.add_argument("--clients", default="10,100,1000")
    ap.add_argument("--codec", default="mucsc")
    ap.add_argument("--repeat", type=int, default=3, help="timings per message, the fastest kept [3]")
    args = ap.parse_args()
    part1(args.messages, args.d, args.codec, args.repeat)
    part2([int(k) for k in args.clients.split(",")], args.server_d, args.codec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
