#!/usr/bin/env bash
# The checks that need a GPU machine (CUDA, many cores), as one run that prints tables.
#
#     bash benchmarks/gpu_checks.sh [OUTDIR] [FEMNIST_DIR]
#
# Run from the repository root on a machine with a CUDA GPU, torch, numpy, click and zstandard
# (the package need not be installed: the kernels are built in place and PYTHONPATH points here).
#  1. the torch backend's tests with CUDA tensors (tests/test_torch_backend.py: the CUDA cases run
#     only where torch sees a GPU), the fused Triton kernel's (tests/test_triton_kernel.py: its
#     self-check and bytes on the GPU; needs triton, which CUDA builds of torch bring), format 1.2's
#     lane coder (tests/test_lanes.py) and the simulator's device-resident path; then the IDSL Triton
#     kernels' self-check on the GPU (full probes: real layouts of several blocks);
#  2. benchmarks/bench_gpu.py: CUDA tensor -> message -> CUDA tensor at d = 1e7, 1e8, 1e9 vs the host path,
#     with the fused Triton kernel and without it (MUCSC_TRITON=0), the default (IDSL, format 1.2) and
#     id_coding=packed (the 1.0 default), and each stage alone (the IDSL coder's steps too);
#     with --stages also the CRC-32 of the packed IDs on the device vs the host and the message writer
#     alone (device CRC / host CRC, 1 thread / all cores, against the old writer's passes);
#     2b. the top-k selection's steps (radix select vs torch.topk; where Gaussian data has ties at the
#     k-th magnitude, the host's tie path and the device path on a tie-free input) and topk/stc/bmucsc
#     end to end at 1e8;
#  3. benchmarks/bench_lanes.py: one message's encode/decode with 1, 4, 16 threads at d = 3e7, IDSL
#     against id_coding=packed (decode of IDSL has no single-stream stage; issue 22's >= 6x at 16);
#     3b. bench_codec.py --assembly: the host path's writer share at d = 3e8 (compress off/default);
#  4. mucsc sim on the FEMNIST sample (LeNet, 1.33M parameters), --device cuda vs --device cpu:
#     the per-round encode/decode time with updates encoded where they live;
#     4b. ALL-CNN with --device cuda: the codec's share of a client's compute (benchmarks/sim_share.py);
#     4c. the quick start with --device auto vs --device cpu (auto keeps small models on the CPU).
# Each step's output also goes to OUTDIR (default /tmp/gpu_checks).  Each step runs under a time limit
# (timeout) so that the whole run stays under 8 minutes; a step cut short says so, and what it printed
# until then is kept (limits: 150 + 30 + 90 + 35 + 45 + 25 + 2 x 20 + 30 + 25 = 470 s after the build;
# step 1 took more than 60 s on an H200 host, so it has the most).
set -u
out=${1:-/tmp/gpu_checks}
femnist=${2:-../shared/data/femnist-sample}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
py=${PYTHON:-python3}

echo "== machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
lscpu | grep -E "^Model name|^CPU\(s\)" ; free -g | head -2
$py -c "import sys, torch, numpy, zstandard; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'zstandard', zstandard.__version__)"
$py setup.py -q build_ext --inplace >"$out/build.log" 2>&1 || { echo "C kernels did not build:"; tail -20 "$out/build.log"; }
$py -c "import mucsc.codec.kernels as k; print('kernels backend', k.BACKEND)"
$py -c "import triton; print('triton', triton.__version__)" 2>/dev/null || echo "triton: not importable (the fused kernel's checks are skipped)"

start=$SECONDS
step() {  # step SECONDS NAME COMMAND...: run with a time limit, report the time taken
  local limit=$1 name=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@"
  local rc=$?
  [ $rc -eq 124 ] && echo "(step $name cut at its ${limit} s limit)"
  echo "(step $name: $((SECONDS - t0)) s, $((SECONDS - start)) s in all)"
}

echo "== 1. tests with CUDA tensors"
step 150 1 bash -c "$py -m pytest -q -p no:cacheprovider -rs tests/test_torch_backend.py tests/test_triton_kernel.py \
    tests/test_lanes.py 'tests/test_fedsim_sim.py::test_device_resident_updates_change_nothing' 2>&1 | tail -25" \
    | tee "$out/tests.txt"
step 30 1b $py -c "import torch; from mucsc.codec.backends import triton_lanes as t
for dt in (torch.uint8, torch.int32): print('IDSL Triton kernels self-check', dt, t._self_check(torch.device('cuda'), dt), t.disabled_reason())" \
    2>&1 | tee "$out/lanes_selfcheck.txt"

echo "== 2. bench_gpu"
step 90 2 $py benchmarks/bench_gpu.py --sizes 1e7,1e8,1e9 --repeat 2 --stages 2>&1 | tee "$out/bench_gpu.txt"
echo "== 2b. the top-k family's and B-MUCSC's device selection, step by step, and their end-to-end rows"
step 35 2b $py benchmarks/bench_gpu.py --sizes 1e8 --repeat 2 --selection 0.01 --codecs topk,stc,bmucsc 2>&1 | tee "$out/bench_selection.txt"

echo "== 3. threads: IDSL (default) vs packed IDs (zstd), encode and decode"
step 45 3 $py benchmarks/bench_lanes.py --d 3e7 --threads 1,4,16 --repeat 3 2>&1 | tee "$out/threads.txt"
echo "== 3b. the message writer's share of a host encode (one buffer, CRC in the copy; packed IDs packed into it)"
step 25 3b $py benchmarks/bench_codec.py --assembly --d 3e8 --z 16 --repeat 2 2>&1 | tee "$out/assembly.txt"

echo "== 4. mucsc sim, FEMNIST sample, LeNet: --device cuda vs cpu"
if [ -d "$femnist" ]; then
  for dev in cuda cpu; do
    timeout 20 $py -m mucsc.cli sim --dataset femnist --data-dir "$femnist" -N 26 -K 10 --codecs none,mucsc,bmucsc,signsgd \
        --rounds 3 --device $dev --workers 1 -q -o "$out/sim_$dev" >/dev/null 2>"$out/sim_$dev.err" \
        || { echo "sim --device $dev failed:"; tail -5 "$out/sim_$dev.err"; }
  done
  $py - "$out" <<'EOF'
import csv, sys, pathlib
out = pathlib.Path(sys.argv[1])
print("| codec | device | train s/round | encode s/round | decode s/round | uplink bytes, round 1 |")
print("|---|---|---|---|---|---|")
for codec in ("none", "mucsc", "bmucsc", "signsgd"):
    for dev in ("cuda", "cpu"):
        d = out / f"sim_{dev}" / codec
        if not (d / "timing.csv").exists():
            print(f"| {codec} | {dev} | failed | | | |"); continue
        t = list(csv.DictReader(open(d / "timing.csv")))[1:]  # round 1 warms the device up
        r = list(csv.DictReader(open(d / "rounds.csv")))
        mean = lambda k: sum(float(x[k]) for x in t) / len(t)
        print(f"| {codec} | {dev} | {mean('train_s'):.3f} | {mean('encode_s'):.3f} | {mean('decode_s'):.3f} | {r[0]['bytes_up']} |")
EOF
  echo "== 4b. ALL-CNN on the FEMNIST sample, --device cuda: the codec's share of a client's compute (issue 21: <= 25 %)"
  step 30 4b $py benchmarks/sim_share.py share --device cuda --model allcnn --dataset femnist --data-dir "$femnist" \
      --codecs mucsc,bmucsc 2>&1 | tee "$out/sim_share.txt"
else
  echo "no FEMNIST sample at $femnist: steps 4 and 4b skipped"
fi
echo "== 4c. the quick start (mucsc sim defaults): --device auto vs --device cpu (issue 21: auto never slower)"
step 25 4c $py benchmarks/sim_share.py auto 2>&1 | tee "$out/sim_auto.txt"
echo "(all steps: $((SECONDS - start)) s)"
