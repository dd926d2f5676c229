#!/usr/bin/env python3
"""Checkpoints at LLM scale (issue 35): streamed compress / decompress / random access against the
fp16 reference, time and peak RSS, on generated transformer-shaped bf16 safetensors files.

    python benchmarks/large_checkpoint.py generate DIR [--layers 24] [--layers 12]
    python benchmarks/large_checkpoint.py run DIR [--layers 24] [--skip-reference] [--fp16] [--bits 4.5]

``generate`` writes ``DIR/model-L{layers}.safetensors``: ``layers`` blocks at hidden 1024 (q, k, v, o
1024x1024; mlp up 4096x1024 and down 1024x4096; two norms of 1024), a 32000x1024 embedding and a
final norm, bfloat16, Student-t(4) weights with 1% of each matrix's input columns scaled 8x (outlier
columns), norms near 1.  24 layers: 334,808,064 parameters (669,635,408 bytes); 12 layers: 183,788,544
(367,586,784 bytes).  The file is written tensor by tensor (no torch: bfloat16 rounded in numpy): memory
is about the embedding's values in float64 (429 MB peak RSS measured for 12 layers).

``run`` times, each as its own process under ``/usr/bin/time -v`` (wall seconds, CPU seconds: user +
system, peak RSS):
- the reference: safetensors' ``load_file`` + ``.half()`` of every float tensor + ``save_file`` (torch);
- ``mucsc compress`` with no options (``--fp16``: also ``--codec fp16``; ``--bits B``: also ``--bits B``,
  its message decompressed again for its bits per weight and worst 2-D tensor);
- ``mucsc decompress`` to .safetensors;
- ``mucsc.open(msg).get_tensor(name)`` of one mid-model matrix (the time inside the process, from
  ``mucsc.open`` to the tensor, is printed next to the process's);
then checks the restored file: every 2-D tensor's relative error ||y - x|| / ||x|| (the worst is
printed; the bar is 1%), every dtype kept, and ``get_tensor`` equal to the decompressed tensor.
Scratch files stay in DIR.  The machine is shared: say the load when quoting numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HIDDEN, FFN, VOCAB = 1024, 4096, 32000
PROBE = "layers.{mid}.mlp.up.weight"  # the tensor get_tensor reads


def shapes(layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) of the generated model, in file order."""
    out = [("embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(layers):
        p = f"layers.{i}."
        out += [(p + "input_norm.weight", (HIDDEN,))]
        out += [(p + f"attn.{n}.weight", (HIDDEN, HIDDEN)) for n in ("q", "k", "v", "o")]
        out += [(p + "post_norm.weight", (HIDDEN,)), (p + "mlp.up.weight", (FFN, HIDDEN)),
                (p + "mlp.down.weight", (HIDDEN, FFN))]
    out.append(("norm.weight", (HIDDEN,)))
    return out


def values(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """One tensor's float32 values: Student-t(4) with outlier columns, or a norm near 1."""
    if len(shape) == 1:
        return (1.0 + 0.05 * rng.standard_normal(shape[0])).astype(np.float32)
    rows, cols = shape
    std = 0.02
    w = (rng.standard_t(4, (rows, cols)) * (std / math.sqrt(2.0))).astype(np.float32)
    w[:, rng.choice(cols, max(1, cols // 100), replace=False)] *= 8.0
    return w


def generate(path: Path, layers: int, seed: int = 0) -> None:
    """Write the model tensor by tensor (bfloat16 safetensors)."""
    from mucsc.codec.backends.tensors import bf16_bits
    from mucsc.tensorfiles import atomic_open, open_writer

    entries = [(n, "bfloat16", s) for n, s in shapes(layers)]
    rng = np.random.default_rng(seed)
    with atomic_open(path, force=True) as f:
        w = open_writer(f, "safetensors", entries)
        for name, _, shape in entries:
            w.write(name, bf16_bits(values(rng, name, shape)))
        w.finish()
    print(f"{path}: {sum(math.prod(s) for _, s in shapes(layers)):,} parameters, {path.stat().st_size:,} bytes")


REFERENCE = """
import sys, torch
from safetensors.torch import load_file, save_file
sd = load_file(sys.argv[1])
save_file({k: v.half() if v.is_floating_point() else v for k, v in sd.items()}, sys.argv[2])
"""

GET = """
import sys, time, json
t0 = time.perf_counter()
import mucsc
t1 = time.perf_counter()
with mucsc.open(sys.argv[1]) as f:
    x = f.get_tensor(sys.argv[2])
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "get_s": t2 - t1, "shape": list(x.shape)}))
"""


def timed(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd`` under /usr/bin/time -v: wall seconds, peak RSS (MB), stdout."""
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", r.stderr).group(1)
    secs = sum(float(p) * 60 ** i for i, p in enumerate(reversed(wall.split(":"))))
    rss = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr).group(1))
    cpu = sum(float(re.search(rf"{k} time \(seconds\): (\S+)", r.stderr).group(1)) for k in ("User", "System"))
    return {"wall_s": secs, "cpu_s": cpu, "rss_mb": rss / 1024, "stdout": r.stdout}


def check(src: Path, back: Path) -> tuple[float, str, bool]:
    """(worst relative error of a 2-D tensor, its name, all dtypes kept), read tensor by tensor."""
    from mucsc.tensorfiles import open_reader

    a, b = open_reader(src), open_reader(back)
    try:
        bi = {n: i for i, (n, _, _) in enumerate(b.entries)}
        worst, where, same = 0.0, "", True
        for i, (name, dtype, shape) in enumerate(a.entries):
            j = bi[name]
            same &= b.entries[j][1] == dtype
            if len(shape) != 2:
                continue
            x, y = (_wide(r.read(k), dt) for r, k, dt in ((a, i, dtype), (b, j, b.entries[j][1])))
            rel = float(np.linalg.norm((y - x).ravel()) / np.linalg.norm(x.ravel()))
            if rel > worst:
                worst, where = rel, name
        return worst, where, same
    finally:
        a.close()
        b.close()


def _wide(v: np.ndarray, dtype: str) -> np.ndarray:
    return ((v.astype(np.uint32) << 16).view(np.float32) if dtype == "bfloat16" else v).astype(np.float64)


def run(d: Path, layers: int, reference: bool, fp16: bool, bits: list[float] = ()) -> list[dict]:
    src = d / f"model-L{layers}.safetensors"
    msg, back = d / f"model-L{layers}.mucsc", d / f"back-L{layers}.safetensors"
    env = {**os.environ}
    mucsc_cmd = [sys.executable, "-m", "mucsc.cli"]
    rows = []
    if reference:
        r = timed([sys.executable, "-c", REFERENCE, str(src), str(d / "ref-fp16.safetensors")])
        rows.append({"step": "reference: load + fp16 cast + save", **r})
    r = timed([*mucsc_cmd, "compress", str(src), "-o", str(msg), "-f", "-q"], env)
    rows.append({"step": "mucsc compress (no options)", **r, "bytes": msg.stat().st_size})
    if fp16:
        m16 = d / f"model-L{layers}-fp16.mucsc"
        r = timed([*mucsc_cmd, "compress", str(src), "-o", str(m16), "--codec", "fp16", "-f", "-q"], env)
        rows.append({"step": "mucsc compress --codec fp16", **r, "bytes": m16.stat().st_size})
    budgets = []
    for b in bits:
        mb = d / f"model-L{layers}-bits{b}.mucsc"
        r = timed([*mucsc_cmd, "compress", str(src), "-o", str(mb), "--bits", str(b), "-f", "-q"], env)
        rows.append({"step": f"mucsc compress --bits {b}", **r, "bytes": mb.stat().st_size})
        budgets.append((b, mb))
    r = timed([*mucsc_cmd, "decompress", str(msg), "-o", str(back), "-f", "-q"], env)
    rows.append({"step": "mucsc decompress -> .safetensors", **r})
    params = sum(math.prod(s) for _, s in shapes(layers))
    for b, mb in budgets:  # not timed: the budget's bits per weight and its worst 2-D tensor
        bb = d / f"back-L{layers}-bits{b}.safetensors"
        subprocess.run([*mucsc_cmd, "decompress", str(mb), "-o", str(bb), "-f", "-q"], check=True, env=env)
        worst, where, same = check(src, bb)
        rows.append({"step": f"check --bits {b}", "bits_per_weight": 8 * mb.stat().st_size / params,
                     "worst_2d": worst, "worst_name": where, "dtypes_kept": same})
    probe = PROBE.format(mid=layers // 2)
    r = timed([sys.executable, "-c", GET, str(msg), probe], env)
    inner = json.loads(r["stdout"].strip().splitlines()[-1])
    rows.append({"step": f"mucsc.open().get_tensor({probe!r})", **r, "inner_s": inner["get_s"]})
    worst, where, same = check(src, back)
    import mucsc
    from mucsc.tensorfiles import open_reader

    rb = open_reader(back)  # the probe must equal the full decompress's tensor
    try:
        full = rb.read([n for n, _, _ in rb.entries].index(probe))
    finally:
        rb.close()
    with mucsc.open(msg, framework="np") as f:
        got = f.get_tensor(probe)
    equal = bool(np.array_equal(_wide(full, "bfloat16"), got.astype(np.float64)))
    rows.append({"step": "check", "worst_2d": worst, "worst_name": where, "dtypes_kept": same,
                 "get_equals_decompress": equal})
    return rows


def table(rows: list[dict], layers: int) -> str:
    ref = next((r["wall_s"] for r in rows if r["step"].startswith("reference")), None)
    cpu = next((r["cpu_s"] for r in rows if r["step"].startswith("reference")), None)
    lines = [f"### {layers} layers", "", "| step | wall s | x reference | CPU s | x reference | peak RSS MB | output bytes |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["step"].startswith("check"):
            continue
        x = f"{r['wall_s'] / ref:.2f}" if ref else "-"
        xc = f"{r['cpu_s'] / cpu:.2f}" if cpu else "-"
        extra = f" (get_tensor itself {r['inner_s']:.3f} s)" if "inner_s" in r else ""
        lines.append(f"| {r['step']}{extra} | {r['wall_s']:.2f} | {x} | {r['cpu_s']:.2f} | {xc} | {r['rss_mb']:.0f} | "
                     f"{r.get('bytes', '') and format(r['bytes'], ',')} |")
    for c in rows:
        if c["step"].startswith("check --bits"):
            lines += ["", f"{c['step'][6:]}: {c['bits_per_weight']:.4f} bits/weight, worst 2-D tensor "
                      f"{100 * c['worst_2d']:.2f}% ({c['worst_name']}); dtypes kept: {c['dtypes_kept']}"]
    c = next(r for r in rows if r["step"] == "check")
    lines.append("")
    lines.append(f"worst 2-D tensor: {100 * c['worst_2d']:.3f}% ({c['worst_name']}); dtypes kept: "
                 f"{c['dtypes_kept']}; get_tensor == decompress: {c['get_equals_decompress']}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["generate", "run"])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--layers", type=int, action="append")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-reference", action="store_true")
    ap.add_argument("--fp16", action="store_true", help="also time --codec fp16")
    ap.add_argument("--bits", type=float, action="append", default=[], help="also time --bits B (repeatable)")
    a = ap.parse_args()
    a.dir.mkdir(parents=True, exist_ok=True)
    for layers in a.layers or [24]:
        if a.what == "generate":
            t0 = time.perf_counter()
            generate(a.dir / f"model-L{layers}.safetensors", layers, a.seed)
            print(f"  {time.perf_counter() - t0:.1f} s")
        else:
            rows = run(a.dir, layers, not a.skip_reference, a.fp16, a.bits)
            print(table(rows, layers), flush=True)
            print(json.dumps([{k: v for k, v in r.items() if k != "stdout"} for r in rows]))


if __name__ == "__main__":
    main()
