#!/usr/bin/env python3
"""The codec's share of a client's compute in ``mucsc sim``, and ``--device auto`` against ``cpu``.

    python benchmarks/sim_share.py share --device cuda [--model allcnn --dataset femnist --data-dir DIR]
    python benchmarks/sim_share.py auto

``share``: runs ``mucsc sim`` (the real command, one worker) for each codec and prints per round
(round 1, the warm-up, left out) train / encode / decode seconds and the codec share
(encode + decode) / (train + encode + decode), against issue 21's bar of <= 25 %.
``auto``: the quick start (``mucsc sim`` with its defaults, a few rounds) with ``--device auto`` and
with ``--device cpu``: the device auto chose and both wall times (auto must not be slower).
Both run on any machine (``--device cpu`` where there is no GPU); benchmarks/gpu_checks.sh runs them
on a GPU machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARE_BAR = 0.25


def sim(args: list[str], out: Path) -> float:
    """Wall seconds of one ``mucsc sim`` run writing to ``out``."""
    # the caller's PYTHONPATH kept after ours: a dependency installed through it must still import in the child
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    t = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "mucsc.cli", "sim", *args, "--workers", "1", "-q", "-o", str(out)],
                       capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"mucsc sim {' '.join(args)} failed:\n{r.stderr[-2000:]}")
    return time.perf_counter() - t


def share(a: argparse.Namespace) -> None:
    data = ["--data-dir", a.data_dir] if a.data_dir else []
    print(f"| model | device | codec | train s/round | encode s/round | decode s/round | codec share | <= {SHARE_BAR:.0%} |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        sim(["--dataset", a.dataset, *data, "--model", a.model, "--device", a.device, "--codecs", a.codecs,
             "--rounds", str(a.rounds), "-N", str(a.clients), "-K", str(a.per_round)], out)
        for codec in a.codecs.split(","):
            rows = list(csv.DictReader(open(out / codec / "timing.csv")))[1:] or \
                list(csv.DictReader(open(out / codec / "timing.csv")))
            mean = {k: sum(float(r[k]) for r in rows) / len(rows) for k in ("train_s", "encode_s", "decode_s")}
            s = (mean["encode_s"] + mean["decode_s"]) / sum(mean.values())
            print(f"| {a.model} | {a.device} | {codec} | {mean['train_s']:.3f} | {mean['encode_s']:.3f} | "
                  f"{mean['decode_s']:.3f} | {s:.0%} | {'yes' if s <= SHARE_BAR else 'no'} |")


def auto(a: argparse.Namespace) -> None:
    print("| --device | chose | wall s |")
    print("|---|---|---|")
    walls = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dev in ("auto", "cpu"):
            out = Path(tmp) / dev
            walls[dev] = sim(["--device", dev, "--rounds", str(a.rounds), "--codecs", a.codecs], out)
            chose = json.loads((out / "summary.json").read_text())["machine"]["device"]
            print(f"| {dev} | {chose} | {walls[dev]:.1f} |")
    print(f"auto / cpu: {walls['auto'] / walls['cpu']:.2f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("share")
    s.add_argument("--device", default="cpu")
    s.add_argument("--model", default="allcnn")
    s.add_argument("--dataset", default="femnist")
    s.add_argument("--data-dir", default=str(ROOT.parent.parent / "shared" / "data" / "femnist-sample"))
    s.add_argument("--codecs", default="mucsc,bmucsc")
    s.add_argument("--rounds", type=int, default=4)
    s.add_argument("--clients", type=int, default=26)
    s.add_argument("--per-round", type=int, default=10)
    u = sub.add_parser("auto")
    u.add_argument("--rounds", type=int, default=3)
    u.add_argument("--codecs", default="none,mucsc,bmucsc")
    a = ap.parse_args()
    share(a) if a.what == "share" else auto(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
