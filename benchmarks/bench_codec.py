#!/usr/bin/env python3
"""Encode/decode throughput, peak memory and J of the mucsc codec, with zstd -3 as a reference line.

    python benchmarks/bench_codec.py            # d = 1e6 and 1e7, Z = 4, 16, 256
    python benchmarks/bench_codec.py --quick    # d = 1e6 only
    MUCSC_PURE_NUMPY=1 python benchmarks/bench_codec.py   # the numpy fallback instead of the C kernels
    python benchmarks/bench_codec.py --threads 1,2 --d 3e7 --z 16 --repeat 5   # thread scaling
    python benchmarks/bench_codec.py --stages --d 3e7 --z 16 --repeat 5        # decode, stage by stage
    python benchmarks/bench_codec.py --assembly --d 3e7 --z 16 --repeat 5      # the writer's share of an encode

Throughput is MB/s of float32 input (4 bytes per element), best of --repeat runs, one thread.
With --threads: encode and decode of one d-element vector with each thread count, the thread
counts interleaved within every repetition (so load changes hit all of them alike), best of
--repeat, speed-up against the first count, and whether every count wrote the same bytes.
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


def cpu_ticks():
    """(busy, total) clock ticks of the whole machine from /proc/stat (None where it does not exist)."""
    try:
        with open("/proc/stat") as f:
            v = [int(t) for t in f.readline().split()[1:]]
    except OSError:
        return None
    idle = v[3] + (v[4] if len(v) > 4 else 0)
    return sum(v) - idle, sum(v)


def others_share(t0, c0):
    """Share of the machine's CPU time used by other processes since (ticks t0, own CPU seconds c0)."""
    t1 = cpu_ticks()
    if t0 is None or t1 is None or t1[1] == t0[1]:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    own = (time.process_time() - c0) * hz
    return max(0.0, (t1[0] - t0[0] - own) / (t1[1] - t0[1]))


def scaling(threads, d, z, repeat):
    """Interleaved best-of-``repeat`` encode/decode times for each thread count."""
    x = np.random.default_rng(0).normal(size=d).astype(np.float32)
    mb = x.nbytes / 1e6
    blobs = {t: mucsc.encode(x, z=z, threads=t) for t in threads}  # also warms every pool up
    same = len(set(blobs.values())) == 1
    blob = blobs[threads[0]]
    ref = mucsc.decode(blob)
    same_out = all(np.array_equal(mucsc.decode(blob, threads=t), ref) for t in threads)
    enc = {t: float("inf") for t in threads}
    dec = {t: float("inf") for t in threads}
    ticks, cpu0 = cpu_ticks(), time.process_time()
    for _ in range(repeat):
        for t in threads:
            t0 = time.perf_counter()
            mucsc.encode(x, z=z, threads=t)
            enc[t] = min(enc[t], time.perf_counter() - t0)
            t0 = time.perf_counter()
            mucsc.decode(blob, threads=t)
            dec[t] = min(dec[t], time.perf_counter() - t0)
    print(f"# {cpu_model()}, {os.cpu_count()} cores; numpy {np.__version__}, kernels backend {kernels.BACKEND}; "
          f"d = {d:.0e} float32 N(0,1), Z = {z}, best of {repeat} interleaved")
    share = others_share(ticks, cpu0)
    print(f"# identical message bytes for all thread counts: {same}; identical decoded values: {same_out}")
    if share is not None:
        print(f"# other processes used {100 * share:.0f}% of the machine's CPU time during the timed runs "
              f"(load average {os.getloadavg()[0]:.2f}; a one-thread run leaves the other cores to them); "
              "when they compete for the cores the speed-ups are not reliable")
    print("| threads | encode ms | encode MB/s | encode speed-up | decode ms | decode MB/s | decode speed-up |")
    print("|---|---|---|---|---|---|---|")
    t1 = threads[0]
    for t in threads:
        print(f"| {t} | {enc[t] * 1e3:.1f} | {mb / enc[t]:.0f} | {enc[t1] / enc[t]:.2f}x | {dec[t] * 1e3:.1f} | "
              f"{mb / dec[t]:.0f} | {dec[t1] / dec[t]:.2f}x |")
    if not (same and same_out):
        raise SystemExit("bytes differ between thread counts")


def decode_stages(d, z, repeat):
    """Where one decode's time goes (one thread, best of ``repeat``): the stages run one by one,
    minor page faults counted with getrusage, and the gather into an already touched array as the
    ceiling of what a fresh output allows."""
    import resource

    from mucsc.codec.wire import container as fmt
    from mucsc.codec import parallel

    x = np.random.default_rng(0).normal(size=d).astype(np.float32)
    blob = mucsc.encode(x, z=z)
    msg = fmt.read_message(blob)
    secs = msg.group_sections(0)
    info = next(s for s in msg.sections if s.tag == "IDS_")
    width = msg.header.groups[0].params["id_bits"]
    cent = np.frombuffer(bytes(secs["CENT"]), np.float32)
    stored = memoryview(blob)[info.offset: info.offset + info.stored_bytes]
    raw = bytes(secs["IDS_"])
    touched = np.ones(d, np.float32)

    def faults(fn):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fn()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    stages = [
        ("read_message (CRC-32, section table, HEAD)", lambda: fmt.read_message(blob)),
        (f"zstd: IDS_ {info.stored_bytes / 1e6:.1f} MB -> {info.raw_bytes / 1e6:.1f} MB, one call",
         lambda: fmt.zstd_decompress_bounded(stored, info.raw_bytes, "IDS_")),
        ("unpack + gather into a new array", lambda: parallel.unpack_take(raw, width, d, cent, ValueError)),
        ("unpack + gather into an array already touched (no page faults: the ceiling)",
         lambda: parallel.unpack_take(raw, width, d, cent, ValueError, out=touched)),
        ("whole decode, threads=1", lambda: mucsc.decode(blob)),
        ("whole decode, threads=2 (zstd overlapped with the gather)", lambda: mucsc.decode(blob, threads=2)),
    ]
    print(f"# {cpu_model()}, {os.cpu_count()} cores; numpy {np.__version__}, kernels backend {kernels.BACKEND}; "
          f"d = {d:.0e} float32 N(0,1), Z = {z}, best of {repeat}")
    if info.encoding != "zstd":  # stored raw: nothing to decompress
        stages = [st for st in stages if not st[0].startswith("zstd")]
    print("| decode stage | ms | GB/s of float32 output | minor page faults |")
    print("|---|---|---|---|")
    for name, fn in stages:
        fn()
        t = best_time(fn, repeat)
        print(f"| {name} | {t * 1e3:.1f} | {x.nbytes / t / 1e9:.1f} | {faults(fn)} |")


def assembly(d, z, repeat):
    """The message writer's share of an encode (issue 16's host work): the whole encode and
    ``format.write_message`` alone on the same sections (as host bytes), for compress off / default
    and 1 / all threads, best of ``repeat``, with the minor page faults of one write and a digest of the
    message (equal digests: equal bytes, e.g. before and after a change of the writer)."""
    import hashlib
    import resource

    from mucsc.codec.wire import container as fmt
    from mucsc.codec import parallel

    x = np.random.default_rng(0).normal(size=d).astype(np.float32)
    print(f"# {cpu_model()}, {os.cpu_count()} cores; numpy {np.__version__}, kernels backend {kernels.BACKEND}; "
          f"d = {d:.0e} float32 N(0,1), Z = {z}, best of {repeat}")
    print("| compress | threads | whole encode ms | write_message ms | write faults | message MB | sha256 |")
    print("|---|---|---|---|---|---|---|")
    for compress, level in (("off", None), ("default", 3)):
        kw = {"compress": "off"} if level is None else {}
        enc = mucsc.get_codec("mucsc", z=z).encode_array(x, np.random.default_rng([0, 0]))
        secs = [(0, s.tag, s.tobytes(), s.compressible) for s in enc.sections]
        header = fmt.read_message(mucsc.encode(x, z=z, **kw)).header
        for t in (1, parallel.resolve(0)):  # one thread, all cores
            def write():
                with parallel.using(t):
                    return fmt.write_message(header, secs, zstd_level=level, threads=t)
            blob = mucsc.encode(x, z=z, threads=t, **kw)
            te = best_time(lambda: mucsc.encode(x, z=z, threads=t, **kw), repeat)
            write()
            tw = best_time(write, repeat)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            write()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            print(f"| {compress} | {t} | {te * 1e3:.1f} | {tw * 1e3:.1f} | {faults} | {len(blob) / 1e6:.1f} | "
                  f"{hashlib.sha256(blob).hexdigest()[:12]} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", help="comma-separated thread counts: run the scaling table instead")
    ap.add_argument("--d", type=float, default=3e7, help="vector length of the scaling table")
    ap.add_argument("--z", type=int, default=16, help="Z of the scaling table")
    ap.add_argument("--stages", action="store_true", help="time the decode's stages one by one (--d, --z)")
    ap.add_argument("--assembly", action="store_true", help="time the message writer's share of an encode (--d, --z)")
    args = ap.parse_args()
    if args.assembly:
        assembly(int(args.d), args.z, args.repeat)
        return
    if args.stages:
        decode_stages(int(args.d), args.z, args.repeat)
        return
    if args.threads:
        scaling([int(t) for t in args.threads.split(",")], int(args.d), args.z, args.repeat)
        return
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
