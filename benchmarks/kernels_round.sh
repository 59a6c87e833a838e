#!/usr/bin/env bash
# Device script: one round on the kernels, in the order that makes a result worth reading.
#   1. the GPU tests (operands bit-equal, outputs within the tolerance rule): stop if red;
#   2. the Triton variant sweep at the Wan2.2 shape (do_bench medians, BF16 beside it);
#   3. grouping time (Triton k-means on bf16 V, torch on FP32 V);
#   4. `vcbench timeit` (CUPTI) for every method, JSON into $OUT.
# Usage (repo root, PYTHONPATH set by the caller, FA4 optional):
#   bash benchmarks/kernels_round.sh [--baseline OLD.py] [--skip-sweep] [--timeit-s W,S]
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BASELINE=""; SWEEP=1; TIMEIT="4,3"
while [ $# -gt 0 ]; do
  case $1 in
    --baseline) BASELINE="--baseline $2"; shift 2 ;;
    --skip-sweep) SWEEP=0; shift ;;
    --timeit-s) TIMEIT=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
git_rev=${GIT_REV:-unknown}
echo "code: $git_rev"

python3 -m pytest -q -p no:cacheprovider tests/test_gpu_kernels.py -x 2>&1 | tail -n 15 | tee "$OUT/gpu-tests.txt"
grep -q " passed" "$OUT/gpu-tests.txt" && ! grep -q "failed\|error" "$OUT/gpu-tests.txt" || { echo "GPU tests not green: stop"; exit 1; }

if [ $SWEEP = 1 ]; then
  python3 benchmarks/sweep_triton.py --quick --configs 8x3 $BASELINE 2>&1 | tee "$OUT/sweep.txt" | tail -n 25
fi
python3 benchmarks/group_time.py wan22-720p 2>&1 | tee "$OUT/grouping.txt"
w=${TIMEIT%,*}; s=${TIMEIT#*,}
python3 -m vcbench timeit --methods bf16,sage2-8bit,fp8-fa4,vc-8bit-vsmooth,vc-8bit \
  --shape wan22-720p --warmup-s "$w" --window-s "$s" --json "$OUT/timeit-wan22.json" 2>&1 | tail -n 14
