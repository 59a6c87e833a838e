#!/usr/bin/env bash
# Device script: the NVFP4 kernels (sage3-4bit, vc-4bit, attnqat-tf on 16-bit tensor cores)
# in one call, each stage under its own time limit so a hang in one leaves the others' output
# (a device command gets 600 s; with --skip-check the limits add up to 540 s, most of
# stage 2 is Triton compiling the kernel variants, which the later stages find in its cache):
#   1. benchmarks/checks/nvfp4_compile_report.py: registers, stack, local memory and the tile
#      loop's instructions as this machine's Triton builds the kernels (compiled, not timed);
#   2. tests/test_gpu_nvfp4.py (operands bit-equal, outputs within the derived tolerance,
#      NaN-poisoned buffers, offsets past 2^31 elements), then tests/test_nvfp4_compile.py (no
#      spills with this machine's Triton);
#   3. benchmarks/checks/nvfp4_check.py (unless --skip-check): codes bit-equal and outputs
#      within the rule at N in {1000, 4133, 16384, 75600}, D 64 and 128;
#   4. `vcbench timeit` of the three methods at the Wan2.2 shape (B1 H40 N75600 D128) beside
#      BF16 (FA4 if importable, else cuDNN: the bf16 row's implementation says which);
#      vc-4bit's row carries its plain-step kernel (`plain_ms`, and `plain_over_method`: the
#      two alternated in one window);
#   5. a short table last: each kernel's time as a multiple of BF16's, preprocessing, grouping,
#      SM clock and power. The implementation column keeps "nvfp4 on fp16 mma": these are
#      NVFP4 computed exactly on FP16 MMAs, a fidelity kernel, not an FP4 kernel's speed.
# With --compiled, first the compiled sm_90a kernel is built (its NVFP4 instances' registers and
# local memory printed), its NVFP4 GPU tests (tests/test_gpu_compiled_nvfp4.py, and Q smoothing's
# score term, tests/test_score_term.py) run in stage 2
# instead of the Triton kernel's, and timeit then times the compiled instances (the backend
# order prefers them where they are built).
# Usage (repo root; FA4 as its install notes show, optional):
#   bash benchmarks/checks/nvfp4_round.sh [--timeit-s W,S] [--skip-tests] [--skip-check]
#                                         [--compiled] [--methods A,B,...]
# (--methods: what timeit times beside BF16, the three 4-bit methods unless given; every
# method of the product in one run is the comparison the targets are read from)
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
TIMEIT="5,5"; TESTS=1; CHECK=1; COMPILED=0; METHODS=sage3-4bit,vc-4bit,attnqat-tf
while [ $# -gt 0 ]; do
  case $1 in
    --compiled) COMPILED=1; shift ;;
    --methods) METHODS=$2; shift 2 ;;
    --timeit-s) TIMEIT=$2; shift 2 ;;
    --skip-tests) TESTS=0; shift ;;
    --skip-check) CHECK=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # this tree first, then FA4 if the caller set it
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "code: ${GIT_REV:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"

status=0
# 0. the compiled kernel (--compiled)
if [ $COMPILED = 1 ]; then
  timeout -s KILL 200 python3 -m vcbench.kernels.backends.sm90.compiled build \
    > "$OUT/sm90-build.txt" 2>&1
  rc=$?
  grep -E "^built|nvfp4|error" "$OUT/sm90-build.txt" | head -n 20
  echo "compiled build: rc=$rc (137: killed at 200 s)"
  [ $rc = 0 ] || status=1
fi

# 1. what ptxas made of the Triton kernels here (not with --compiled)
if [ $COMPILED = 0 ]; then
  timeout -s KILL 90 env PYTHONPATH="$PYTHONPATH:$PWD/tests" python3 \
    benchmarks/checks/nvfp4_compile_report.py > "$OUT/nvfp4-compile-report.txt" 2>&1
  rc=$?
  grep -v "nvdisasm warning" "$OUT/nvfp4-compile-report.txt" | tail -n 12
  echo "benchmarks/checks/nvfp4_compile_report.py: rc=$rc (137: killed at 90 s)"
fi

# 2. GPU tests (the first run compiles every kernel variant into Triton's cache), then the
#    no-spill assertions with this machine's Triton (apart: a spill must not stop the tests)
if [ $TESTS = 1 ]; then
  t0=$(date +%s)
  GPU_TESTS=tests/test_gpu_nvfp4.py
  [ $COMPILED = 1 ] && GPU_TESTS="tests/test_gpu_compiled_nvfp4.py tests/test_score_term.py"
  timeout -s KILL 240 python3 -m pytest -q -p no:cacheprovider -x $GPU_TESTS \
    > "$OUT/gpu-nvfp4-tests.txt" 2>&1
  rc=$?
  tail -n 25 "$OUT/gpu-nvfp4-tests.txt"
  echo "$GPU_TESTS: rc=$rc ($(( $(date +%s) - t0 )) s; 137: killed at 240 s)"
  [ $rc = 0 ] || status=1
  [ $COMPILED = 1 ] || timeout -s KILL 60 python3 -m pytest -q -p no:cacheprovider tests/test_nvfp4_compile.py \
    > "$OUT/nvfp4-compile-tests.txt" 2>&1
  rc=$?
  tail -n 5 "$OUT/nvfp4-compile-tests.txt"
  echo "tests/test_nvfp4_compile.py: rc=$rc (137: killed at 60 s)"
  [ $rc = 0 ] || status=1
fi

# 3. codes and outputs at the long lengths
if [ $CHECK = 1 ]; then
  timeout -s KILL 130 env PYTHONPATH="$PYTHONPATH:$PWD/tests" python3 benchmarks/checks/nvfp4_check.py \
    > "$OUT/nvfp4-check.txt" 2>&1
  rc=$?
  grep -E "^BAD|nvfp4 check|Error|error" "$OUT/nvfp4-check.txt" | head -n 30
  grep -E "N75600" "$OUT/nvfp4-check.txt" | head -n 20
  echo "benchmarks/checks/nvfp4_check.py: rc=$rc (137: killed at 130 s; full log nvfp4-check.txt)"
  [ $rc = 0 ] || status=1
fi

# 4. timing beside BF16
w=${TIMEIT%,*}; s=${TIMEIT#*,}
# ~4 windows a method (its preprocessing, kernel, a V-Smooth method's plain kernel and the two
# alternated) at W + S seconds each, plus Triton's compiles
n_methods=$(echo "$METHODS" | tr ',' '\n' | wc -l)
limit=$(( 60 + n_methods * 4 * (${w%.*} + ${s%.*} + 2) ))
timeout -s KILL $limit python3 -m vcbench timeit --methods "$METHODS" \
  --shape wan22-720p --warmup-s "$w" --window-s "$s" --json "$OUT/timeit-nvfp4.json" \
  > "$OUT/timeit-nvfp4.txt" 2>&1
rc=$?
tail -n 14 "$OUT/timeit-nvfp4.txt"
echo "vcbench timeit: rc=$rc (137: killed at $limit s)"
[ $rc = 0 ] || status=1

# 5. the table
python3 - "$OUT/timeit-nvfp4.json" <<'PY'
import json, sys
try:
    result = json.load(open(sys.argv[1]))
except (OSError, ValueError) as err:
    sys.exit(f"no timeit result ({err})")
rows = {r["method"]: r for r in result["rows"]}
base = rows["bf16"]["attention_ms"]


def cell(r, key, fmt):
    v = r.get(key)
    return format(v, fmt) if isinstance(v, (int, float)) and v == v else "-"


print(f"\n{result['label']}")
print(f"{'method':12s} {'implementation':38s} {'attention ms':>12s} {'x bf16':>7s} "
      f"{'plain ms':>9s} {'plain/it':>8s} {'prep ms':>8s} {'group ms':>9s} {'MHz':>5s} "
      f"{'plain MHz':>9s} {'W':>4s}")
for name, r in rows.items():
    print(f"{name:12s} {r['implementation']:38s} {r['attention_ms']:12.2f} "
          f"{r['attention_ms'] / base:7.2f} {cell(r, 'plain_ms', '9.2f'):>9s} "
          f"{cell(r, 'plain_over_method', '8.3f'):>8s} "
          f"{r['preprocess_ms']:8.2f} {cell(r, 'grouping_ms', '9.2f'):>9s} "
          f"{cell(r, 'sm_mhz', '5.0f'):>5s} {cell(r, 'plain_sm_mhz', '9.0f'):>9s} "
          f"{cell(r, 'power_w', '4.0f'):>4s}")
print("targets: kernel <= 1.5x BF16 (moonshot 1.2x), preprocessing <= 4 ms, the plain "
      "kernel faster than its method's (plain/it < 1: the two alternated in one window); "
      "'x bf16' is time over BF16's, not a speedup of FP4 hardware")
PY
exit $status
