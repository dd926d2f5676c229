#!/usr/bin/env python3
"""Peak memory of every codec's encode and decode, as a multiple of the input's bytes.

    python benchmarks/bench_memory.py [--elements 16777216] [--codecs qsgd,terngrad]

Each codec runs in its own subprocess on the same float32 Gaussian vector; ``tracemalloc`` (which sees
numpy's allocations) gives the peak of what ``mucsc.encode(x, codec)`` and ``mucsc.decode(blob)``
allocate on top of what is alive before the call (the input; for decode, the message).  The decode
figure includes its output (one input's worth).  Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import json, sys, tracemalloc, numpy as np, mucsc
codec, n = sys.argv[1], int(sys.argv[2])
params = json.loads(sys.argv[3])
x = np.random.default_rng(0).normal(size=n).astype(np.float32)
tracemalloc.start()
base = tracemalloc.get_traced_memory()[0]
blob = mucsc.encode(x, codec, **params)
enc = tracemalloc.get_traced_memory()[1] - base
tracemalloc.reset_peak()
base = tracemalloc.get_traced_memory()[0]
y = mucsc.decode(blob, max_elements=None)
dec = tracemalloc.get_traced_memory()[1] - base
print(json.dumps({"enc": enc, "dec": dec, "bytes": len(blob), "input": x.nbytes}))
"""

EXTRA = [("qsgd", {"coding": "elias"}), ("terngrad", {"packing": "base3"}), ("mucsc", {"z": 256})]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--elements", type=int, default=1 << 24)
    ap.add_argument("--codecs", help="comma-separated codec names (default: every codec, and a few variants)")
    args = ap.parse_args()
    import mucsc

    cases = [(c, {}) for c in mucsc.available_codecs()] + EXTRA
    if args.codecs:
        cases = [(c, p) for c, p in cases if c in args.codecs.split(",")]
    print(f"float32 Gaussian, {args.elements:,} elements ({4 * args.elements / 2**20:.0f} MiB); peak allocated "
          "during the call / input bytes")
    print("| codec | params | encode peak | decode peak (incl. output) | message bytes |")
    print("|---|---|---|---|---|")
    for codec, params in cases:
        out = subprocess.run([sys.executable, "-c", CHILD, codec, str(args.elements), json.dumps(params)],
                             capture_output=True, text=True)
        if out.returncode:
            print(f"| {codec} | {params} | failed: {out.stderr.strip().splitlines()[-1]} | | |")
            continue
        r = json.loads(out.stdout)
        p = " ".join(f"{k}={v}" for k, v in params.items()) or "defaults"
        print(f"| {codec} | {p} | {r['enc'] / r['input']:.2f}x | {r['dec'] / r['input']:.2f}x | {r['bytes']:,} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
