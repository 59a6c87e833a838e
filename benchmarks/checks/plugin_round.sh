#!/usr/bin/env bash
# Device script: a user's kernel as a plugin, through the whole chain on a GPU, in one call:
#   1. `vcbench methods` with the example package installed (its entry point registers
#      SageAttention 1.0.6's sageattn as `sageattn-1.0.6`);
#   2. `vcbench timeit` of it beside BF16 (FA4 where importable) and vc-8bit, CUPTI, one run;
#   3. a tiny-wan generate (bf16, vc-8bit on the GPU, sageattn-1.0.6) + score + report.
# Needs: a CUDA GPU, `pip install sageattention==1.0.6 ./examples/sageattention-plugin` (or
# their wheels on PYTHONPATH), diffusers; FA4 optional.
# Usage (repo root): bash benchmarks/checks/plugin_round.sh [--timeit-s W,S]
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
TIMEIT="5,5"
while [ $# -gt 0 ]; do
  case $1 in
    --timeit-s) TIMEIT=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
w=${TIMEIT%,*}; s=${TIMEIT#*,}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "code: ${GIT_REV:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
status=0
timeout -s KILL 60 python3 -m vcbench methods sageattn-1.0.6 || status=1
timeout -s KILL 240 python3 -m vcbench timeit --methods bf16,vc-8bit,sageattn-1.0.6 \
  --warmup-s "$w" --window-s "$s" --json "$OUT/plugin-timeit.json" --out "$OUT/plugin-timeit" \
  > "$OUT/plugin-timeit.txt" 2>&1 || status=1
tail -n 12 "$OUT/plugin-timeit.txt"
gen=$OUT/plugin-gen
timeout -s KILL 200 python3 -m vcbench generate --model tiny-wan --backend gpu \
  --methods bf16,vc-8bit,sageattn-1.0.6 --seeds 0,1 --out "$gen" > "$OUT/plugin-gen.txt" 2>&1 \
  || { status=1; tail -n 20 "$OUT/plugin-gen.txt"; }
timeout -s KILL 120 python3 -m vcbench score "$gen" --metrics psnr,ssim --device cuda \
  --json "$gen/score.json" > "$OUT/plugin-score.txt" 2>&1 || status=1
tail -n 8 "$OUT/plugin-score.txt"
timeout -s KILL 60 python3 -m vcbench report "$gen" --out "$OUT/plugin-report" > /dev/null 2>&1 \
  || status=1
python3 - "$gen" <<'EOF'
import json, sys
m = json.load(open(f"{sys.argv[1]}/manifest.json"))
for i in m["items"]:
    print(i["method"], i["prompt_id"], i["seed"], i["status"], i.get("implementation"),
          i.get("attention_calls"), i.get("wall_s"))
print("plugins:", [(p["plugin"], p["version"], p["registered"]) for p in m.get("plugins", [])])
EOF
echo "plugin round: rc=$status"
exit $status
