#!/usr/bin/env python3
"""Does the FEMNIST preset learn, and does the paper's learning rate? Real LEAF data, codec none.

    python benchmarks/bench_femnist_lr.py                     # ../shared/data/femnist-sample, 10 rounds
    python benchmarks/bench_femnist_lr.py --data-dir DIR --rounds 30

For the FEMNIST preset (inverse 0.1/400/0.01) and ``--lr-schedule paper`` (0.5/400/0.01), both with
the preset's input normalisation: test accuracy after ``--rounds`` rounds (N = writers up to 26,
K = 10, E = 5, B = 8, seed 0), then the share of exactly-zero values in the updates the next
round's K clients would send (all parameters, and LeNet's 400-unit dense layer): a network whose
ReLUs died sends (almost) only zeros.
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
from pathlib import Path  # noqa: E402

from mucsc.fedsim import simulation  # noqa: E402
from mucsc.fedsim.config import SimConfig  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "femnist-sample"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=str(SAMPLE))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--clients", type=int, default=26)
    args = ap.parse_args()
    if not Path(args.data_dir).is_dir():
        raise SystemExit(f"no FEMNIST data at {args.data_dir}")
    print("| schedule | lr | test acc | zero share of next-round updates | zero share, dense layer |")
    print("|---|---|---:|---:|---:|")
    for schedule in (None, "paper"):
        cfg = SimConfig(dataset="femnist", data_dir=args.data_dir, clients=args.clients, per_round=10,
                        rounds=args.rounds, target=0.0, eval_every=args.rounds, codecs=("none",), workers=1,
                        device="cpu", lr_schedule=schedule)
        setup = simulation.prepare(cfg)
        res = simulation.run(cfg, "none", setup)
        weights = list(res.weights.values())
        trainer = simulation.LocalTrainer(setup.model_name, setup.data, setup.parts, cfg.seed)
        nxt = simulation.select_clients(cfg, args.rounds, setup.sizes / setup.sizes.sum())
        zeros = total = dense_zeros = dense_total = 0
        for slot, c in enumerate(nxt.tolist()):
            update, _ = trainer.train(weights, simulation.client_task(cfg, setup, args.rounds, slot, c))
            for name, u in update.items():
                zeros += int((u == 0).sum())
                total += u.size
                if u.ndim == 2 and u.shape[0] == 400:  # lenet's hidden dense layer
                    dense_zeros += int((u == 0).sum())
                    dense_total += u.size
        s, lr0, decay, lr_min = cfg.lr_settings()
        print(f"| {s} | max({lr0:g} / (1 + t/{decay:g}), {lr_min:g}) | {res.records[-1].accuracy:.3f} | "
              f"{100 * zeros / total:.1f} % | {100 * dense_zeros / max(dense_total, 1):.3f} % |", flush=True)


if __name__ == "__main__":
    main()
