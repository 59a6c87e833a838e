#!/usr/bin/env bash
# Device script: the SM clock, power and temperature a kernel runs at, for methods whose
# time and cycle counts disagree (Nsight Compute reports cycles; under the card's power limit
# a kernel that draws more runs at a lower clock). Each method: the compiled kernel launched
# back to back for ~8 s (benchmarks/sm90/ncu_kernel.py) while nvidia-smi samples every 100 ms;
# the median of the samples after the first two seconds, one line per method.
# Usage (repo root, PYTHONPATH=.; builds the kernel if needed):
#   bash benchmarks/sm90/power_clock.sh [SHAPE] [LAUNCHES]   METHODS="vc-8bit vc-8bit-fp8qk"
set -u
SHAPE=${1:-wan22-720p}; LAUNCHES=${2:-80}
export VCBENCH_KERNEL_CACHE=${VCBENCH_KERNEL_CACHE:-/tmp/vcbench-kernels} MAX_JOBS=${MAX_JOBS:-8}
timeout -s KILL 200 python3 -m vcbench.kernels.backends.sm90.compiled build > /tmp/power_clock_build.log 2>&1 \
  || { tail -n 20 /tmp/power_clock_build.log; echo "BUILD FAILED"; exit 1; }
nvidia-smi --query-gpu=name,power.limit,clocks.max.sm --format=csv,noheader
printf "%-22s %9s %9s %7s %9s\n" method "SM MHz" "power W" "temp C" samples
for m in ${METHODS:-vc-8bit vc-8bit-fp8qk}; do
  log=/tmp/power_clock_${m//\//-}.csv
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits \
    -lms 100 > "$log" & smi=$!
  timeout 120 python3 benchmarks/sm90/ncu_kernel.py --method "$m" --shape "$SHAPE" --launches "$LAUNCHES" \
    > /dev/null || echo "$m: launches failed"
  kill $smi; wait $smi 2>/dev/null
  python3 - "$log" "$m" <<'PY'
import statistics, sys
rows = [[float(x) for x in line.split(",")] for line in open(sys.argv[1]) if line.strip()]
busy = [r for r in rows[20:] if r[1] > 200]  # past 2 s, and only while the kernel draws power
med = lambda i: statistics.median(r[i] for r in busy) if busy else float("nan")  # noqa: E731
print(f"{sys.argv[2]:<22} {med(0):9.0f} {med(1):9.1f} {med(2):7.0f} {len(busy):9d}")
PY
  sleep 5  # let the card cool between methods
done
