"""Device check: what the QK Hadamard costs, per 8-bit method, at one shape.

For every 8-bit method (the baselines and the VC methods), the plan with `hadamard_qk` off and
on, timed by `vcbench.timing.timeit.time_plan` on the backend `attention` would choose (CUPTI
medians): the attention kernel (it reads the same codes either way, so its time should not
move beyond noise) and the fused preprocessing (where the rotation now runs, in the Q and K
quantizers' registers). Prints one line per plan, writes hadamard-timeit.json into $OUT.

    PYTHONPATH=$PWD python3 benchmarks/checks/hadamard_timeit.py [--shape wan22-720p] [--seconds 3,3]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from vcbench.timing.timeit import PRESETS, make_inputs, time_plan

METHODS = ["sage2-8bit", "fp8-fa4", "vc-8bit-vsmooth", "vc-8bit", "vc-8bit-fp8qk"]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", default="wan22-720p", choices=list(PRESETS))
    parser.add_argument("--seconds", default="3,3", help="warm-up,window in seconds")
    args = parser.parse_args()
    warmup, window = (float(s) for s in args.seconds.split(","))
    x = make_inputs(args.shape, None)
    rows = []
    print(f"{torch.cuda.get_device_name()}; {x.label}")
    print(f"{'method':18} {'hadamard':8} {'kernel ms':>9} {'prep ms':>8} {'group ms':>8}  implementation")
    for name in METHODS:
        for rotated in (False, True):
            row = {"method": name, "hadamard_qk": rotated,
                   **time_plan(name, {"hadamard_qk": rotated}, x, warmup, window)[0]}
            rows.append(row)
            print(f"{name:18} {str(rotated):8} {row['attention_ms']:9.3f} {row['preprocess_ms']:8.3f} "
                  f"{row.get('grouping_ms', float('nan')):8.3f}  {row['implementation']}", flush=True)
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "hadamard-timeit.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "inputs": x.label, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
