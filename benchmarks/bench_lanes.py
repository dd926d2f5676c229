#!/usr/bin/env python3
"""Format 1.2's lane-coded IDs (IDSL) against the format 1.0 default (zstd on the packed IDs), on the host.

    python benchmarks/bench_lanes.py                       # d = 1e6, 1e7; threads 1, 2
    python benchmarks/bench_lanes.py --d 1e6,3e7 --threads 1,2,4,8,16 --repeat 5
    python benchmarks/bench_lanes.py --d 1e7 --threads 1 --clock cpu --repeat 9   # on a loaded machine

For each d (float32 N(0,1), mucsc Z = 16, seed 0): the default message (``id_coding="auto"``: IDSL
when smaller) and ``id_coding="packed"`` (the previous default: IDS_ zstd-compressed), and zstd -3 on
the float32 bytes as the lossless reference line.  Columns: message bytes, bits per element, the
largest zstd section's share of the message, encode and decode MB/s of float32 input with each thread
count, best of --repeat with the variants interleaved in every repetition (load changes hit them
alike), and the default's decode rate as a multiple of the packed path's and of zstd -3's decompress
(same run).  Checks, printed: the bytes are identical for every thread count, the decoded values too, and
(with torch installed) a CPU tensor on the torch backend writes the same bytes.  ``--clock cpu``
times by the process's CPU time instead of the wall clock: on a machine shared with other jobs the
one-thread figures then count only this process's work (with more threads it sums theirs: a cost,
not a latency).  A decode writes its output where a freed one was when it can (``mucsc.heap``:
freed outputs of 4 MiB and more are kept mapped, as glibc keeps smaller blocks); ``--keep-outputs``
holds every output (zstd's too) until the last repetition, so that each decode writes fresh memory.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import zstandard  # noqa: E402

import mucsc  # noqa: E402
from mucsc.codec.wire import container as fmt  # noqa: E402
from mucsc.codec import kernels  # noqa: E402


def zstd_share(blob: bytes) -> float:
    """The largest zstd-encoded section's share of the message (0 when none)."""
    msg = fmt.read_message(blob)
    return max((s.stored_bytes / len(blob) for s in msg.sections if s.encoding == "zstd"), default=0.0)


def torch_same(x: np.ndarray, blob: bytes) -> str:
    try:
        import torch
    except ImportError:
        return "torch not installed"
    was, kernels.TORCH = kernels.TORCH, True
    try:
        return str(mucsc.encode(torch.from_numpy(x), "mucsc", seed=0) == blob)
    finally:
        kernels.TORCH = was


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d", default="1e6,1e7")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--keep-outputs", action="store_true",
                    help="hold every decoded output (and zstd's) until the last repetition: each decode then "
                         "writes memory never used before, as a server that keeps a round's updates does")
    args = ap.parse_args()
    now = time.perf_counter if args.clock == "wall" else time.process_time
    threads = [int(t) for t in args.threads.split(",")]
    load0 = os.getloadavg()[0]
    print(f"# {os.cpu_count()} cores, kernels backend {kernels.BACKEND}, numpy {np.__version__}, "
          f"best of {args.repeat} interleaved, {args.clock} clock"
          f"{', outputs kept' if args.keep_outputs else ''}; load average {load0:.2f} at the start")
    print("| d | variant | bytes | bits/elem | largest zstd section | "
          + " | ".join(f"encode MB/s T={t}" for t in threads) + " | "
          + " | ".join(f"decode MB/s T={t}" for t in threads) + " |")
    print("|---|---|---|---|---|" + "---|" * (2 * len(threads)))
    for d in (int(float(s)) for s in args.d.split(",")):
        x = np.random.default_rng(0).normal(size=d).astype(np.float32)
        mb = x.nbytes / 1e6
        variants = {"default (auto: IDSL)": {}, "id_coding=packed (1.0 default)": {"id_coding": "packed"}}
        blobs = {v: mucsc.encode(x, "mucsc", seed=0, **kw) for v, kw in variants.items()}
        checks = []
        for v, kw in variants.items():
            same = all(mucsc.encode(x, "mucsc", seed=0, threads=t, **kw) == blobs[v] for t in threads)
            ref = mucsc.decode(blobs[v])
            same_out = all(np.array_equal(mucsc.decode(blobs[v], threads=t), ref) for t in threads)
            checks.append(f"{v}: bytes identical for threads {args.threads}: {same}, decoded identical: {same_out}")
        checks.append(f"MUCSC_BACKEND=torch (CPU tensor) writes the default's bytes: "
                      f"{torch_same(x, blobs['default (auto: IDSL)'])}")
        cctx, dctx = zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()
        zblob = cctx.compress(x.tobytes())
        enc = {(v, t): float("inf") for v in variants for t in threads}
        dec = dict(enc)
        zt = [float("inf"), float("inf")]
        kept = []  # --keep-outputs: every output of this d, alive until its repetitions end
        for _ in range(args.repeat):
            for v, kw in variants.items():
                for t in threads:
                    t0 = now()
                    mucsc.encode(x, "mucsc", seed=0, threads=t, **kw)
                    enc[v, t] = min(enc[v, t], now() - t0)
                    t0 = now()
                    out = mucsc.decode(blobs[v], threads=t)
                    dec[v, t] = min(dec[v, t], now() - t0)
                    kept += [out] if args.keep_outputs else []
                    del out
            t0 = now()
            cctx.compress(x.tobytes())
            zt[0] = min(zt[0], now() - t0)
            t0 = now()
            out = dctx.decompress(zblob)
            zt[1] = min(zt[1], now() - t0)
            kept += [out] if args.keep_outputs else []
            del out
        del kept
        for v in variants:
            b = blobs[v]
            print(f"| {d:.0e} | {v} | {len(b)} | {8 * len(b) / d:.4f} | {100 * zstd_share(b):.1f}% | "
                  + " | ".join(f"{mb / enc[v, t]:.0f}" for t in threads) + " | "
                  + " | ".join(f"{mb / dec[v, t]:.0f}" for t in threads) + " |")
        print(f"| {d:.0e} | zstd -3 on the floats (reference, 1 thread) | {len(zblob)} | {8 * len(zblob) / d:.2f} | - | "
              f"{mb / zt[0]:.0f} |" + " |" * (len(threads) - 1) + f" {mb / zt[1]:.0f} |" + " |" * (len(threads) - 1))
        dv, pv = "default (auto: IDSL)", "id_coding=packed (1.0 default)"
        t1 = 1 if 1 in threads else threads[0]
        print(f"#   d = {d:.0e}: default decode, T={t1}: {dec[pv, t1] / dec[dv, t1]:.2f}x the packed path's rate, "
              f"{zt[1] / dec[dv, t1]:.2f}x zstd -3's decompress (one thread)")
        for c in checks:
            print(f"#   d = {d:.0e}: {c}")
    print(f"# load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
