#!/usr/bin/env python3
"""The codec at the shapes people have (issue 21): one table of ratios measured in one run.

    python benchmarks/bench_shapes.py [--repeat 5] [--only fixed,floor,goals,dicts,policy,cli,torch]
                                      [--bert-layers 6] [--clock wall|cpu]

Rows (Gaussian float32 data, seed 0, one thread; every time is the best of ``--repeat`` runs, each
run looping a small case until it takes >= ~50 ms):
- fixed Z = 16 at d = 1e3 .. 1e7: MB/s and the rate as a share of the d = 1e7 rate;
- floor: the framework's per-call cost, a ``codec="none"`` encode of 1e4 float32 and its decode, in us
  (container, HEAD, CRC and dispatch around a copy);
- goals (bits=2, max_error=0.05) at d = 1e5 and 1e6: time / the fixed Z = 16 encode of the same
  vector, with the bits per element and J / |x|^2 they send;
- state_dicts shaped like LeNet (10 tensors, 61,706 parameters), fedsim's FEMNIST LeNet (8 tensors,
  1.33M; with torch also the state_dict ``mucsc sim`` initialises), ALL-CNN (18 tensors, 1.37M) and a BERT-shaped encoder (all-MiniLM-L6's shapes: 101
  tensors, 22.7M at 6 layers): shared Z = 16,
  per-tensor Z = 16 (``shared=False``), ``Policy(max_error=0.01)`` (``mucsc compress``'s model mode),
  fp16, each / the shared encode (the Policy rows with the message's bytes and bits per element);
- ``mucsc compress`` on the BERT-shaped dict saved as safetensors: the default / ``--codec fp16``
  (the real command in a subprocess, interpreter start-up included in both), with the output's size;
- with torch installed, the fixed-Z and state_dict rows again on torch CPU tensors.
The machine is shared: compare ratios within one run, and repeat the run; ``--clock cpu`` times
the process's CPU time instead of the wall clock (other jobs' load then counts less).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# one thread means BLAS too: some encode paths call np.dot (norms, nearest rounding), and a threaded
# BLAS on a loaded machine moves those rows by orders of magnitude (set before numpy is imported)
for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import numpy as np  # noqa: E402

import mucsc  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MIN_RUN_S = 0.05
CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCK["wall"]  # main() sets --clock


def best_time(fn: Callable[[], object], repeat: int) -> float:
    """Best seconds per call of ``repeat`` runs; a fast call is looped so a run lasts >= MIN_RUN_S."""
    t = clock()
    fn()
    one = clock() - t
    loops = max(1, int(MIN_RUN_S / max(one, 1e-6)))
    best = one
    for _ in range(repeat):
        t = clock()
        for _ in range(loops):
            fn()
        best = min(best, (clock() - t) / loops)
    return best


def lenet() -> dict[str, tuple[int, ...]]:
    """LeNet-5 on 28x28 digits (fedsim's lenet shapes without FEMNIST's wide layer): 61,706 parameters."""
    return {"conv1.weight": (6, 1, 5, 5), "conv1.bias": (6,), "conv2.weight": (16, 6, 5, 5), "conv2.bias": (16,),
            "fc1.weight": (120, 400), "fc1.bias": (120,), "fc2.weight": (84, 120), "fc2.bias": (84,),
            "fc3.weight": (10, 84), "fc3.bias": (10,)}


def femnist_lenet() -> dict[str, tuple[int, ...]]:
    """fedsim's LeNet for FEMNIST (mucsc.fedsim.models.lenet: 62 classes, hidden 400): 8 tensors,
    1,331,758 parameters, one of them 1,254,400 (the shapes of its state_dict, named as torch names them)."""
    return {"0.weight": (32, 1, 5, 5), "0.bias": (32,), "3.weight": (64, 32, 5, 5), "3.bias": (64,),
            "7.weight": (400, 3136), "7.bias": (400,), "9.weight": (62, 400), "9.bias": (62,)}


def fedsim_lenet() -> dict[str, np.ndarray] | None:
    """fedsim's FEMNIST LeNet as ``mucsc sim`` builds it (torch's initialisation, seed 0): its
    state_dict as numpy arrays; None without torch."""
    try:
        from mucsc.fedsim.models import build_model
    except ImportError:
        return None
    return {k: v.detach().numpy().copy() for k, v in build_model("lenet", (1, 28, 28), 62).state_dict().items()}


def all_cnn() -> dict[str, tuple[int, ...]]:
    """ALL-CNN-C (Springenberg et al. 2015) for CIFAR-10: 9 convolutions, 18 tensors, 1,369,738 parameters."""
    chans = [(3, 96, 3), (96, 96, 3), (96, 96, 3), (96, 192, 3), (192, 192, 3), (192, 192, 3), (192, 192, 3),
             (192, 192, 1), (192, 10, 1)]
    out = {}
    for i, (cin, cout, k) in enumerate(chans):
        out[f"conv{i}.weight"] = (cout, cin, k, k)
        out[f"conv{i}.bias"] = (cout,)
    return out


def bert(layers: int = 6, hidden: int = 384, ffn: int = 1536, vocab: int = 30522) -> dict[str, tuple[int, ...]]:
    """A BERT encoder's tensors (all-MiniLM-L6-v2's shapes at the defaults: 22.7M parameters)."""
    out = {"embeddings.word_embeddings.weight": (vocab, hidden), "embeddings.position_embeddings.weight": (512, hidden),
           "embeddings.token_type_embeddings.weight": (2, hidden), "embeddings.LayerNorm.weight": (hidden,),
           "embeddings.LayerNorm.bias": (hidden,)}
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for m in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            out[p + m + ".weight"], out[p + m + ".bias"] = (hidden, hidden), (hidden,)
        out[p + "attention.output.LayerNorm.weight"] = out[p + "attention.output.LayerNorm.bias"] = (hidden,)
        out[p + "intermediate.dense.weight"], out[p + "intermediate.dense.bias"] = (ffn, hidden), (ffn,)
        out[p + "output.dense.weight"], out[p + "output.dense.bias"] = (hidden, ffn), (hidden,)
        out[p + "output.LayerNorm.weight"] = out[p + "output.LayerNorm.bias"] = (hidden,)
    out["pooler.dense.weight"], out["pooler.dense.bias"] = (hidden, hidden), (hidden,)
    return out


def weights(shapes: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    """Float32 tensors like trained weights: N(0, 1/fan_in) matrices, small biases, LayerNorm gains near 1."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        if len(shape) == 1:
            base = 1.0 if name.endswith("LayerNorm.weight") else 0.0
            out[name] = (base + 0.02 * rng.standard_normal(shape)).astype(np.float32)
        else:
            fan_in = int(np.prod(shape[1:]))
            out[name] = (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)
    return out


def row(cells: list[object]) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def fixed_z_rows(make: Callable[[np.ndarray], object], repeat: int, sizes: list[int]) -> list[str]:
    rng = np.random.default_rng(0)
    times = {}
    for d in sizes:
        x = make(rng.standard_normal(d).astype(np.float32))
        times[d] = best_time(lambda: mucsc.encode(x, "mucsc", z=16), repeat)
    ref = sizes[-1] / times[sizes[-1]]
    return [row([f"fixed Z = 16, d = {d:.0e}", f"{t * 1e3:.3f}", f"{4 * d / t / 1e6:.0f} MB/s",
                 f"**{d / t / ref:.2f}x** the d = {sizes[-1]:.0e} rate"]) for d, t in times.items()]


def floor_rows(repeat: int, d: int = 10**4) -> list[str]:
    """The per-call floor: ``codec="none"`` (a float32 copy) encoded and decoded, in us."""
    x = np.random.default_rng(0).standard_normal(d).astype(np.float32)
    blob = mucsc.encode(x, "none")
    enc = best_time(lambda: mucsc.encode(x, "none"), repeat)
    dec = best_time(lambda: mucsc.decode(blob), repeat)
    return [row([f"floor: `codec=\"none\"` {what}, d = {d:.0e}", f"{t * 1e3:.3f}", f"**{t * 1e6:.0f} us**",
                 f"{len(blob):,} B"]) for what, t in (("encode", enc), ("decode", dec))]


def goal_rows(repeat: int, sizes: list[int]) -> list[str]:
    rng = np.random.default_rng(0)
    out = []
    for d in sizes:
        x = rng.standard_normal(d).astype(np.float32)
        norm2 = float(np.dot(x.astype(np.float64), x))
        fixed = best_time(lambda: mucsc.encode(x, "mucsc", z=16), repeat)
        for goal in ({"bits": 2.0}, {"max_error": 0.05}):
            t = best_time(lambda: mucsc.encode(x, "mucsc", **goal), max(1, repeat // 2))
            blob, st = mucsc.encode_with_stats(x, "mucsc", **goal)
            what = ", ".join(f"{k}={v:g}" for k, v in goal.items())
            out.append(row([f"{what}, d = {d:.0e}", f"{t * 1e3:.1f}", f"**{t / fixed:.1f}x** fixed Z = 16",
                            f"{8 * len(blob) / d:.3f} bits, J/|x|^2 {st.J / norm2:.4f}"]))
    return out


def dict_rows(name: str, sd: dict, repeat: int, policy: bool = True) -> list[str]:
    n = sum(int(np.prod(v.shape)) for v in sd.values())
    label = f"{name} ({len(sd)} tensors, {n:,})"
    shared = best_time(lambda: mucsc.encode(sd, "mucsc", z=16), repeat)
    out = [row([f"{label}: shared Z = 16", f"{shared * 1e3:.1f}", "1x", ""])]
    cases = [("per tensor Z = 16 (shared=False)", lambda: mucsc.encode(sd, "mucsc", z=16, shared=False), repeat),
             ("fp16", lambda: mucsc.encode(sd, "fp16"), repeat)]
    if policy:
        cases.append(("Policy(max_error=0.01)", lambda: mucsc.encode(sd, "mucsc", policy=mucsc.Policy(max_error=0.01)),
                      max(1, repeat // 2) if n < 5e6 else 1))
    for what, fn, rep in cases:
        t = best_time(fn, rep)
        size = len(fn()) if what.startswith("Policy") else None
        sends = "" if size is None else f"{size:,} B, {8 * size / n:.4f} bits"
        out.append(row([f"{label}: {what}", f"{t * 1e3:.1f}", f"**{t / shared:.2f}x** shared", sends]))
    return out


def cli_rows(sd: dict, repeat: int) -> list[str]:
    """``mucsc compress`` (model mode default) vs ``--codec fp16`` on a safetensors file."""
    from safetensors.numpy import save_file

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "bert.safetensors"
        save_file(sd, str(src))
        times, sizes = {}, {}
        for what, extra in (("default", []), ("--codec fp16", ["--codec", "fp16"])):
            best = float("inf")
            for _ in range(max(1, repeat // 2)):
                dst = Path(tmp) / "out.mucsc"
                t = time.perf_counter()
                subprocess.run([sys.executable, "-m", "mucsc.cli.main", "compress", str(src), "-o", str(dst),
                                "-T", "1", "--force", *extra], check=True, capture_output=True, env=env)
                best = min(best, time.perf_counter() - t)
            times[what], sizes[what] = best, dst.stat().st_size
    n = sum(int(np.prod(v.shape)) for v in sd.values())
    return [row([f"`mucsc compress` BERT-shaped safetensors: {w}", f"{t * 1e3:.0f}",
                 f"**{t / times['--codec fp16']:.2f}x** --codec fp16", f"{sizes[w]:,} B, {8 * sizes[w] / n:.4f} bits"])
            for w, t in times.items()]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--bert-layers", type=int, default=6)
    ap.add_argument("--clock", choices=tuple(CLOCK), default="wall",
                    help="wall clock, or the process's CPU time (a loaded machine; the cli rows stay wall)")
    ap.add_argument("--only", default="fixed,floor,goals,dicts,policy,cli,torch",
                    help="sections to run, comma-separated (default: all; policy: the Policy rows of dicts)")
    a = ap.parse_args()
    global clock
    clock = CLOCK[a.clock]
    only = set(a.only.split(","))
    sizes = [10**3, 10**4, 10**5, 10**6, 10**7]
    dicts = {"LeNet": weights(lenet()), "FEMNIST LeNet": weights(femnist_lenet()), "ALL-CNN": weights(all_cnn()),
             "BERT-shaped": weights(bert(a.bert_layers))}
    fedsim = fedsim_lenet()
    if fedsim is not None:  # the same shapes, torch's uniform initialisation
        dicts = {**dict(list(dicts.items())[:2]), "FEMNIST LeNet (fedsim init)": fedsim, **dict(list(dicts.items())[2:])}
    print(f"mucsc {mucsc.__version__} from {Path(mucsc.__file__).parent}; kernels "
          f"{__import__('mucsc.codec.kernels').codec.kernels.BACKEND}; best of {a.repeat}, {a.clock} clock; load average "
          f"{os.getloadavg()[0]:.2f} at start")
    print(row(["case", "ms", "ratio", "sends"]))
    print(row(["---"] * 4))

    def emit(lines: list[str]) -> None:
        print("\n".join(lines), flush=True)

    if "fixed" in only:
        emit(fixed_z_rows(lambda x: x, a.repeat, sizes))
    if "floor" in only:
        emit(floor_rows(a.repeat))
    if "goals" in only:
        emit(goal_rows(a.repeat, [10**5, 10**6]))
    if "dicts" in only or "policy" in only:  # --only policy: the dicts' rows with the Policy's
        for name, sd in dicts.items():
            emit(dict_rows(name, sd, a.repeat, policy="policy" in only))
    if "cli" in only:
        emit(cli_rows(dicts["BERT-shaped"], a.repeat))
    if "torch" in only:
        try:
            import torch
        except ImportError:
            print("(torch not installed: no torch rows)")
            return 0
        torch.set_num_threads(1)
        emit([r.replace("| fixed", "| torch: fixed", 1) for r in fixed_z_rows(torch.from_numpy, a.repeat, sizes)])
        for name in ("LeNet", "ALL-CNN"):
            sd = {k: torch.from_numpy(v) for k, v in dicts[name].items()}
            emit([r.replace("| ", "| torch: ", 1) for r in dict_rows(name, sd, a.repeat, policy=False)])
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
