#!/usr/bin/env bash
# Device script: one call for the compiled sm_90a kernel, each stage under its own
# time limit so a hang in one still leaves the others' output (a device command gets 600 s):
#   1. build it (timed; ptxas's registers/spills and any C75xx wgmma warning kept);
#   2. SASS check of the built library (IGMMA/QGMMA present, no local memory, no MUFU.EX2 on
#      ExpCast's P path);
#   3. smoke: small diagnostic cases in a process of their own (a kernel that hangs is killed,
#      and the tests are skipped);
#   4. tests/test_gpu_compiled.py (the tolerance rule against the emulation);
#   5. timing at the Wan2.2 shape beside BF16 (FA4 if importable) and the Triton kernels,
#      table last.
# Usage (repo root; PYTHONPATH=. plus FA4's as ../shared/device/README.md shows):
#   bash benchmarks/compiled_round.sh [--timeit-s W,S] [--skip-tests] [--skip-timing] [--shape SHAPE]
#     [--methods A,B] (compiled_timeit's rows; default all)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
TIMEIT="2,2"; TESTS=1; TIMING=1; SHAPE=wan22-720p; METHODS=()
while [ $# -gt 0 ]; do
  case $1 in
    --timeit-s) TIMEIT=$2; shift 2 ;;
    --skip-tests) TESTS=0; shift ;;
    --skip-timing) TIMING=0; shift ;;
    --shape) SHAPE=$2; shift 2 ;;
    --methods) METHODS=(--methods "$2"); shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
export PYTHONUNBUFFERED=1
export VCBENCH_KERNEL_CACHE=${VCBENCH_KERNEL_CACHE:-/tmp/vcbench-kernels}
export MAX_JOBS=${MAX_JOBS:-8}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "code: ${GIT_REV:-unknown}; nvcc: $(nvcc --version | tail -1)"

# 1. build
t0=$(date +%s.%N)
timeout -s KILL 180 python3 -m vcbench.kernels.compiled build --verbose > "$OUT/build.log" 2>&1
rc=$?
t1=$(date +%s.%N)
echo "build: rc=$rc, $(python3 -c "print(f'{$t1 - $t0:.1f}')") s wall (log: build.log)"
grep -E "C75[0-9]{2}|spill|Used [0-9]+ registers|error" "$OUT/build.log" | sort | uniq -c | head -20
grep -E "registers/thread|^built" "$OUT/build.log"
if [ $rc != 0 ]; then tail -n 40 "$OUT/build.log"; echo "BUILD FAILED: stop"; exit 1; fi
LIB=$(python3 -c 'from vcbench.kernels import compiled; print(compiled.library_path())')

# 2. SASS
python3 benchmarks/sass_check.py "$LIB" 2>&1 | tee "$OUT/sass.txt"
cuobjdump -sass "$LIB" > "$OUT/kernel.sass" 2>/dev/null || true

# 3. smoke in a process of its own: a kernel that hangs is killed and the tests skipped
timeout -s KILL 45 python3 benchmarks/compiled_smoke.py > "$OUT/smoke.txt" 2>&1
rc=$?
grep -E "ok |BAD|per 16|per 8|Error|error" "$OUT/smoke.txt" | head -n 12
if [ $rc = 137 ]; then echo "smoke: HUNG (killed after 45 s)"; tail -n 3 "$OUT/smoke.txt"; TESTS=0;
else echo "smoke: rc=$rc"; fi

# 4. tests
if [ $TESTS = 1 ]; then
  timeout -s KILL 150 python3 -m pytest -q -p no:cacheprovider --tb=line tests/test_gpu_compiled.py \
    2>&1 | tail -n 25 | tee "$OUT/tests.txt"
  grep -q " passed" "$OUT/tests.txt" && ! grep -q "failed\|error" "$OUT/tests.txt" \
    && echo "compiled tests: GREEN" || echo "compiled tests: NOT GREEN (timings below are of an unverified kernel)"
fi

# 5. timing, table last
[ $TIMING = 1 ] || exit 0
w=${TIMEIT%,*}; s=${TIMEIT#*,}
timeout -s KILL 300 python3 benchmarks/compiled_timeit.py --shape "$SHAPE" --warmup-s "$w" \
  --window-s "$s" ${METHODS[@]+"${METHODS[@]}"} --json "$OUT/timeit.json" 2>&1 | tee "$OUT/timeit.txt" | tail -n 24
