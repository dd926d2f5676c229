#!/usr/bin/env python3
"""Every codec on one d = 1.3e6 update: bytes, bits/element, ratio, encode/decode MB/s, relative error.

    python benchmarks/bench_codecs.py               # Gaussian + ALL-CNN update tables, ID entropy table
    python benchmarks/bench_codecs.py --quick       # Gaussian only, no timing repeats
    python benchmarks/bench_codecs.py --markdown    # tables as Markdown (docs/codecs.md)

Updates: (1) "gaussian": d = 1,300,000 standard normal float32; (2) "allcnn": a real local update
U = w_0 - w_5 of ALL-CNN-C (mucsc.fedsim.models.all_cnn, d = 1,369,738) after 5 SGD steps (batch 8,
lr 0.05) on scikit-learn's digits images (8x8 upsampled to 32x32, 3 channels), as a client of the
paper's setup would send (needs torch and scikit-learn).  Everything goes through mucsc.encode /
mucsc.decode with the default compress="auto"; MB/s is of float32 input (4 bytes per element), best
of --repeat runs, one thread; relative error is ||decode(U) - U|| / ||U|| of the seed-0 encoding.
The ID table measures entropy vs achieved bits of zstd'd cluster IDs (levels 3 = default, and 19).
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import mucsc  # noqa: E402

CODECS = [
    ("none", {}), ("fp16", {}),
    ("mucsc", {"z": 4}), ("mucsc", {"z": 16}),
    ("bmucsc", {}), ("bmucsc", {"positions": "paper"}), ("bmucsc", {"z": 16}),
    ("qsgd", {"s": 1}), ("qsgd", {"s": 1, "coding": "elias"}), ("qsgd", {"s": 15}),
    ("qsgd", {"s": 15, "coding": "elias"}), ("qsgd", {"s": 255}),
    ("signsgd", {}), ("terngrad", {}), ("terngrad", {"packing": "base3"}),
    ("stc", {}), ("dgc", {}), ("dgc", {"positions": "paper"}), ("topk", {"keep": 0.1}),
]


def gaussian_update(d: int = 1_300_000) -> np.ndarray:
    return np.random.default_rng(0).standard_normal(d).astype(np.float32)


def allcnn_update(steps: int = 5, batch: int = 8, lr: float = 0.05) -> np.ndarray:
    """w_0 - w_steps of ALL-CNN trained on digits (upsampled to CIFAR's 3x32x32)."""
    import torch
    from sklearn.datasets import load_digits

    from mucsc.fedsim.models import all_cnn
    torch.manual_seed(0)
    torch.set_num_threads(1)
    digits = load_digits()
    xs = torch.tensor(digits.images[: steps * batch], dtype=torch.float32)[:, None] / 16.0
    xs = torch.nn.functional.interpolate(xs, size=(32, 32), mode="bilinear").repeat(1, 3, 1, 1)
    ys = torch.tensor(digits.target[: steps * batch])
    model = all_cnn()
    w0 = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for s in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xs[s * batch:(s + 1) * batch]), ys[s * batch:(s + 1) * batch])
        loss.backward()
        opt.step()
    w1 = torch.cat([p.detach().flatten() for p in model.parameters()])
    return (w0 - w1).numpy().astype(np.float32)


def best(fn, repeat: int) -> tuple[float, object]:
    out, t_best = None, math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        t_best = min(t_best, time.perf_counter() - t)
    return t_best, out


def codec_rows(x: np.ndarray, repeat: int) -> list[list[str]]:
    mb = x.size * 4 / 1e6
    norm = float(np.linalg.norm(x.astype(np.float64)))
    rows = []
    for codec, params in CODECS:
        t_enc, blob = best(lambda: mucsc.encode(x, codec, **params), repeat)
        t_dec, y = best(lambda: mucsc.decode(blob), repeat)
        rel = float(np.linalg.norm(y.astype(np.float64) - x)) / norm
        label = codec + "".join(f" {k}={v}" for k, v in params.items())
        rows.append([label, f"{len(blob):,}", f"{8 * len(blob) / x.size:.3f}", f"{4 * x.size / len(blob):.1f}",
                     f"{mb / t_enc:.0f}", f"{mb / t_dec:.0f}", f"{rel:.4f}"])
    return rows


def entropy_bits(ids: np.ndarray) -> float:
    p = np.bincount(ids) / ids.size
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def id_rows(x: np.ndarray) -> list[list[str]]:
    """Entropy of the cluster IDs vs bits/ID achieved by zstd (the container's compress="auto")."""
    rows = []
    for codec, params in [("mucsc", {"z": 4}), ("mucsc", {"z": 8}), ("mucsc", {"z": 16}),
                          ("mucsc", {"z": 256}), ("bmucsc", {"z": 256}), ("bmucsc", {"z": 16})]:
        sizes = {}
        for level in (3, 19):
            blob = mucsc.encode(x, codec, compress=level, **params)
            info = mucsc.inspect(blob)
            sec = next(s for s in info.sections if s.tag == "IDS_")
            sizes[level] = sec.stored_bytes
        grp = info.groups[0]
        n = grp.params.get("k", x.size)
        width = max(0, int(grp.params["centroids"] - 1).bit_length())
        y = mucsc.decode(blob)
        if codec == "bmucsc":
            y = y[np.sort(np.argpartition(np.abs(x), x.size - n)[x.size - n:])]
        cent = np.unique(y)
        ids = np.searchsorted(cent, y)
        label = codec + "".join(f" {k}={v}" for k, v in params.items())
        rows.append([label, f"{n:,}", str(width), f"{entropy_bits(ids):.3f}",
                     f"{8 * sizes[3] / n:.3f}", f"{8 * sizes[19] / n:.3f}"])
    return rows


def show(title: str, headers: list[str], rows: list[list[str]], markdown: bool) -> None:
    print(f"\n{title}\n")
    if markdown:
        print("| " + " | ".join(headers) + " |")
        print("|" + "|".join("---" for _ in headers) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
        return
    w = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(x) for h, x in zip(headers, w)))
    for r in rows:
        print("  ".join(c.rjust(x) if i else c.ljust(x) for i, (c, x) in enumerate(zip(r, w))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="Gaussian only, one timing run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args()
    repeat = 1 if a.quick else a.repeat
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"python {platform.python_version()}, numpy {np.__version__}; one thread; best of {repeat}")
    updates = {"gaussian": gaussian_update()}
    if not a.quick:
        updates["allcnn"] = allcnn_update()
    headers = ["codec", "bytes", "bits/elem", "x vs f32", "enc MB/s", "dec MB/s", "rel. error"]
    for name, x in updates.items():
        show(f"{name} update, d = {x.size:,}", headers, codec_rows(x, repeat), a.markdown)
    for name, x in updates.items():
        show(f"cluster IDs, {name} update: entropy vs zstd'd bits per ID", 
             ["codec", "IDs", "fixed bits", "entropy", "zstd-3 bits", "zstd-19 bits"], id_rows(x), a.markdown)


if __name__ == "__main__":
    main()
