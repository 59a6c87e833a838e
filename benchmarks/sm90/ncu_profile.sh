#!/usr/bin/env bash
# Device script: Nsight Compute on the compiled kernel's default plans, to see what
# bounds them (pipes, issue, stalls) instead of inferring it from timing differences. One
# launch per plan (the second: the first loads and warms up), --set full, clocks left alone
# (METHOD.md); longcat-480p by default (the same per-tile work as wan22-720p, a quarter of the
# time per replay pass). Exports the raw metrics and the SASS source page as CSV, prints
# benchmarks/sm90/ncu_summary.py's digest, and packs the CSVs into $OUT/ncu-csv.tar.xz.
# Usage (repo root, PYTHONPATH=.; builds the kernel if needed): bash benchmarks/sm90/ncu_profile.sh [SHAPE]
# NCU_METHODS="vc-8bit vc-8bit/no-vsmooth" profiles only those plans (default: the four below;
# an NVFP4 method profiles its NVFP4 instance). NCU_PREP=1 profiles each plan's preprocessing
# instead: every Triton kernel of its first call (the quantizers, token sums, score term).
set -u
OUT=${OUT:-/tmp/out}
SHAPE=${1:-longcat-480p}
mkdir -p "$OUT" /tmp/ncu
export VCBENCH_KERNEL_CACHE=${VCBENCH_KERNEL_CACHE:-/tmp/vcbench-kernels}
export MAX_JOBS=${MAX_JOBS:-8}
t0=$(date +%s)
timeout -s KILL 200 python3 -m vcbench.kernels.backends.sm90.compiled build > /tmp/ncu/build.log 2>&1 \
  || { tail -n 20 /tmp/ncu/build.log; echo "BUILD FAILED"; exit 1; }
echo "build (or cached): $(( $(date +%s) - t0 )) s"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)
if [ -z "$NCU" ]; then echo "ncu not found"; exit 1; fi
echo "ncu: $NCU ($($NCU --version | tail -n 1))"
for m in ${NCU_METHODS:-vc-8bit vc-8bit/no-vsmooth vc-8bit-vsmooth vc-8bit-vsmooth/no-vsmooth}; do
  tag=${m//\//-}
  t0=$(date +%s)
  if [ "${NCU_PREP:-0}" = 1 ]; then  # the call's Triton kernels; no attention launch
    pick=(-k 'regex:_quantize|_token_sums|_score_term|_fill_nan'); launches=0
  else
    pick=(-k regex:attention_kernel --launch-skip 1 --launch-count 1); launches=2
  fi
  timeout -s KILL 150 "$NCU" --clock-control none "${pick[@]}" --set full --import-source no \
    -f -o "/tmp/ncu/$tag" python3 benchmarks/sm90/ncu_kernel.py --method "$m" --shape "$SHAPE" \
    --launches "$launches" > "/tmp/ncu/$tag.log" 2>&1
  echo "$m: ncu rc=$? in $(( $(date +%s) - t0 )) s; $(grep -E "launches|Error|error" /tmp/ncu/$tag.log | head -n 3)"
  "$NCU" -i "/tmp/ncu/$tag.ncu-rep" --page raw --csv --print-units base > "/tmp/ncu/raw-$tag.csv" 2> "/tmp/ncu/raw-$tag.err" \
    || tail -n 3 "/tmp/ncu/raw-$tag.err"
  "$NCU" -i "/tmp/ncu/$tag.ncu-rep" --page source --csv --print-source sass > "/tmp/ncu/sass-$tag.csv" \
    2> "/tmp/ncu/sass-$tag.err" || { tail -n 3 "/tmp/ncu/sass-$tag.err"; rm -f "/tmp/ncu/sass-$tag.csv"; }
done
(cd /tmp/ncu && tar cJf "$OUT/ncu-csv.tar.xz" raw-*.csv sass-*.csv *.log 2>/dev/null)
python3 benchmarks/sm90/ncu_summary.py /tmp/ncu | tee "$OUT/ncu-summary.txt"
