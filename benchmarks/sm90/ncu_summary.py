"""Summarise Nsight Compute exports of the compiled kernel (benchmarks/sm90/ncu_profile.sh): per
report, the duration, issue activity, the busiest pipes and the top warp-stall reasons (from
`ncu --page raw --csv`), and the SASS lines with the most stall samples and each opcode's share
of the samples beside its share of the executed instructions (from `ncu --page source --csv
--print-source sass`, when that export exists). Pure text in, text out: it runs anywhere.

Usage: python3 benchmarks/sm90/ncu_summary.py DIR   (DIR holds raw-TAG.csv and optionally sass-TAG.csv)
"""

import csv
import re
import sys
from pathlib import Path

HEADLINE = ("gpu__time_duration.sum", "sm__cycles_active.avg", "smsp__issue_active.avg.pct_of_peak_sustained_active",
            "smsp__inst_executed.sum", "sm__warps_active.avg.pct_of_peak_sustained_active")
PIPES = re.compile(r"^sm__(inst_executed_pipe_|pipe_).*\.avg\.pct_of_peak_sustained_active$")
STALLS = re.compile(r"^smsp__average_warps?_(latency_)?issue_stalled_(\w+?)_per_issue_active\.ratio$")


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def raw_rows(path):
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("==")]
    header, units, *kernels = rows
    for k in kernels:
        yield {name: (value, unit) for name, unit, value in zip(header, units, k, strict=False)}


def summarise_raw(path):
    for row in raw_rows(path):
        print(f"  kernel: {row.get('Kernel Name', ('?',))[0][:100]}")
        for name in HEADLINE:
            if name in row:
                print(f"    {name:58s} {row[name][0]:>14s} {row[name][1]}")
        pipes = sorted(((number(v), n) for n, (v, _) in row.items() if PIPES.match(n) and number(v)),
                       reverse=True)
        print("    busiest pipes (% of peak, active cycles):")
        for value, name in pipes[:14]:
            print(f"      {name:70s} {value:7.1f}")
        stalls = sorted(((number(v), STALLS.match(n).group(2)) for n, (v, _) in row.items()
                         if STALLS.match(n) and number(v)), reverse=True)
        print("    warp stalls (cycles per issued instruction):")
        for value, reason in stalls[:10]:
            print(f"      {reason:40s} {value:7.2f}")


def opcode_of(source):
    """'@!P0  BRA 0x..' -> 'BRA'; 'FFMA.SAT R1, ..' -> 'FFMA'."""
    words = source.split()
    if words and words[0].startswith("@"):
        words = words[1:]
    return words[0].split(".")[0] if words else "?"


def summarise_sass(path, top=25):
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("==")]
    # a banner row (the kernel's name) may come before the header
    start = next((i for i, r in enumerate(rows) if any("Sampling" in c for c in r)), 0)
    header, rows = rows[start], rows[start:]
    samples = [i for i, h in enumerate(header) if "Sampling" in h and "All" in h] or \
              [i for i, h in enumerate(header) if "Sampling" in h]
    if not samples:
        print(f"  no stall-sampling column in {path.name}: {header[:8]}")
        return
    col = samples[0]
    src = next((i for i, h in enumerate(header) if h.strip().lower() == "source"), 1)
    addr = next((i for i, h in enumerate(header) if "address" in h.lower()), 0)
    lines = [r for r in rows[1:] if len(r) > col and number(r[col]) is not None]
    total = sum(number(r[col]) for r in lines) or 1.0
    print(f"  SASS lines by '{header[col]}' (total {total:.0f}):")
    for r in sorted(lines, key=lambda r: -number(r[col]))[:top]:
        print(f"    {r[addr]:>8s} {100 * number(r[col]) / total:5.1f}%  {r[src].strip()[:90]}")
    # per opcode: its share of the stall samples beside its share of the executed instructions
    # (an opcode whose first share is far above its second is where warps wait)
    executed = next((i for i, h in enumerate(header) if h == "Instructions Executed"), None)
    if executed is None:
        return
    stall, count = {}, {}
    for r in lines:
        op = opcode_of(r[src])
        stall[op] = stall.get(op, 0.0) + number(r[col])
        count[op] = count.get(op, 0.0) + (number(r[executed]) or 0.0)
    n = sum(count.values()) or 1.0
    ranked = sorted(stall, key=lambda op: -stall[op])[:16]
    print("  by opcode (% of stall samples / % of executed):")
    print("    " + ", ".join(f"{op} {100 * stall[op] / total:.1f}/{100 * count[op] / n:.1f}" for op in ranked))


def main(folder):
    folder = Path(folder)
    for raw in sorted(folder.glob("raw-*.csv")):
        tag = raw.stem[4:]
        print(f"== {tag}")
        try:
            summarise_raw(raw)
        except (ValueError, StopIteration) as e:
            print(f"  could not read {raw.name}: {e}")
        sass = folder / f"sass-{tag}.csv"
        if sass.exists():
            try:
                summarise_sass(sass)
            except (ValueError, IndexError) as e:
                print(f"  could not read {sass.name}: {e}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
