#!/usr/bin/env bash
# Device script (issue 8): train ToyWan from scratch with several recipes x seeds at once on one
# GPU and print one row per run, to measure how often a recipe learns the direction word.
# The model is tiny (a step is ~0.3 ms of tensor work inside ~30 ms of launches), so one H200
# runs several trainers side by side; the table's steps/s says at what cost. Each run: seed =
# data seed = S, batch 128, `--max-seconds SECONDS`, then its own caption check (trained and
# random). A recipe is one argument: "SEEDS [train_tiny flags...]".
# Usage (repo root, PYTHONPATH with diffusers as docs/toywan/cpu-experiments.md shows):
#   bash benchmarks/toywan/toywan_seeds.sh SECONDS RECIPE [RECIPE...]
#   e.g. bash benchmarks/toywan/toywan_seeds.sh 380 "0,1" "1,2,3 --high-noise 0.25"
set -u
OUT=${OUT:-/tmp/out}
if [ $# -lt 2 ]; then echo "usage: $0 SECONDS \"SEEDS [flags...]\" [...]" >&2; exit 2; fi
secs=$1; shift
root="$OUT/toywan-seeds"
mkdir -p "$root"
export PYTHONUNBUFFERED=1
r=0
for recipe in "$@"; do
  read -r seeds flags <<< "$recipe"
  for s in ${seeds//,/ }; do
    run="$root/r$r-s$s"
    mkdir -p "$run"
    echo "${flags:-(defaults)}" > "$run/recipe.txt"
    # shellcheck disable=SC2086  # the flags are meant to split into words
    python3 -m vcbench.pipelines.train_tiny --out "$run" --device cuda --batch 128 --steps 1000000 \
      --max-seconds "$secs" --seed "$s" --data-seed "$s" ${flags:-} > "$run/log.txt" 2>&1 &
  done
  r=$((r + 1))
done
wait
python3 - "$root" <<'PY'
import csv, json, pathlib, sys

print(f"{'run':>6s} {'steps':>6s} {'steps/s':>7s} {'centroid@3k':>11s} {'centroid end':>12s} "
      f"{'check':>5s} {'colour':>6s} {'direction':>9s} {'random':>6s}  recipe")
for run in sorted(pathlib.Path(sys.argv[1]).glob("r*-s*")):
    recipe = (run / "recipe.txt").read_text().strip()
    try:
        rows = list(csv.DictReader(open(run / "loss.csv")))
        check = json.load(open(run / "check.json"))
        card = (run / "card.md").read_text()
    except OSError as e:
        print(f"{run.name:>6s} failed: {e}; log tail:", *open(run / "log.txt").readlines()[-3:])
        continue
    at3k = min(rows, key=lambda r: abs(int(r["step"]) - 3000))
    rate = next((line.split("|")[2].strip() for line in card.splitlines() if "| steps_per_s |" in line), "?")
    t, r = check["trained"], check["random"]
    print(f"{run.name:>6s} {rows[-1]['step']:>6s} {rate:>7s} {float(at3k['motion']):11.4f} "
          f"{float(rows[-1]['motion']):12.4f} {t['score']:5.2f} {t['colour']:6.2f} {t['direction']:9.2f} "
          f"{r['score']:6.2f}  {recipe}")
PY
