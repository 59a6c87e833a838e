#!/usr/bin/env bash
# Device script: the QK Hadamard (hadamard_qk) on every method whose QK path takes it, in one
# call, each stage under its own time limit so a hang in one leaves the others' output:
#   1. build the compiled sm_90a kernel where nvcc is (its tests skip without a build);
#   2. the GPU tests against the emulation: quantized operands bit-equal, outputs within the
#      tests' rule, rotation on and off, on inputs with channel outliers in Q and K
#      (tests/test_gpu_kernels.py, test_gpu_compiled.py; the NVFP4 cases of vc-4bit and
#      sage3-4bit in test_gpu_nvfp4.py);
#   3. benchmarks/checks/hadamard_timeit.py: every 8-bit method's kernel and preprocessing time
#      with the rotation off and on at the Wan2.2 shape.
# A device command gets 600 s: run the tests and the timing as two calls,
#   bash benchmarks/checks/hadamard_round.sh --skip-timing
#   bash benchmarks/checks/hadamard_round.sh --skip-tests [--seconds W,S]
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SECONDS_ARG="3,3"; TESTS=1; TIMING=1
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) SECONDS_ARG=$2; shift 2 ;;
    --skip-tests) TESTS=0; shift ;;
    --skip-timing) TIMING=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export VCBENCH_KERNEL_CACHE=${VCBENCH_KERNEL_CACHE:-/tmp/vcbench-kernels}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "code: ${GIT_REV:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
status=0
if [ $TESTS = 1 ] && command -v nvcc > /dev/null; then
  timeout -s KILL 180 python3 -m vcbench.kernels.backends.sm90.compiled build > "$OUT/build.log" 2>&1
  echo "build: rc=$? (log: build.log)"
fi
if [ $TESTS = 1 ]; then
  timeout -s KILL 240 python3 -m pytest -q -p no:cacheprovider -m gpu \
    tests/test_gpu_kernels.py tests/test_gpu_compiled.py \
    -k "hadamard or matches_emulation or other_plans" > "$OUT/hadamard-tests-8bit.txt" 2>&1
  rc=$?; [ $rc = 0 ] || status=1
  echo "8-bit tests: rc=$rc; $(tail -n 1 "$OUT/hadamard-tests-8bit.txt")"
  grep -E "^FAILED|Error" "$OUT/hadamard-tests-8bit.txt" | head -n 20
  timeout -s KILL 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_nvfp4.py \
    -k "vc-4bit or hadamard" > "$OUT/hadamard-tests-nvfp4.txt" 2>&1
  rc=$?; [ $rc = 0 ] || status=1
  echo "NVFP4 tests: rc=$rc; $(tail -n 1 "$OUT/hadamard-tests-nvfp4.txt")"
  grep -E "^FAILED|Error" "$OUT/hadamard-tests-nvfp4.txt" | head -n 20
fi
if [ $TIMING = 1 ]; then
  timeout -s KILL 400 python3 benchmarks/checks/hadamard_timeit.py --seconds "$SECONDS_ARG" 2>&1 \
    | tee "$OUT/hadamard-timeit.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit $status
