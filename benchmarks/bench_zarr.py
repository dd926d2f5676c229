"""mucsc as a numcodecs/zarr codec against numcodecs' own lossy filters, at matched error.

    python benchmarks/bench_zarr.py [--n 1000000] [--chunk 250000]

For each input (Gaussian values; a smooth 2-D field plus noise, as a zarr user might store) and each
codec, the array is encoded chunk by chunk and decoded; the table gives bits per value (encoded bytes
of all chunks x 8 / values), the relative RMS error ||y - x|| / ||x||, the largest absolute error in
units of the input's standard deviation, and encode MB/s (one thread, this process).  The peers are
numcodecs' ``FixedScaleOffset`` (to int8/int16), ``Quantize`` and ``BitRound``, each followed by
``Zstd(level=3)`` as a zarr array's compressor would be; each peer's knob is swept and the setting whose
relative error is closest to, but not above, the mucsc row's is printed next to it ("matched").
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from numcodecs import BitRound, FixedScaleOffset, Quantize, Zstd

from mucsc.numcodecs import Mucsc


def inputs(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    side = int(np.sqrt(n))
    yy, xx = np.mgrid[0:side, 0:side] / side
    field = (np.sin(6 * xx) * np.cos(4 * yy) + 0.5 * np.sin(17 * xx * yy) + 0.05 * rng.normal(size=xx.shape))
    return {"gaussian": rng.normal(size=n).astype(np.float32), "smooth field": field.astype(np.float32).ravel()}


class Chain:
    """A filter followed by a compressor, as zarr applies them to each chunk."""

    def __init__(self, name: str, *codecs):
        self.name, self.codecs = name, codecs

    def encode(self, x: np.ndarray) -> bytes:
        for c in self.codecs:
            x = c.encode(x)
        return bytes(x)

    def decode(self, b: bytes) -> np.ndarray:
        for c in reversed(self.codecs):
            b = c.decode(b)
        return np.frombuffer(b, dtype=np.float32) if isinstance(b, (bytes, bytearray)) else np.asarray(b).view(np.float32)


def measure(codec, x: np.ndarray, chunk: int) -> tuple[float, float, float, float]:
    nbytes, ys, t = 0, [], 0.0
    for i in range(0, x.size, chunk):
        part = x[i:i + chunk]
        t0 = time.perf_counter()
        blob = codec.encode(part)
        t += time.perf_counter() - t0
        nbytes += len(blob)
        ys.append(np.asarray(codec.decode(blob), dtype=np.float32).reshape(-1)[:part.size])
    y = np.concatenate(ys)
    rel = float(np.linalg.norm(y.astype(np.float64) - x) / np.linalg.norm(x.astype(np.float64)))
    worst = float(np.max(np.abs(y.astype(np.float64) - x)) / x.std())
    return nbytes * 8 / x.size, rel, worst, x.nbytes / t / 1e6


def peers(x: np.ndarray) -> list[Chain]:
    z = Zstd(level=3)
    lo, hi = float(x.min()), float(x.max())
    out = []
    for levels in np.unique(np.round(2 ** np.arange(1.5, 12.01, 0.125))).astype(int):
        scale = (levels - 1) / (hi - lo)  # the range onto `levels` integer steps
        astype = "i1" if levels <= 255 else "i2"
        out.append(Chain(f"FixedScaleOffset({levels} levels)+Zstd",
                         FixedScaleOffset(offset=(lo + hi) / 2, scale=scale, dtype="<f4", astype=astype), z))
    out += [Chain(f"Quantize(digits={d})+Zstd", Quantize(digits=d, dtype="<f4"), z) for d in range(0, 5)]
    out += [Chain(f"BitRound(keepbits={k})+Zstd", BitRound(keepbits=k), z) for k in range(0, 12)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--chunk", type=int, default=250_000)
    a = ap.parse_args()
    mucsc_rows = [("mucsc z=16", {"z": 16}), ("mucsc z=4", {"z": 4}), ("mucsc bits=2", {"bits": 2}),
                  ("mucsc bits=4", {"bits": 4}),
                  # deterministic rounding (what storage wants) and its dithered variant, format 1.2
                  ("mucsc z=16 rounding=nearest", {"z": 16, "rounding": "nearest"}),
                  ("mucsc bits=4 rounding=nearest", {"bits": 4, "rounding": "nearest"}),
                  ("mucsc z=16 rounding=dithered", {"z": 16, "rounding": "dithered"}),
                  ("mucsc bits=4 rounding=dithered", {"bits": 4, "rounding": "dithered"}),
                  # an error goal: relative RMS error <= 1% per chunk
                  ("mucsc max_error=0.01 rounding=nearest", {"max_error": 0.01, "rounding": "nearest"})]
    print("| input | codec | bits/value | rel. RMS error | max abs error / std | encode MB/s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for label, x in inputs(a.n).items():
        peer_rows = [(c.name, *measure(c, x, a.chunk)) for c in peers(x)]
        for name, params in mucsc_rows:
            r = measure(Mucsc(dtype="<f4", seed=1, **params), x, a.chunk)
            print(f"| {label} | {name} | {r[0]:.3f} | {r[1]:.4f} | {r[2]:.3f} | {r[3]:.1f} |")
            for family in ("FixedScaleOffset", "Quantize", "BitRound"):
                fits = [p for p in peer_rows if p[0].startswith(family) and p[2] <= r[1]]
                if fits:
                    p = min(fits, key=lambda p: p[1])
                    print(f"| {label} | matched: {p[0]} | {p[1]:.3f} | {p[2]:.4f} | {p[3]:.3f} | {p[4]:.1f} |")
        print(flush=True)


if __name__ == "__main__":
    main()
