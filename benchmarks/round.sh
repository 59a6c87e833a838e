#!/usr/bin/env bash
# Device script: one round on the kernels in one call, in the order that makes a result worth
# reading; each stage under its own time limit, so a hang in one leaves the others' output (a
# device command gets 600 s):
#   1. build the compiled sm_90a kernel (where nvcc is; timed, ptxas's registers and spills
#      kept) and check its SASS (IGMMA/QGMMA present, no local memory, no MUFU.EX2 on ExpCast's
#      P path), then small smoke cases in a process of their own (a hang skips the tests);
#   2. the GPU tests (operands bit-equal to the emulation, outputs within the tolerance rule);
#   3. with --sweep, the Triton kernel's launch configurations at the shape;
#   4. grouping time (Triton k-means on bf16 V);
#   5. the compiled kernel beside the Triton one (sm90/compiled_timeit.py; --no-ab skips it),
#      then `vcbench timeit` of the methods beside BF16 (CUPTI, one process), table last.
# Usage (repo root; PYTHONPATH=. plus FA4's as ../shared/device/README.md shows):
#   bash benchmarks/round.sh [--timeit-s W,S] [--shape SHAPE] [--methods A,B] [--sweep]
#     [--skip-build] [--skip-tests] [--skip-timing] [--no-ab]
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
TIMEIT="3,3"; SHAPE=wan22-720p; METHODS="bf16,sage2-8bit,fp8-fa4,vc-8bit-vsmooth,vc-8bit,vc-8bit-fp8qk"
BUILD=1; TESTS=1; TIMING=1; SWEEP=0; AB=1
while [ $# -gt 0 ]; do
  case $1 in
    --timeit-s) TIMEIT=$2; shift 2 ;;
    --shape) SHAPE=$2; shift 2 ;;
    --methods) METHODS=$2; shift 2 ;;
    --sweep) SWEEP=1; shift ;;
    --skip-build) BUILD=0; shift ;;
    --skip-tests) TESTS=0; shift ;;
    --skip-timing) TIMING=0; shift ;;
    --no-ab) AB=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
export PYTHONUNBUFFERED=1
export VCBENCH_KERNEL_CACHE=${VCBENCH_KERNEL_CACHE:-/tmp/vcbench-kernels}
export MAX_JOBS=${MAX_JOBS:-8}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "code: ${VCBENCH_COMMIT:-${GIT_REV:-unknown}}"
TEST_FILES="tests/test_gpu_kernels.py"

# 1. the compiled kernel
if [ $BUILD = 1 ] && command -v nvcc > /dev/null; then
  echo "nvcc: $(nvcc --version | tail -1)"
  t0=$(date +%s.%N)
  timeout -s KILL 180 python3 -m vcbench.kernels.backends.sm90.compiled build --verbose > "$OUT/build.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  echo "build: rc=$rc, $(python3 -c "print(f'{$t1 - $t0:.1f}')") s wall (log: build.log)"
  grep -E "C75[0-9]{2}|spill|Used [0-9]+ registers|error" "$OUT/build.log" | sort | uniq -c | head -20
  if [ $rc != 0 ]; then tail -n 40 "$OUT/build.log"; echo "BUILD FAILED: stop"; exit 1; fi
  LIB=$(python3 -c 'from vcbench.kernels.backends.sm90 import compiled; print(compiled.library_path())')
  python3 benchmarks/sm90/sass_check.py "$LIB" 2>&1 | tee "$OUT/sass.txt"
  timeout -s KILL 45 python3 benchmarks/sm90/compiled_smoke.py > "$OUT/smoke.txt" 2>&1
  rc=$?
  grep -E "ok |BAD|Error|error" "$OUT/smoke.txt" | head -n 12
  if [ $rc = 137 ]; then echo "smoke: HUNG (killed after 45 s): tests skipped"; TESTS=0;
  else echo "smoke: rc=$rc"; TEST_FILES="$TEST_FILES tests/test_gpu_compiled.py"; fi
else
  echo "compiled kernel: not built (no nvcc, or --skip-build); the Triton kernels run"
fi

# 2. the GPU tests
GREEN="not run"
if [ $TESTS = 1 ]; then
  timeout -s KILL 240 python3 -m pytest -q -p no:cacheprovider --tb=line $TEST_FILES \
    2>&1 | tail -n 25 | tee "$OUT/gpu-tests.txt"
  grep -q " passed" "$OUT/gpu-tests.txt" && ! grep -q "failed\|error" "$OUT/gpu-tests.txt" \
    && GREEN=GREEN || GREEN="NOT GREEN (the timings below are of unverified kernels)"
fi
echo "GPU tests ($TEST_FILES): $GREEN"

[ $TIMING = 1 ] || exit 0
w=${TIMEIT%,*}; s=${TIMEIT#*,}
# 3-4. the Triton launch configurations, the grouping
if [ $SWEEP = 1 ]; then
  timeout -s KILL 240 python3 benchmarks/timing/sweep_triton.py --shape "$SHAPE" --quick \
    2>&1 | tee "$OUT/sweep.txt" | tail -n 25
fi
timeout -s KILL 60 python3 benchmarks/timing/group_time.py "$SHAPE" 2>&1 | tee "$OUT/grouping.txt"
# 5. timing, table last
[ $AB = 1 ] && timeout -s KILL 240 python3 benchmarks/sm90/compiled_timeit.py --shape "$SHAPE" \
  --warmup-s "$w" --window-s "$s" --json "$OUT/compiled-timeit.json" > "$OUT/compiled-timeit.txt" \
  2>&1 && tail -n 14 "$OUT/compiled-timeit.txt"
timeout -s KILL 300 python3 -m vcbench timeit --methods "$METHODS" --shape "$SHAPE" \
  --warmup-s "$w" --window-s "$s" --json "$OUT/timeit.json" 2>&1 | tail -n 14
echo "GPU tests: $GREEN"
