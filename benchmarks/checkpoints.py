#!/usr/bin/env python3
"""`mucsc compress` on real and trained checkpoints: per-tensor and overall error, ratio, and whether the
restored model still works (docs/checkpoints.md is this script's output).

    python benchmarks/checkpoints.py [--cache DIR] [--work DIR]

Checkpoints (nothing large is committed: the weights come from the package index or are trained here):
- MTCNN ONet and RNet: ``onet.pt`` / ``rnet.pt`` from the facenet-pytorch 2.6.0 wheel
  (``pip download --no-deps``, unpacked, never installed); the networks are built from the wheel's own
  ``mtcnn.py`` class definitions.  Check: outputs of original and restored net on 512 fixed random
  inputs (face probability, box regression, landmarks).
- Silero VAD 16 kHz: ``silero_vad_16k.safetensors`` from the silero-vad 6.2.3 wheel; the restored
  weights are loaded into the wheel's TorchScript model.  Check: per-frame speech probability on 20 s
  of synthetic audio (voiced bursts and noise).
- A digits MLP (64-256-128-10) and a FEMNIST CNN trained here on scikit-learn's digits and on the FEMNIST
  sample in ../shared/data; check: test accuracy.  Their *update* (weights after more training minus
  the earlier checkpoint) gives the update-mode rows.

Every compression runs the real command (``python -m mucsc.cli.main compress ... --json``) and every
restore ``decompress``; errors are measured on the restored file against the original.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
WHEELS = {"facenet-pytorch": "2.6.0", "silero-vad": "6.2.3"}
MODEL_SETTINGS = [("default (1%)", []), ("--max-error 0.5%", ["--max-error", "0.5%"]),
                  ("--max-error 5%", ["--max-error", "5%"]), ("fp16", ["--codec", "fp16"]),
                  ("paper: --shared --z 16", ["--shared", "--z", "16"])]
UPDATE_SETTINGS = [("default (Z=16 per tensor)", []), ("--max-error 5%", ["--max-error", "5%"]),
                   ("fp16", ["--codec", "fp16"]), ("paper: --shared --z 16", ["--shared", "--z", "16"])]


def mucsc_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "mucsc.cli.main", *args], capture_output=True, text=True, env=env)
    if r.returncode:
        raise RuntimeError(f"mucsc {' '.join(args)}: {r.stderr}")
    return r


# ---- checkpoints -------------------------------------------------------------------------------------

def wheel(cache: Path, name: str) -> zipfile.ZipFile:
    cache.mkdir(parents=True, exist_ok=True)
    found = list(cache.glob(f"{name.replace('-', '_')}-{WHEELS[name]}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", f"{name}=={WHEELS[name]}",
                        "-d", str(cache)], check=True)
        found = list(cache.glob(f"{name.replace('-', '_')}-{WHEELS[name]}-*.whl"))
    return zipfile.ZipFile(found[0])


def mtcnn_nets(cache: Path, work: Path) -> dict:
    """{'MTCNN ONet': (path, make_net), 'MTCNN RNet': ...} from the facenet-pytorch wheel."""
    z = wheel(cache, "facenet-pytorch")
    src = z.read("facenet_pytorch/models/mtcnn.py").decode()
    ns: dict = {"torch": torch, "nn": torch.nn, "os": os, "np": np}
    exec(src[src.index("class PNet"): src.index("class MTCNN")], ns)  # the wheel's own net definitions
    out = {}
    for net, size in (("onet", 48), ("rnet", 24)):
        path = work / f"mtcnn_{net}.pt"
        path.write_bytes(z.read(f"facenet_pytorch/data/{net}.pt"))
        out[f"MTCNN {net[0].upper()}Net ({net}.pt)"] = (path, _mtcnn_check(ns[net[0].upper() + "Net"], size))
    return out


def _mtcnn_check(cls, size: int):
    x = torch.from_numpy(np.random.default_rng(0).uniform(-1, 1, (512, 3, size, size)).astype(np.float32))

    def outputs(sd) -> list[torch.Tensor]:
        m = cls(pretrained=False)
        m.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in sd.items()})
        m.eval()
        with torch.no_grad():
            return [t.reshape(len(x), -1) for t in m(x)]

    def check(orig, restored) -> str:
        a, b = outputs(orig), outputs(restored)
        prob = (a[1][:, 1] - b[1][:, 1]).abs().max().item()  # the face probability head
        reg = torch.cat([t.reshape(-1) for t in a[:1] + a[2:]]), torch.cat([t.reshape(-1) for t in b[:1] + b[2:]])
        cos = torch.nn.functional.cosine_similarity(reg[0], reg[1], dim=0).item()
        return f"max abs face-prob diff {prob:.4f}; box/landmark cos {cos:.5f}"
    return check


def silero(cache: Path, work: Path) -> dict:
    z = wheel(cache, "silero-vad")
    path = work / "silero_vad_16k.safetensors"
    path.write_bytes(z.read("silero_vad/data/silero_vad_16k.safetensors"))
    jit = work / "silero_vad.jit"
    jit.write_bytes(z.read("silero_vad/data/silero_vad.jit"))
    t = np.arange(20 * 16000) / 16000
    rng = np.random.default_rng(1)
    voiced = sum(np.sin(2 * np.pi * 130 * h * t) / h for h in range(1, 20)) * (np.sin(2 * np.pi * 0.4 * t) > 0)
    audio = (0.3 * voiced * (1 + 0.5 * np.sin(2 * np.pi * 4 * t)) + 0.02 * rng.normal(size=t.size))
    audio = torch.from_numpy((audio / np.abs(audio).max()).astype(np.float32))

    def probs(sd) -> np.ndarray:
        m = torch.jit.load(str(jit))
        names = [k for k in m.state_dict() if k.startswith("_model.")]  # the 16 kHz model, same order
        m.load_state_dict({**m.state_dict(), **{n: torch.as_tensor(np.asarray(v)) for n, v in zip(names, sd.values())}})
        m.reset_states()
        with torch.no_grad():
            return np.array([m(audio[i: i + 512][None], 16000).item() for i in range(0, audio.numel() - 511, 512)])

    def check(orig, restored) -> str:
        a, b = probs(orig), probs(restored)
        agree = np.mean((a > 0.5) == (b > 0.5))
        return f"speech prob max abs diff {np.abs(a - b).max():.4f}; frames agreeing at 0.5: {100 * agree:.1f}%"
    return {"Silero VAD 16 kHz (.safetensors)": (path, check)}


FEMNIST = ROOT.parent / "shared" / "data" / "femnist-sample"


def trained(work: Path) -> tuple[dict, dict]:
    """Two models trained here: (model checkpoints, updates) with their accuracy checks."""
    torch.manual_seed(0)
    models, updates = {}, {}
    for name, (data, make, epochs) in {"digits MLP (trained here)": (_digits(), _mlp, (20, 40)),
                                       "FEMNIST CNN (trained here)": (_femnist(), _cnn, (3, 5))}.items():
        (xtr, ytr), (xte, yte) = data
        net = make()
        opt = torch.optim.Adam(net.parameters(), 1e-3)
        snaps = {}
        for ep in range(1, epochs[1] + 1):
            perm = torch.randperm(len(xtr))
            net.train()
            for i in range(0, len(xtr), 64):
                idx = perm[i: i + 64]
                opt.zero_grad()
                torch.nn.functional.cross_entropy(net(xtr[idx]), ytr[idx]).backward()
                opt.step()
            if ep in epochs:
                snaps[ep] = {k: v.detach().clone() for k, v in net.state_dict().items()}
        old, new = work / f"{make.__name__}_old.pt", work / f"{make.__name__}_new.pt"
        torch.save(snaps[epochs[0]], old)
        torch.save(snaps[epochs[1]], new)
        check = _accuracy_check(make, xte, yte)
        models[name] = (new, check)
        updates[f"{name}: epoch {epochs[0]} -> {epochs[1]}"] = (new, old, check)
    return models, updates


def _accuracy_check(make, xte, yte):
    def acc(sd) -> float:
        m = make()
        m.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in sd.items()})
        m.eval()
        with torch.no_grad():
            return (m(xte).argmax(1) == yte).float().mean().item()

    def check(orig, restored) -> str:
        return f"test accuracy {100 * acc(orig):.2f}% -> {100 * acc(restored):.2f}%"
    return check


def _digits():
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.data / 16.0, dtype=torch.float32)
    y = torch.tensor(d.target)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    tr, te = perm[:1400], perm[1400:]
    return (x[tr], y[tr]), (x[te], y[te])


def _mlp():
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                               torch.nn.ReLU(), torch.nn.Linear(128, 10))


def _femnist():
    base = FEMNIST
    if not (base / "train").is_dir():
        raise SystemExit(f"{base}: the FEMNIST sample is not there (give --femnist DIR)")
    out = []
    for split in ("train", "test"):
        xs, ys = [], []
        for f in sorted((base / split).glob("*.json")):
            d = json.loads(f.read_text())
            for u in d["users"]:
                xs += d["user_data"][u]["x"]
                ys += d["user_data"][u]["y"]
        out.append((1.0 - torch.tensor(xs, dtype=torch.float32).reshape(-1, 1, 28, 28), torch.tensor(ys)))
    return out


def _cnn():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 16, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Conv2d(16, 32, 5, padding=2), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                               torch.nn.Flatten(), torch.nn.Linear(32 * 7 * 7, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 62))


# ---- measuring ------------------------------------------------------------------------------------------

def load(path: Path) -> dict:
    from mucsc import tensorfiles
    return {k: (v.float().numpy() if isinstance(v, torch.Tensor) else np.asarray(v))
            for k, v in tensorfiles.load(str(path)).tensors.items()}


def errors(orig: dict, restored: dict) -> tuple[float, float, str, int]:
    """(overall relative error, worst tensor's, its name, float tensors above 10%) over float tensors."""
    num = den = 0.0
    worst, worst_name, bad = 0.0, "", 0
    for k, v in orig.items():
        if v.dtype.kind != "f":
            continue
        d = np.linalg.norm(restored[k].astype(np.float64) - v)
        n = np.linalg.norm(v.astype(np.float64))
        num, den = num + d * d, den + n * n
        rel = d / n if n else (0.0 if d == 0 else np.inf)
        bad += rel > 0.10
        if rel > worst:
            worst, worst_name = rel, k
    return float(np.sqrt(num / den)), float(worst), worst_name, bad


def run_model(name: str, path: Path, check, work: Path, rows: list) -> None:
    orig = load(path)
    params = sum(v.size for v in orig.values())
    for label, opts in MODEL_SETTINGS:
        msg, out = work / "m.mucsc", work / f"r{path.suffix if path.suffix == '.safetensors' else '.pt'}"
        rep = json.loads(mucsc_cli("compress", str(path), "-o", str(msg), "-f", "--json", *opts).stdout)
        mucsc_cli("decompress", str(msg), "-o", str(out), "-f", "-q")
        restored = load(out)
        overall, worst, wname, bad = errors(orig, restored)
        rows.append([name if label == MODEL_SETTINGS[0][0] else "", f"{params:,}" if label == MODEL_SETTINGS[0][0] else "",
                     label, f"{rep['ratio']:.2f}x", f"{100 * overall:.3g}%", f"{100 * worst:.3g}% ({wname})",
                     str(bad), check(orig, restored)])


def run_update(name: str, new: Path, old: Path, check, work: Path, rows: list) -> None:
    n_, o_ = load(new), load(old)
    upd = {k: n_[k] - o_[k] for k in n_ if n_[k].dtype.kind == "f"}
    for label, opts in UPDATE_SETTINGS:
        msg, out = work / "u.mucsc", work / "ru.pt"
        rep = json.loads(mucsc_cli("compress", str(new), "--base", str(old), "-o", str(msg), "-f", "--json",
                                   *opts).stdout)
        mucsc_cli("decompress", str(msg), "--base", str(old), "-o", str(out), "-f", "-q")
        restored = load(out)
        got = {k: restored[k].astype(np.float64) - o_[k] for k in upd}
        overall, worst, wname, bad = errors(upd, got)
        rows.append([name if label == UPDATE_SETTINGS[0][0] else "", label, f"{rep['ratio']:.2f}x",
                     f"{100 * overall:.3g}%", f"{100 * worst:.3g}% ({wname})", check(n_, restored)])


def table(headers: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
                     + ["| " + " | ".join(r) + " |" for r in rows])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "mucsc-bench", help="wheels cache")
    ap.add_argument("--work", type=Path, default=Path("/tmp/mucsc-checkpoints"), help="scratch directory")
    ap.add_argument("--femnist", type=Path, help="the FEMNIST sample, LEAF json (default: ../shared/data/femnist-sample)")
    args = ap.parse_args()
    if args.femnist is not None:
        globals()["FEMNIST"] = args.femnist
    args.work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    models, updates = trained(args.work)
    checkpoints = {**mtcnn_nets(args.cache, args.work), **silero(args.cache, args.work), **models}
    rows: list = []
    for name, (path, check) in checkpoints.items():
        run_model(name, path, check, args.work, rows)
    urows: list = []
    for name, (new, old, check) in updates.items():
        run_update(name, new, old, check, args.work, urows)
    print("## Model mode (no --base)\n")
    print(table(["checkpoint", "parameters", "setting", "ratio (tensor bytes / message)", "overall rel. error",
                 "worst tensor", "tensors > 10%", "functional check (original -> restored)"], rows))
    print("\n## Update mode (--base OLD; errors are of the update NEW - OLD)\n")
    print(table(["update", "setting", "ratio", "overall rel. error of the update", "worst tensor",
                 "functional check of NEW (original -> restored OLD + update)"], urows))
    print(f"\n(took {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
