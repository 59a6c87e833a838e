#!/usr/bin/env bash
# Device script (issues 5/7): where V-Smooth's cost in the ping-pong schedules comes from.
# It builds the kernel three times -- real, and the timing probes of compiled.PROBES
# (no-mean-mma: the flush's LDSM + mma.sync gone, its weights still computed; no-mean-flush: the
# whole flush gone; in -vs3s the weights and the wgmma) -- and times vc-8bit-vsmooth and vc-8bit
# with and without the mean term on each, in one process per build (compiled_timeit.py; bf16
# beside it). Probe outputs are wrong by design. Session 15 (docs/perf.md) found the mma.sync
# HMMAs costing the ping-pong schedules 8.5 of their 10.5 ms, which the wgmma (-vs3s) recovered.
# Usage (repo root, PYTHONPATH=.; FA4 optional): bash benchmarks/vsmooth_probe.sh [W,S]
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
TIMEIT=${1:-2,2}
w=${TIMEIT%,*}; s=${TIMEIT#*,}
export PYTHONUNBUFFERED=1
export VCBENCH_KERNEL_CACHE=${VCBENCH_KERNEL_CACHE:-/tmp/vcbench-kernels}
export MAX_JOBS=${MAX_JOBS:-8}
METHODS=vc-8bit-vsmooth,vc-8bit-vsmooth/no-vsmooth,vc-8bit,vc-8bit/no-vsmooth
VARIANTS=simple,pingpong-2lvl,pingpong-2lvl-vs,pingpong-2lvl-vs3s
for probe in "" no-mean-mma no-mean-flush; do
  tag=${probe:-real}
  export VCBENCH_KERNEL_PROBE=$probe
  t0=$(date +%s)
  if ! timeout -s KILL 200 python3 -m vcbench.kernels.compiled build > "$OUT/build-$tag.log" 2>&1; then
    echo "build $tag FAILED"; tail -n 20 "$OUT/build-$tag.log"; continue
  fi
  echo "build $tag: $(( $(date +%s) - t0 )) s"
  timeout -s KILL 240 python3 benchmarks/compiled_timeit.py --skip-triton --methods "$METHODS" \
    --variants "$VARIANTS" --warmup-s "$w" --window-s "$s" --json "$OUT/probe-$tag.json" \
    > "$OUT/probe-$tag.txt" 2>&1 || { echo "timing $tag failed"; tail -n 5 "$OUT/probe-$tag.txt"; }
done
unset VCBENCH_KERNEL_PROBE
python3 - "$OUT" <<'PY'
import json, pathlib, sys

out = pathlib.Path(sys.argv[1])
runs = {}
for tag in ("real", "no-mean-mma", "no-mean-flush"):
    f = out / f"probe-{tag}.json"
    if f.exists():
        runs[tag] = {(r["method"], r["implementation"]): r["ms"] for r in json.loads(f.read_text())["rows"]}
rows = list(dict.fromkeys(k for r in runs.values() for k in r))
print(f"\n{'method':28s} {'implementation':28s} " + " ".join(f"{t:>13s}" for t in runs))
for key in rows:
    print(f"{key[0]:28s} {key[1]:28s} "
          + " ".join(f"{runs[t][key]:13.2f}" if key in runs[t] else f"{'-':>13s}" for t in runs))
PY
