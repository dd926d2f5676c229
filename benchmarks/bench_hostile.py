#!/usr/bin/env python3
"""What refusing the hostile inputs of issue 26 costs: peak memory growth and time (findings 1, 2, 3).

    python benchmarks/bench_hostile.py                        # this checkout
    python benchmarks/bench_hostile.py --code /tmp/old        # another checkout (e.g. git worktree at a081c4f)
    python benchmarks/bench_hostile.py --skip-pt              # without the 2 GiB .pt bomb (needs torch)

Each measurement runs in a fresh Python process (PYTHONPATH = the checkout), which first reads the
input file, then records its peak RSS (``ru_maxrss``), runs the step and records the peak again:
"growth" is the difference, "s" the step's wall time, "result" the error it ended with.
- findings 1 and 3: ``mucsc.decode``, ``mucsc.inspect`` and ``mucsc info`` (in process) of the
  message with a 16 MiB nested HEAD (4 KB) and of the one with a 300,000-record HEAD (168 KB); and
  ``decode(max_expansion=None)``, the trusted path, where only the spec's 16 MiB bounds HEAD (the
  nesting scan must still be cheap; a 300,000-record HEAD is then parsed: the caller trusts it);
- finding 2: ``mucsc compress`` of a .pt whose storage member inflates to 2 GiB, against the same
  command on a normal small .pt (peak RSS of each whole process; the difference is what the bomb costs).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "fuzz"))

STEP = r"""
import resource, sys, time
blob = open(sys.argv[1], "rb").read()
import mucsc
from mucsc.cli.main import main
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
try:
    if sys.argv[2] == "decode":
        mucsc.decode(blob)
    elif sys.argv[2] == "decode, max_expansion=None":
        mucsc.decode(blob, max_expansion=None)
    elif sys.argv[2] == "inspect":
        mucsc.inspect(blob)
    else:
        main(["info", sys.argv[1]], standalone_mode=False)
    result = "accepted"
except BaseException as exc:
    result = type(exc).__name__
dt = time.perf_counter() - t
growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(f"{growth / 1024:.1f} {dt:.3f} {result}")
"""

WHOLE = r"""
import resource, subprocess, sys, time
t = time.perf_counter()
p = subprocess.run([sys.executable, "-m", "mucsc.cli", "compress", sys.argv[1], "-o", sys.argv[2], "-q"],
                   capture_output=True, text=True)
dt = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
line = (p.stderr.strip().splitlines() or ["ok"])[-1][:60]
print(f"{peak / 1024:.1f} {dt:.3f} exit {p.returncode}: {line}")
"""


def run(code: Path, script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(code)}
    p = subprocess.run([sys.executable, "-c", script, *args], env=env, capture_output=True, text=True,
                       timeout=900, cwd=tempfile.gettempdir())  # not ROOT: "-c" puts the cwd first on sys.path
    return p.stdout.strip() or f"crashed: {p.stderr.strip().splitlines()[-1:]}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, default=ROOT, help="checkout whose mucsc is measured")
    ap.add_argument("--skip-pt", action="store_true", help="skip the .pt bomb (finding 2)")
    args = ap.parse_args()
    import reproducers

    with tempfile.TemporaryDirectory() as tmp:
        print(f"mucsc from {args.code}")
        print("| finding | input bytes | step | peak RSS growth MiB | s | result |")
        print("|---|---|---|---|---|---|")
        for finding, name in (("1", "deep_head_16mib"), ("3", "records_300k")):
            path = Path(tmp) / f"{name}.mucsc"
            path.write_bytes(reproducers.MESSAGES[name]())
            for step in ("decode", "inspect", "info", "decode, max_expansion=None"):
                growth, dt, result = run(args.code, STEP, str(path), step).split(" ", 2)
                print(f"| {finding} | {path.stat().st_size} | {step} | {growth} | {dt} | {result} |")
        if args.skip_pt:
            return
        print()
        print("| finding 2: `mucsc compress` of | file bytes | whole-process peak RSS MiB | s | result |")
        print("|---|---|---|---|---|")
        normal = Path(tmp) / "normal.pt"
        import torch

        torch.save({"w": torch.zeros(4)}, normal)
        bomb = reproducers.pt_bomb(Path(tmp) / "bomb.pt")
        for label, path in (("a normal .pt (4 floats)", normal), ("the 2 GiB bomb", bomb)):
            peak, dt, result = run(args.code, WHOLE, str(path), str(Path(tmp) / "out.mucsc")).split(" ", 2)
            print(f"| {label} | {path.stat().st_size} | {peak} | {dt} | {result} |")
            (Path(tmp) / "out.mucsc").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
