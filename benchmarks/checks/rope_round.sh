#!/usr/bin/env bash
# Device script: RoPE fused into the 8-bit Triton quantizers, in one call, each stage under its
# own time limit so a hang in one leaves the others' output:
#   1. the GPU tests (tests/test_gpu_rope.py): fused operands bit-equal to the emulation's
#      (RoPE applied first, as diffusers does), and every GPU backend's attention with rope=
#      equal to rotating first, bit for bit;
#   2. benchmarks/checks/rope_check.py: the same bit-equality at a small shape and at Wan2.2's
#      (B1 H40 N75600 D128) on outlier inputs, and the preprocessing with RoPE fused vs eager;
#   3. Figure 7 (`vcbench analyze fusion --shape wan22-720p`), its RoPE rung timed now.
# A device command gets 600 s: run it as two calls if need be,
#   bash benchmarks/checks/rope_round.sh --skip-fig7
#   bash benchmarks/checks/rope_round.sh --skip-tests
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
TESTS=1; FIG7=1
while [ $# -gt 0 ]; do
  case $1 in
    --skip-tests) TESTS=0; shift ;;
    --skip-fig7) FIG7=0; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "code: ${GIT_REV:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
status=0
if [ $TESTS = 1 ]; then
  timeout -s KILL 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_rope.py \
    > "$OUT/rope-tests.txt" 2>&1
  rc=$?; [ $rc = 0 ] || status=1
  echo "GPU tests: rc=$rc; $(tail -n 1 "$OUT/rope-tests.txt")"
  grep -E "^FAILED|Error" "$OUT/rope-tests.txt" | head -n 20
  timeout -s KILL 300 python3 benchmarks/checks/rope_check.py 2>&1 | tee "$OUT/rope-check.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if [ $FIG7 = 1 ]; then
  timeout -s KILL 240 python3 -m vcbench analyze fusion --shape wan22-720p --out "$OUT/fig7" \
    2>&1 | tee "$OUT/fig7.txt"
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit $status
