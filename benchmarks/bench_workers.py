#!/usr/bin/env python3
"""Round wall time of ``mucsc sim`` with 1, 2, ... worker processes: the speed-up of ``--workers``.

    python benchmarks/bench_workers.py                      # femnist-sample (if present), allcnn fixture
    python benchmarks/bench_workers.py --workers 1,2 --rounds 6 --setups allcnn

Setups: "femnist": LeNet (d = 1,331,758) on the shared 26-writer LEAF sample, N = 26, K = 10, E = 5,
B = 8, codec none and mucsc run concurrently; "allcnn": ALL-CNN-C (d = 1,369,738) on the 15-image
CIFAR-10 fixture, N = 10, K = 10 (5 samples each, drawn with overlap), codec mucsc; "digits": the
built-in small CNN (d = 38,282), N = 100, K = 10, codecs none and mucsc.  Every setup evaluates only
at its last round.  Printed per setup and worker count: pool start (fork server + workers + data),
wall seconds per round (whole sweep / rounds, pool start excluded), the mean client training time
per message (measured inside the process that trained), the main process's encode+decode time per
round, and the speed-up over 1 worker.  "auto" is ``--workers auto`` (its start time is the probe's:
timing clients in this process, and a trial pool when it starts one) with its choice and reason;
"transfer s / client" (explicit counts > 1) is what a worker adds to a client's training: round 1's
clients sent one at a time, wall time minus the training time measured in the worker.  The rounds'
bytes and accuracies are checked to be identical across worker counts.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from mucsc.fedsim import parallel, simulation  # noqa: E402
from mucsc.fedsim.config import SimConfig  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FEMNIST = ROOT.parent / "shared" / "data" / "femnist-sample"
CIFAR = ROOT / "tests" / "fixtures" / "fedsim" / "cifar10"


def setups(rounds: int) -> dict[str, SimConfig]:
    common = dict(rounds=rounds, target=0.0, eval_every=rounds, device="cpu")
    out = {"digits": SimConfig(dataset="digits", codecs=("none", "mucsc"), **common),
           "allcnn": SimConfig(dataset="cifar10", data_dir=str(CIFAR), clients=10, per_round=10,
                               samples_per_client=5, codecs=("mucsc",), **common)}
    if (FEMNIST / "train").is_dir():
        out["femnist"] = SimConfig(dataset="femnist", data_dir=str(FEMNIST), clients=26, per_round=10,
                                   codecs=("none", "mucsc"), **common)
    return out


def transfer_s(executor, cfg: SimConfig, setup) -> float:
    """Seconds per client that a worker adds to its training: round 1's clients sent one at a time
    (so no two train at once), wall time minus the training time measured inside the worker."""
    weights, tasks = parallel.probe_tasks(cfg, setup, cfg.per_round)
    t0 = time.perf_counter()
    inside = sum(executor.train(weights, t).result()[1] for t in tasks)
    return (time.perf_counter() - t0 - inside) / len(tasks)


def measure(cfg: SimConfig, setup, workers: int | str):
    t0 = time.perf_counter()
    executor, choice = parallel.start_executor(cfg, setup, workers, runs=len(cfg.codecs))
    n = choice.workers
    if workers != "auto" and n > 1:  # the pool starts lazily: make every worker build its trainer before timing
        w = simulation._Run(cfg, cfg.codecs[0], setup, "cpu").host_weights()
        for f in [executor.evaluate(w) for _ in range(n)]:
            f.result()
    start_s = time.perf_counter() - t0
    try:
        ipc = transfer_s(executor, cfg, setup) if workers != "auto" and n > 1 else None
        t1 = time.perf_counter()
        results = simulation.sweep(cfg, setup, cfg.codecs, executor,
                                   concurrent=1 if n == 1 else min(n, len(cfg.codecs)))
        wall = time.perf_counter() - t1
    finally:
        executor.close()
    recs = [r for res in results for r in res.records]
    n_msgs = sum(len(r.up_bytes) for r in recs)
    train = sum(r.train_s for r in recs) / n_msgs
    codec = sum(r.encode_s + r.decode_s for r in recs) / len(recs)
    fingerprint = [(r.up_bytes, r.down_msg_bytes, r.accuracy) for r in recs]
    return choice, start_s, ipc, wall / cfg.rounds, train, codec, fingerprint


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="1,2,auto", help="comma-separated worker counts or auto [1,2,auto]")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--local-iters", type=int, help="E for every setup [5]: longer clients")
    ap.add_argument("--setups", default="digits,femnist,allcnn")
    ap.add_argument("--codecs", help="comma-separated codecs for every setup [per setup]")
    args = ap.parse_args()
    counts = [w if w == "auto" else int(w) for w in args.workers.split(",")]
    print(f"# {platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} usable cores, "
          f"load average {os.getloadavg()[0]:.2f} at start; rounds = {args.rounds}")
    print("| setup | runs | workers | start s | transfer s / client | wall s / round | train s / client | "
          "codec s / round | speed-up |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    all_setups = setups(args.rounds)
    for name in args.setups.split(","):
        if name not in all_setups:
            print(f"| {name} | skipped: data not found | | | | | | |")
            continue
        cfg = all_setups[name]
        if args.local_iters:
            cfg = dataclasses.replace(cfg, local_iters=args.local_iters)
        if args.codecs:
            cfg = dataclasses.replace(cfg, codecs=tuple(args.codecs.split(",")))
        setup = simulation.prepare(cfg)
        base, ref = None, None
        for w in counts:
            choice, start_s, ipc, per_round, train, codec, fp = measure(cfg, setup, w)
            if ref is None:
                ref = fp
            elif fp != ref:
                raise SystemExit(f"{name}: results differ between worker counts")
            base = base or per_round
            label = f"auto -> {choice.workers}" if w == "auto" else str(w)
            print(f"| {name} (d = {setup.d:,}, E = {cfg.local_iters}) | {len(cfg.codecs)} | {label} | {start_s:.2f} | "
                  f"{'-' if ipc is None else f'{ipc:.4f}'} | {per_round:.3f} | {train:.3f} | {codec:.3f} | "
                  f"{base / per_round:.2f}x |", flush=True)
            if w == "auto":
                print(f"#   {name}: {choice.reason}")
    print(f"# load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
