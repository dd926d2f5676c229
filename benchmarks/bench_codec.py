#!/usr/bin/env python3
"""Encode/decode throughput, peak memory and J of the mucsc codec, with zstd -3 as a reference line.

    python benchmarks/bench_codec.py            # d = 1e6 and 1e7, Z = 4, 16, 256
    python benchmarks/bench_codec.py --quick    # d = 1e6 only
    MUCSC_PURE_NUMPY=1 python benchmarks/bench_codec.py   # the numpy fallback instead of the C kernels

Throughput is MB/s of float32 input (4 bytes per element), best of --repeat runs, one thread.
Peak memory is tracemalloc's peak during one encode (numpy reports its buffers to it), as a
multiple of the input's size.  J/J(uniform) compares the J of the default solver's encoding with uniform levels' (exact J, full data).
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402

import numpy as np  # noqa: E402
import zstandard  # noqa: E402

import mucsc  # noqa: E402
from mucsc.codec import kernels  # noqa: E402


def best_time(fn, repeat):
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def peak_ratio(fn, nbytes):
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / nbytes


def cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes = [10**6] if args.quick else [10**6, 10**7]
    print(f"# {cpu_model()}, {os.cpu_count()} cores, one thread; numpy {np.__version__}, mucsc {mucsc.__version__}, "
          f"kernels backend {kernels.BACKEND}")
    print("| d | codec | bytes | bits/elem | encode MB/s | decode MB/s | peak mem / input | J / J(uniform) |")
    print("|---|---|---|---|---|---|---|---|")
    for d in sizes:
        x = np.random.default_rng(0).normal(size=d).astype(np.float32)
        mb = x.nbytes / 1e6
        raw = x.tobytes()
        cctx, dctx = zstandard.ZstdCompressor(level=3), zstandard.ZstdDecompressor()
        z3 = cctx.compress(raw)
        te = best_time(lambda: cctx.compress(raw), args.repeat)
        td = best_time(lambda: dctx.decompress(z3), args.repeat)
        print(f"| {d:.0e} | zstd -3 (lossless reference) | {len(z3)} | {8 * len(z3) / d:.2f} | {mb / te:.0f} | "
              f"{mb / td:.0f} | - | 0 |")
        for z in (4, 16, 256):
            blob = mucsc.encode(x, z=z)
            te = best_time(lambda: mucsc.encode(x, z=z), args.repeat)
            td = best_time(lambda: mucsc.decode(blob), args.repeat)
            peak = peak_ratio(lambda: mucsc.encode(x, z=z), x.nbytes)
            j_opt = mucsc.encode_with_stats(x, z=z)[1].J
            j_uni = mucsc.encode_with_stats(x, z=z, solver="uniform")[1].J
            print(f"| {d:.0e} | mucsc z={z} | {len(blob)} | {8 * len(blob) / d:.2f} | {mb / te:.0f} | "
                  f"{mb / td:.0f} | {peak:.2f}x | {j_opt / j_uni:.3f} |")


if __name__ == "__main__":
    main()
