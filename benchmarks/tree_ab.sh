#!/usr/bin/env bash
# Device script: A/B of two whole source trees (the Triton preprocessing and the compiled
# kernel alike) in one call. Each tree's compiled kernel is built into a cache of its own (in
# parallel); TESTS (pytest paths) run on B; then `vcbench timeit` runs A B A B on the same
# card, each process with its own BF16 row, so drift across the call shows; a table of each
# method's attention and preprocessing ms in A and B, and B over A, comes last.
# Usage (repo root = B; A a copy of another commit, e.g. `git archive HEAD~3 | tar x -C a`):
#   bash benchmarks/tree_ab.sh A_TREE [B_TREE]
#   METHODS=sage3-4bit,attnqat-tf (default) SHAPE=wan22-720p WINDOW=1,1.5 TESTS="tests/..."
set -u
[ $# -ge 1 ] || { echo "usage: tree_ab.sh A_TREE [B_TREE]" >&2; exit 2; }
A=$(cd "$1" && pwd); B=$(cd "${2:-.}" && pwd)
METHODS=${METHODS:-sage3-4bit,attnqat-tf}; SHAPE=${SHAPE:-wan22-720p}; WINDOW=${WINDOW:-1,1.5}
TESTS=${TESTS:-}
OUT=${OUT:-/tmp/out}; WORK=${WORK:-$(mktemp -d)}  # WORK/kA, WORK/kB: the two kernel caches
# $OUT gets the four timeit JSONs and the tests log (a device call brings back 8 files at most)
export PYTHONUNBUFFERED=1 MAX_JOBS=${MAX_JOBS:-8}
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
t0=$(date +%s)
for X in A B; do
  tree=$A; [ $X = B ] && tree=$B
  (cd "$tree" && VCBENCH_KERNEL_CACHE=$WORK/k$X PYTHONPATH=$tree \
     python3 -m vcbench.kernels.backends.sm90.compiled build > "$WORK/build$X.txt" 2>&1 \
     || echo "build $X failed: $(tail -3 "$WORK/build$X.txt")") &
done
wait; echo "builds $(( $(date +%s) - t0 )) s"
if [ -n "$TESTS" ]; then
  t0=$(date +%s)
  (cd "$B" && VCBENCH_KERNEL_CACHE=$WORK/kB PYTHONPATH=$B timeout -s KILL 240 \
     python3 -m pytest -q -p no:cacheprovider $TESTS > "$OUT/testsB.txt" 2>&1)
  echo "tests B rc $? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/testsB.txt")"
  grep -E "^FAILED|^ERROR" "$OUT/testsB.txt" | head -n 10
fi
w=${WINDOW%,*}; s=${WINDOW#*,}
for r in 1 2; do for X in A B; do
  tree=$A; [ $X = B ] && tree=$B
  (cd "$tree" && VCBENCH_KERNEL_CACHE=$WORK/k$X PYTHONPATH=$tree timeout -s KILL 200 \
     python3 -m vcbench timeit --methods "$METHODS" --shape "$SHAPE" --warmup-s "$w" \
     --window-s "$s" --json "$OUT/t$X$r.json" > "$WORK/t$X$r.txt" 2>&1) \
    || echo "timeit $X$r failed: $(tail -3 "$WORK/t$X$r.txt")"
done; done
python3 - "$OUT" <<'PY'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
runs = {}
for f in sorted(out.glob("t[AB][12].json")):
    runs[f.stem] = {r["method"]: r for r in json.loads(f.read_text())["rows"]}
if not runs:
    sys.exit("no timeit result")
methods = list(next(iter(runs.values())))
cols = [k for k in ("tA1", "tB1", "tA2", "tB2") if k in runs]
print(f"\n{'method':16s} {'what':10s} " + " ".join(f"{c[1:]:>8s}" for c in cols) + "   B/A")
for m in methods:
    for key, label in (("attention_ms", "kernel"), ("preprocess_ms", "prep"),
                       ("plain_over_method", "plain/it"), ("sm_mhz", "MHz")):
        # a value timeit could not give is null or the string "nan" in its JSON
        vals = {c: runs[c].get(m, {}).get(key) for c in cols}
        vals = {c: None if v is None or float(v) != float(v) else float(v)
                for c, v in vals.items()}
        if all(v is None for v in vals.values()):
            continue
        a = [vals[c] for c in cols if c.startswith("tA") and vals[c] is not None]
        b = [vals[c] for c in cols if c.startswith("tB") and vals[c] is not None]
        ratio = f"{(sum(b) / len(b)) / (sum(a) / len(a)):.3f}" if a and b and key != "sm_mhz" else ""
        cells = " ".join(f"{vals[c]:8.2f}" if vals[c] is not None else f"{'-':>8s}" for c in cols)
        print(f"{m:16s} {label:10s} {cells}   {ratio}")
PY
