#!/usr/bin/env bash
# Device script: A/B/C... of whole source trees (the Triton preprocessing and the compiled kernel
# alike) in one call. Each tree's compiled kernel is built into a cache of its own (in parallel);
# TESTS (pytest paths) run on every tree but the first (the baseline); then `vcbench timeit` runs
# the trees in turn, twice (A B C A B C), each process with its own BF16 row, so drift across the
# call shows. Every timeit result is merged into $OUT/runs.json as it lands, so a call stopped at
# its limit still brings back what ran; the table (benchmarks/tree_ab_table.py: each method's
# attention and preprocessing ms per run, each tree's mean over A's) comes last.
# Usage (repo root = the last tree when one is given; A a copy of another commit, e.g.
# `git archive HEAD~3 | tar x -C a`):
#   bash benchmarks/tree_ab.sh A_TREE [B_TREE ...]
#   METHODS=sage3-4bit,attnqat-tf (default) SHAPE=wan22-720p WINDOW=1,1.5 TESTS="tests/..."
#   DEADLINE=540 (seconds from the start after which no further timeit process starts)
set -u
[ $# -ge 1 ] || { echo "usage: tree_ab.sh A_TREE [B_TREE ...]" >&2; exit 2; }
trees=(); for t in "$@"; do trees+=("$(cd "$t" && pwd)") || exit 2; done
[ ${#trees[@]} -ge 2 ] || trees+=("$PWD")
METHODS=${METHODS:-sage3-4bit,attnqat-tf}; SHAPE=${SHAPE:-wan22-720p}; WINDOW=${WINDOW:-1,1.5}
TESTS=${TESTS:-}; DEADLINE=${DEADLINE:-540}
OUT=${OUT:-/tmp/out}; WORK=${WORK:-$(mktemp -d)}  # WORK/kA, WORK/kB...: the kernel caches
HERE=$(cd "$(dirname "$0")" && pwd)
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-8}
mkdir -p "$OUT"
start=$(date +%s)
names=(); for i in "${!trees[@]}"; do names+=("$(printf "\\x$(printf %x $((65 + i)))")"); done
for i in "${!trees[@]}"; do echo "${names[$i]} = ${trees[$i]}"; done
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
t0=$(date +%s)
for i in "${!trees[@]}"; do
  X=${names[$i]}; tree=${trees[$i]}
  (cd "$tree" && VCBENCH_KERNEL_CACHE=$WORK/k$X PYTHONPATH=$tree \
     python3 -m vcbench.kernels.backends.sm90.compiled build > "$WORK/build$X.txt" 2>&1 \
     || echo "build $X failed: $(tail -3 "$WORK/build$X.txt")") &
done
wait; echo "builds $(( $(date +%s) - t0 )) s"
if [ -n "$TESTS" ]; then
  for i in "${!trees[@]}"; do
    [ "$i" = 0 ] && continue
    X=${names[$i]}; tree=${trees[$i]}; t0=$(date +%s)
    (cd "$tree" && VCBENCH_KERNEL_CACHE=$WORK/k$X PYTHONPATH=$tree timeout -s KILL 240 \
       python3 -m pytest -q -p no:cacheprovider $TESTS > "$OUT/tests$X.txt" 2>&1)
    echo "tests $X rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/tests$X.txt")"
    grep -E "^FAILED|^ERROR" "$OUT/tests$X.txt" | head -n 10
  done
fi
w=${WINDOW%,*}; s=${WINDOW#*,}
for r in 1 2; do for i in "${!trees[@]}"; do
  X=${names[$i]}; tree=${trees[$i]}
  if [ $(( $(date +%s) - start )) -gt "$DEADLINE" ]; then echo "deadline: $X$r not run"; continue; fi
  t0=$(date +%s)
  (cd "$tree" && VCBENCH_KERNEL_CACHE=$WORK/k$X PYTHONPATH=$tree timeout -s KILL 200 \
     python3 -m vcbench timeit --methods "$METHODS" --shape "$SHAPE" --warmup-s "$w" \
     --window-s "$s" --json "$WORK/t$X$r.json" > "$WORK/t$X$r.txt" 2>&1) \
    || echo "timeit $X$r failed: $(tail -3 "$WORK/t$X$r.txt")"
  echo "timeit $X$r $(( $(date +%s) - t0 )) s"
  python3 "$HERE/tree_ab_table.py" --merge "$OUT/runs.json" "$X$r" "$WORK/t$X$r.json"
done; done
python3 "$HERE/tree_ab_table.py" "$OUT/runs.json"
