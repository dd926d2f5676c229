#!/usr/bin/env python3
"""What authenticating a message costs: tag and verify time per message (keyed BLAKE2b-256, Ed25519).

    python benchmarks/bench_auth.py                # 1 MB and 100 MB messages
    python benchmarks/bench_auth.py --sizes 1,10   # other sizes (MB)

Messages are real mucsc messages (codec "none", float32 values, so the size is ~4 bytes per element).
For each size and algorithm, best of --repeat runs, one thread:
- tag: computing the tag over the message, what ``encode(..., key=)`` adds to an encode;
- verify: ``mucsc.authenticate`` (preamble + trailer read, tag checked), what a server pays per
  message before it decides to decode;
- reference lines: CRC-32 over the same bytes (every reader pays it already), a full
  ``mucsc.decode`` of the message, and (up to 10 MB) the decode of a mucsc (Z = 16) message of the
  same size -- what a forged message would cost a server that decodes before it authenticates.
"""

from __future__ import annotations

import argparse
import platform
import zlib

import numpy as np
from bench_codec import best_time, cpu_model  # this directory: one thread, best-of timing

import mucsc
from mucsc.codec.wire.auth import Signer

CONTEXT = b"run-4/round-9/up"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,100", help="message sizes in MB (10^6 bytes), comma-separated")
    ap.add_argument("--repeat", type=int, default=0, help="runs per measurement (default: 30 at <= 10 MB, else 5)")
    args = ap.parse_args()
    keys = {"blake2b-256": mucsc.generate_key("blake2b"), "ed25519": mucsc.generate_key("ed25519")}
    print(f"CPU: {cpu_model()}, python {platform.python_version()}, mucsc {mucsc.__version__}")
    print("| message | step | blake2b-256 µs | ed25519 µs | blake2b-256 MB/s | ed25519 MB/s |")
    print("|---|---|---|---|---|---|")
    for mb in (float(s) for s in args.sizes.split(",")):
        n = int(mb * 1e6) // 4
        x = np.random.default_rng(0).normal(size=n).astype(np.float32)
        plain = mucsc.encode(x, "none", compress="off")
        del x
        repeat = args.repeat or (30 if mb <= 10 else 5)
        size = len(plain)
        rows = {"tag": {}, "verify": {}}
        for alg, key in keys.items():
            signer = Signer(key, "client-17", CONTEXT)
            rows["tag"][alg] = best_time(lambda: signer.tag([plain]), repeat)
            blob = mucsc.sign(plain, key, "client-17", CONTEXT)
            verify_keys = {"client-17": mucsc.public_key(key)}
            rows["verify"][alg] = best_time(lambda: mucsc.authenticate(blob, verify_keys, CONTEXT), repeat)
        crc = best_time(lambda: zlib.crc32(plain), repeat)
        dec = best_time(lambda: mucsc.decode(plain, max_expansion=None), max(3, repeat // 5))
        label = f"{size / 1e6:.1f} MB"
        mucsc_dec = None
        if mb <= 10:  # 4-bit ids: twice as many elements as bytes
            y = np.random.default_rng(1).normal(size=2 * int(mb * 1e6)).astype(np.float32)
            m = mucsc.encode(y, "mucsc", z=16, compress="off")
            del y
            mucsc_dec = best_time(lambda: mucsc.decode(m, max_expansion=None), max(3, repeat // 5)), len(m)
        for step, r in rows.items():
            b, e = r["blake2b-256"], r["ed25519"]
            print(f"| {label} | {step} | {b * 1e6:.0f} | {e * 1e6:.0f} | {size / b / 1e6:.0f} | {size / e / 1e6:.0f} |")
        print(f"| {label} | (CRC-32, for reference) | {crc * 1e6:.0f} | | {size / crc / 1e6:.0f} | |")
        print(f"| {label} | (decode, for reference) | {dec * 1e6:.0f} | | {size / dec / 1e6:.0f} | |")
        if mucsc_dec:
            t, n = mucsc_dec
            print(f"| {n / 1e6:.1f} MB | (decode of a mucsc Z=16 message, for reference) | {t * 1e6:.0f} | "
                  f"| {n / t / 1e6:.0f} | |")


if __name__ == "__main__":
    main()
