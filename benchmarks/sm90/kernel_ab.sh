#!/usr/bin/env bash
# Device script: A/B/C... of whole kernel sources in one call. Each given folder replaces
# vcbench/kernels/backends/sm90/csrc (the kernel is several files) in its own copy of the tree and is built
# into its own kernel cache (in parallel); every source after the first is checked by
# tests/test_gpu_compiled.py; then benchmarks/sm90/compiled_timeit.py (--skip-triton) runs each
# copy in turn, twice (A B C A B C), each process with its own BF16 row, so drift across the
# call shows. Prints a table of ms and each source's mean over A's.
# Usage (repo root; FA4 optional): bash benchmarks/sm90/kernel_ab.sh A_CSRC B_CSRC [C_CSRC ...]
#   METHODS=vc-8bit,vc-8bit/no-vsmooth (default) WINDOW=2 TESTS=1
# (A = HEAD's sources, for instance: git archive HEAD vcbench/kernels/backends/sm90/csrc | tar x -C a, then
# a/vcbench/kernels/backends/sm90/csrc.)
set -u
[ $# -ge 2 ] || { echo "usage: kernel_ab.sh A_CSRC B_CSRC [C_CSRC ...]" >&2; exit 2; }
METHODS=${METHODS:-vc-8bit,vc-8bit/no-vsmooth}; WINDOW=${WINDOW:-2}; TESTS=${TESTS:-1}
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-8}
ROOT=$PWD; WORK=$(mktemp -d); names=""; i=0
for src in "$@"; do
  [ -d "$src" ] || { echo "kernel_ab.sh: $src is not a folder (a copy of csrc/)" >&2; exit 2; }
  X=$(printf "\\x$(printf %x $((65 + i)))"); i=$((i + 1)); names="$names $X"
  mkdir -p "$WORK/$X" && cp -r "$ROOT/vcbench" "$ROOT/benchmarks" "$ROOT/tests" "$WORK/$X/"
  rm -rf "$WORK/$X/vcbench/kernels/backends/sm90/csrc" && cp -r "$src" "$WORK/$X/vcbench/kernels/backends/sm90/csrc"
  echo "$X = $src"
done
t0=$(date +%s)
for X in $names; do
  (cd "$WORK/$X" && VCBENCH_KERNEL_CACHE=$WORK/k$X PYTHONPATH=$WORK/$X \
     python3 -m vcbench.kernels.backends.sm90.compiled build > "$WORK/build$X.log" 2>&1 \
     || echo "build $X failed: $(tail -3 "$WORK/build$X.log")") &
done
wait; echo "builds $(( $(date +%s) - t0 )) s"
if [ "$TESTS" = 1 ]; then for X in ${names#* A}; do
  (cd "$WORK/$X" && VCBENCH_KERNEL_CACHE=$WORK/k$X PYTHONPATH=$WORK/$X timeout 240 \
     python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_compiled.py > "$WORK/test$X.log" 2>&1
   echo "tests $X rc $?: $(tail -1 "$WORK/test$X.log")")
done; fi
for r in 1 2; do for X in $names; do
  (cd "$WORK/$X" && VCBENCH_KERNEL_CACHE=$WORK/k$X PYTHONPATH=$WORK/$X timeout 200 \
     python3 benchmarks/sm90/compiled_timeit.py --skip-triton --methods "$METHODS" \
     --warmup-s "$WINDOW" --window-s "$WINDOW" --json "$WORK/t$X$r.json" > "$WORK/t$X$r.txt" 2>&1) \
    || echo "timeit $X$r failed: $(tail -3 "$WORK/t$X$r.txt")"
done; done
NAMES="$names" WORK="$WORK" python3 - <<'PY'
import json, os
names, work, rows = os.environ["NAMES"].split(), os.environ["WORK"], {}
for x in names:
    for r in (1, 2):
        f = f"{work}/t{x}{r}.json"
        if os.path.exists(f):
            d = json.load(open(f))
            for row in d["rows"][1:]:
                rows.setdefault(row["method"], {})[f"{x}{r}"] = (row["ms"], d["rows"][0]["ms"])
tags = [f"{x}{r}" for r in (1, 2) for x in names]
print("%-20s" % "ms (bf16 ms)", " ".join("%15s" % t for t in tags), "  mean / A's")
for k, v in rows.items():
    mean = lambda x: [v[f"{x}{r}"][0] for r in (1, 2) if f"{x}{r}" in v]
    a = mean("A")
    ratios = " ".join(f"{x} {sum(mean(x)) / len(mean(x)) / (sum(a) / len(a)):.4f}"
                      for x in names[1:] if mean(x) and a)
    print("%-20s" % k, " ".join("%6.2f(%6.1f)" % v[t] if t in v else "%15s" % "-" for t in tags),
          "  ", ratios)
PY
