#!/usr/bin/env python3
"""Compile the fused rounding kernel (mucsc/codec/backends/_triton_kernel.py) for an NVIDIA architecture and
inspect the machine code: no fused multiply-add, no flush-to-zero, no spills (FORMAT.md 4.3 allows
neither fusing nor flushing the decision's operations).  Needs triton with its CUDA backend (the
bundled ptxas / cuobjdump / nvdisasm), not a GPU.

    python benchmarks/triton_sass.py              # sm_90 (H100 / H200)
    python benchmarks/triton_sass.py --arch 80    # sm_80 (A100)

One line per kernel variant (data dtype, working precision, byte span): registers, local memory,
and the counts of FFMA/DFMA and .FTZ instructions in the SASS (both must be 0).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from mucsc.codec.backends import _triton_kernel, triton_round


def tool(name: str) -> str:
    """A CUDA binary utility shipped inside the triton wheel."""
    import triton.backends.nvidia as nv

    return os.path.join(os.path.dirname(nv.__file__), "bin", name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80, 90")
    args = ap.parse_args()
    fn = triton.jit(_triton_kernel.round_pack_kernel, do_not_specialize=[0, 1, 2, 3, 4])
    print(f"# triton {triton.__version__}, sm_{args.arch}, enable_fp_fusion=False (as triton_round.launch)")
    print(f"{'data':<6} {'work':<6} {'span':>4} {'regs':>5} {'local':>6} {'FMA':>4} {'FTZ':>4}")
    bad = 0
    for xd, f32 in (("fp32", True), ("fp32", False), ("fp64", False)):
        for span in (2, 4, 8, 16):
            cw = "fp32" if f32 else "fp64"
            sig = {"x_ptr": f"*{xd}", "c_ptr": f"*{cw}", "g_ptr": f"*{cw}", "out_ptr": "*u8", "args_ptr": "*i64",
                   "F32": "constexpr", "SPAN": "constexpr", "G": "constexpr"}
            src = ASTSource(fn=fn, signature=sig,
                            constexprs={"F32": f32, "SPAN": span, "G": triton_round.TILE // (8 * span)})
            k = triton.compile(src, target=GPUTarget("cuda", args.arch, 32), options={"enable_fp_fusion": False})
            with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
                f.write(k.asm["cubin"])
                f.flush()
                res = subprocess.run([tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
                sass = subprocess.run([tool("nvdisasm"), f.name], capture_output=True, text=True).stdout
            regs = re.search(r"REG:(\d+)", res)
            local = re.search(r"LOCAL:(\d+)", res)
            fma = len(re.findall(r"\b[FD]FMA\b", sass))
            ftz = len(re.findall(r"\.FTZ\b", sass))
            bad += fma + ftz + int(local.group(1) if local else 0)
            print(f"{xd:<6} {cw:<6} {span:>4} {regs.group(1) if regs else '?':>5} "
                  f"{local.group(1) if local else '?':>6} {fma:>4} {ftz:>4}")
    raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
