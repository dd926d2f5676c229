#!/usr/bin/env python3
"""What the per-tensor Policy chooses, tensor by tensor, saved and compared across two trees: a speed
change to the Policy or the goal search must choose exactly what the tree before it chose.

    PYTHONPATH=<old tree> python benchmarks/policy_choices.py --save before.json
    PYTHONPATH=<new tree> python benchmarks/policy_choices.py --against before.json

Cases: bench_shapes' LeNet, ALL-CNN and BERT-shaped (``--bert-layers``, default 1) state_dicts and
``--random`` random dicts (tiny to 1e5-element tensors: Gaussian, Student-t(3), few distinct values,
all-zero, float16/float64, integer), each under ``Policy(max_error=0.01)`` and ``0.05``, ``mucsc
compress``'s model default (nearest rounding, 1-D tensors fp16 within 0.1 %) and its update default
(no lossy fp16).  For every tensor: its group's codec, parameters and stored bytes; for every message
its SHA-256.  ``--against`` prints each difference and exits 1 when there is one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

import mucsc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_shapes import all_cnn, bert, lenet, weights  # noqa: E402


def random_dict(seed: int) -> dict[str, np.ndarray]:
    """A dict of every kind of tensor a Policy meets, sizes from 1 to 1e5 elements."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for i in range(14):
        d = int(rng.choice((1, 3, 10, 40, 90, 150, 400, 900, 2500, 7000, 20000, 100_000)))
        kind = int(rng.integers(0, 7))
        if kind == 0:
            x = rng.standard_normal(d) * 10.0 ** rng.uniform(-4, 1)
        elif kind == 1:
            x = rng.standard_t(3, d) * 0.05
        elif kind == 2:
            x = rng.integers(-3, 4, d) * 0.125
        elif kind == 3:
            x = np.zeros(d)
        elif kind == 4:
            x = 1.0 + 0.02 * rng.standard_normal(d)
        elif kind == 5:
            x = rng.laplace(size=d) * 0.01
        else:
            out[f"t{i}.int"] = rng.integers(-100, 100, d).astype(np.int32)
            continue
        dtype = (np.float32, np.float32, np.float64, np.float16)[int(rng.integers(0, 4))]
        out[f"t{i}.{'weight' if d > 150 else 'bias'}"] = x.astype(dtype)
    return out


def configs() -> dict[str, dict]:
    """The encode keyword arguments of each Policy configuration."""
    return {
        "max_error=0.01": {"codec": "mucsc", "policy": mucsc.Policy(max_error=0.01)},
        "max_error=0.05": {"codec": "mucsc", "policy": mucsc.Policy(max_error=0.05)},
        "model default": {"codec": mucsc.get_codec("mucsc", rounding="nearest"),
                          "policy": mucsc.Policy(max_error=0.01, vector_max_error=0.001)},
        "update default": {"codec": "mucsc", "policy": mucsc.Policy(max_error=0.01, lossy_fp16=False)},
    }


def choices(sd: dict[str, np.ndarray], kw: dict) -> dict:
    """The message's SHA-256 and, per tensor, its group's codec, parameters and stored bytes."""
    blob = mucsc.encode(sd, seed=3, **kw)
    info = mucsc.inspect(blob)
    groups = {g.index: g for g in info.groups}
    stored = {}
    for s in info.sections:
        if s.group is not None:
            stored[s.group] = stored.get(s.group, 0) + s.stored_bytes
    per = {r.name: {"codec": groups[r.group].codec, "params": groups[r.group].params,
                    "bytes": stored.get(r.group, 0)} for r in info.records}
    return {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob), "tensors": per}


def collect(bert_layers: int, randoms: int) -> dict:
    dicts = {"LeNet": weights(lenet()), "ALL-CNN": weights(all_cnn()),
             f"BERT-shaped ({bert_layers} layers)": weights(bert(bert_layers))}
    dicts.update({f"random {s}": random_dict(s) for s in range(randoms)})
    out = {}
    for name, sd in dicts.items():
        for what, kw in configs().items():
            out[f"{name}, {what}"] = choices(sd, kw)
            print(f"{name}, {what}: {out[f'{name}, {what}']['bytes']:,} B", flush=True)
    return out


def differences(old: dict, new: dict) -> list[str]:
    diff = []
    for case in sorted(set(old) | set(new)):
        a, b = old.get(case), new.get(case)
        if a is None or b is None:
            diff.append(f"{case}: only in {'the new' if a is None else 'the saved'} run")
            continue
        for name in sorted(set(a["tensors"]) | set(b["tensors"])):
            ta, tb = a["tensors"].get(name), b["tensors"].get(name)
            if ta != tb:
                diff.append(f"{case}, {name}: {ta} -> {tb}")
        if a["sha256"] != b["sha256"]:
            diff.append(f"{case}: message {a['bytes']:,} B {a['sha256'][:16]} -> {b['bytes']:,} B {b['sha256'][:16]}")
    return diff


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--save", type=Path, help="write the choices to this JSON file")
    ap.add_argument("--against", type=Path, help="compare with choices saved by --save")
    ap.add_argument("--bert-layers", type=int, default=1)
    ap.add_argument("--random", type=int, default=4, help="random dicts (seeds 0..N-1)")
    a = ap.parse_args()
    from mucsc.codec import kernels
    print(f"mucsc from {Path(mucsc.__file__).parent}, kernels {kernels.BACKEND}")
    got = collect(a.bert_layers, a.random)
    if a.save:
        a.save.write_text(json.dumps(got, indent=1, sort_keys=True))
    if a.against:
        diff = differences(json.loads(a.against.read_text()), got)
        print("\n".join(diff) if diff else f"the same choices and bytes in all {len(got)} cases")
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
