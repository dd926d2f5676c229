"""DDP on CPU: plain allreduce vs the mucsc communication hook, 2 gloo ranks on 127.0.0.1.

    python benchmarks/bench_ddp.py [--params 1000000] [--iters 20] [--repeat 3] [--only LABEL ...] [--interleave]
                                   [--hook-from OLD/mucsc/ddp.py]

Prints, per hook: wall seconds per training iteration (the median of ``--iters`` iterations after 2
warm-up ones, robust to other jobs' bursts; the best of ``--repeat`` runs, the hooks taking turns so
that a change of load hits them alike; with ``--interleave`` all hooks run in one pair of ranks, each
its own model, taking turns every iteration) and its ratio to plain allreduce, rank 0's CPU seconds
per iteration (all its threads, gloo's included; the mean over the same iterations, of the run with
the best wall time: less sensitive to other jobs than wall time) and its ratio, bytes each rank put on the
wire per iteration (allreduce: the bucket bytes; fp16: half; PowerSGD rank r: P and Q of each
compressed matrix plus the tensors it allreduces whole; mucsc: its all-gather slots, i.e. length,
message and slack), and the final loss.  Hooks: allreduce (DDP's default), torch's
``fp16_compress_hook`` and ``powerSGD_hook`` (rank 1 and 4, from iteration 2), mucsc z=16 (the
hook's default settings, the codec's own ``compress="auto", id_coding="auto"``, ``solver="uniform"``,
``overlap=False``), mucsc z=32 uniform, mucsc z=4, top-k; ``--hook-from FILE`` adds a mucsc z=16 row whose
hook comes from another ddp.py (an earlier version, on today's codec: before and after in one run,
best with ``--interleave``).  Loopback is far
faster than any real link, so the times show the codec's cost, and the bytes show what a
bandwidth-bound link would carry.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

WORKER = textwrap.dedent("""
    import importlib.util, json, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from mucsc.ddp import MucscHookState, mucsc_hook
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    rank, port, out, width, iters = sys.argv[1:6]
    rank, width, iters = int(rank), int(width), int(iters)
    cases = json.loads(sys.argv[6])  # [[hook, params], ...]: each its own model, taking turns per iteration
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)

    def hook_from(path):  # another version of mucsc/ddp.py, as its own module
        spec = importlib.util.spec_from_file_location("ddp_from_file", path)
        mod = sys.modules["ddp_from_file"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod.MucscHookState, mod.mucsc_hook

    def setup(hook, params):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, width), torch.nn.Tanh(), torch.nn.Linear(width, 64))
        ddp = DDP(model)
        state = None
        nbytes = sum(p.numel() * 4 for p in model.parameters())
        wire = nbytes
        if hook == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
            wire = nbytes // 2
        elif hook == "powersgd":
            r = params["rank"]
            ddp.register_comm_hook(powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=r,
                                                               start_powerSGD_iter=2), powerSGD_hook.powerSGD_hook)
            # compressed: matrices with r (n + m) < n m send P and Q; every other tensor is allreduced whole
            wire = sum(4 * r * sum(p.shape) if p.dim() == 2 and r * sum(p.shape) < p.numel() else 4 * p.numel()
                       for p in model.parameters())
        elif hook != "allreduce":
            params = dict(params)
            state_type, hook_fn = hook_from(params.pop("from")) if "from" in params else (MucscHookState, mucsc_hook)
            state = state_type(None, codec=hook, seed=0, start_iter=2, **params)
            ddp.register_comm_hook(state, hook_fn)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        return {"ddp": ddp, "opt": opt, "state": state, "wire": wire, "d": nbytes // 4, "times": [], "cpu": 0.0}

    runs = [setup(hook, params) for hook, params in cases]
    g = torch.Generator().manual_seed(rank)
    X = torch.randn(64, 64, generator=g)
    for it in range(iters + 2):
        for r in runs:
            if len(runs) > 1:  # the ranks start each row's step together: no row waits out another's tail
                dist.barrier()
            c0, t0 = time.process_time(), time.perf_counter()
            r["opt"].zero_grad()
            loss = ((r["ddp"](X) - X) ** 2).mean()
            loss.backward()
            r["opt"].step()
            if it >= 2:
                r["times"].append(time.perf_counter() - t0)
                r["cpu"] += time.process_time() - c0
            r["loss"] = float(loss.detach())
    results = []
    for r in runs:
        wire = r["wire"]
        if r["state"] is not None:
            r["state"].close()
            wire = r["state"].stats.sent_bytes / iters  # the 2 warm-up iterations allreduce
        results.append({"s": sorted(r["times"])[len(r["times"]) // 2], "cpu": r["cpu"] / iters, "wire": wire,
                        "loss": r["loss"], "d": r["d"]})
    json.dump(results, open(out, "w"))
    dist.barrier()
    dist.destroy_process_group()
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cases: list, width: int, iters: int, tmp: Path) -> list[dict]:
    """One pair of ranks running ``cases`` (each its own model, taking turns per iteration)."""
    script = tmp / "worker.py"
    script.write_text(WORKER)
    port = str(free_port())
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, str(script), str(r), port, str(tmp / f"{r}.json"), str(width),
                               str(iters), json.dumps(cases)], env=env) for r in range(2)]
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise SystemExit(f"worker failed ({', '.join(label(*c) for c in cases)})")
    return json.loads((tmp / "0.json").read_text())


def label(hook: str, params: dict) -> str:
    shown = {k: "file" if k == "from" else v for k, v in params.items()}  # no machine path in the table
    return hook + ("(" + ",".join(f"{k}={v}" for k, v in shown.items()) + ")" if params else "")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=1_000_000, help="about this many model parameters")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3, help="runs per hook; the fastest is reported")
    ap.add_argument("--only", nargs="+", metavar="LABEL", help="run only these rows (labels as printed, "
                    "e.g. 'mucsc(z=16)'); allreduce, the baseline, always runs")
    ap.add_argument("--interleave", action="store_true", help="all rows in one pair of ranks, taking turns "
                    "every iteration (a change of load hits every row alike; the rows share the cores' caches)")
    ap.add_argument("--hook-from", metavar="FILE", help="also a mucsc z=16 row with the hook from this ddp.py "
                    "(e.g. an earlier version's mucsc/ddp.py)")
    a = ap.parse_args()
    width = max(1, a.params // 129)
    cases = [("allreduce", {}), ("fp16", {}), ("powersgd", {"rank": 1}), ("powersgd", {"rank": 4}),
             ("mucsc", {"z": 16}), ("mucsc", {"z": 16, "compress": "auto", "id_coding": "auto"}),
             ("mucsc", {"z": 16, "solver": "uniform"}), ("mucsc", {"z": 32, "solver": "uniform"}),
             ("mucsc", {"z": 16, "overlap": False}), ("mucsc", {"z": 4}), ("topk", {"keep": 0.01})]
    if a.hook_from:
        cases.insert(5, ("mucsc", {"z": 16, "from": str(Path(a.hook_from).resolve())}))
    if a.only:
        cases = [c for c in cases if c[0] == "allreduce" or label(*c) in a.only or "from" in c[1]]
    best: list[dict | None] = [None] * len(cases)
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(max(1, a.repeat)):
            groups = [list(range(len(cases)))] if a.interleave else [[i] for i in range(len(cases))]
            for group in groups:
                for i, r in zip(group, run([cases[i] for i in group], width, a.iters, Path(tmp))):
                    if best[i] is None or r["s"] < best[i]["s"]:
                        best[i] = r
    print("| hook | params | s / iteration | x allreduce | CPU s / iteration | x allreduce | "
          "bytes / rank / iteration | ratio | final loss |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    base, base_s, base_cpu = best[0]["wire"], best[0]["s"], best[0]["cpu"]
    for (hook, params), r in zip(cases, best):
        print(f"| {label(hook, params)} | {r['d']} | {r['s']:.4f} | {r['s'] / base_s:.2f} | {r['cpu']:.4f} | "
              f"{r['cpu'] / base_cpu:.2f} | {r['wire']:.0f} | {base / r['wire']:.1f} | {r['loss']:.5f} |", flush=True)


if __name__ == "__main__":
    main()
