"""tree_ab.sh's bookkeeping: merge one `vcbench timeit --json` result into a runs file, or
print the runs file as a table (each method's kernel and preprocessing ms per run, and each
tree's mean over tree A's). Runs are tagged tree letter then round: A1 B1 C1 A2 B2 C2.

Usage: python3 tree_ab_table.py --merge RUNS.json TAG TIMEIT.json
       python3 tree_ab_table.py RUNS.json
"""

import json
import os
import sys
from pathlib import Path

KEYS = (("attention_ms", "kernel"), ("preprocess_ms", "prep"),
        ("plain_over_method", "plain/it"), ("sm_mhz", "MHz"), ("power_w", "W"))


def merge(runs_file, tag, result):
    runs_file, result = Path(runs_file), Path(result)
    runs = json.loads(runs_file.read_text()) if runs_file.exists() else {}
    if not result.exists():
        return
    runs[tag] = {r["method"]: r for r in json.loads(result.read_text())["rows"]}
    tmp = runs_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(runs, indent=1))
    os.replace(tmp, runs_file)  # a call killed mid-write keeps the last whole file


def number(v):
    # a value timeit could not give is null or the string "nan" in its JSON
    return None if v is None or float(v) != float(v) else float(v)


def tree_mean(vals, tree):
    got = [v for t, v in vals.items() if t[0] == tree and v is not None]
    return sum(got) / len(got) if got else None


def table(runs_file):
    runs = json.loads(Path(runs_file).read_text())
    if not runs:
        sys.exit("no timeit result")
    tags = sorted(runs, key=lambda t: (t[1:], t[0]))
    trees = sorted({t[0] for t in tags})
    methods = list(dict.fromkeys(m for t in tags for m in runs[t]))
    head = " ".join(f"{t:>8s}" for t in tags)
    print(f"\n{'method':16s} {'what':9s} {head}   " + " ".join(f"{x}/A" for x in trees[1:]))
    for m in methods:
        for key, label in KEYS:
            vals = {t: number(runs[t].get(m, {}).get(key)) for t in tags}
            if all(v is None for v in vals.values()):
                continue
            means = {x: tree_mean(vals, x) for x in trees}
            a = means["A"]
            ratios = ""
            if key not in ("sm_mhz", "power_w") and a:
                ratios = " ".join(f"{means[x] / a:.3f}" if means[x] else "  -  " for x in trees[1:])
            cells = " ".join(f"{vals[t]:8.2f}" if vals[t] is not None else f"{'-':>8s}"
                             for t in tags)
            print(f"{m:16s} {label:9s} {cells}   {ratios}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--merge"]:
        merge(*sys.argv[2:5])
    else:
        table(sys.argv[1])
