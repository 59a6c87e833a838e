"""Device script: launch the compiled kernel a few times for one plan, for Nsight Compute to
profile one of the launches (benchmarks/sm90/ncu_profile.sh skips the first). Random normal bf16
inputs of a timeit preset.

Usage: PYTHONPATH=. python3 benchmarks/sm90/ncu_kernel.py --method vc-8bit[/no-vsmooth]
       [--shape longcat-480p] [--launches 2]
"""

import argparse

import torch
from compiled_timeit import OPTIONS  # a sibling script: "METHOD/no-vsmooth" rows

from vcbench.kernels import get_method, group
from vcbench.kernels.backends.sm90 import compiled
from vcbench.kernels.backends.triton.operands import prepare_gpu
from vcbench.timing.timeit import PRESETS, make_inputs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", required=True, help="a method, or a row of compiled_timeit.OPTIONS")
    ap.add_argument("--shape", default="longcat-480p", choices=list(PRESETS))
    ap.add_argument("--launches", type=int, default=2)
    args = ap.parse_args()
    if "/" in args.method and args.method not in OPTIONS:
        raise SystemExit(f"error: unknown row {args.method} (known: {', '.join(OPTIONS)})")
    name, options = OPTIONS.get(args.method, (args.method, {}))  # the rows compiled_timeit times
    plan = get_method(name).plan(options)
    x = make_inputs(args.shape, None)
    perm = group(x.v, plan.vsmooth).permutation if plan.vsmooth is not None else None
    ops = prepare_gpu(x.q, x.k, x.v, plan, permutation=perm)
    out = torch.empty_like(x.q)
    for _ in range(args.launches):
        compiled.run(ops, plan, out)
    torch.cuda.synchronize()
    print(f"{args.method} {args.shape}: {args.launches} launches, "
          f"finite={bool(torch.isfinite(out).all())}")


if __name__ == "__main__":
    main()
