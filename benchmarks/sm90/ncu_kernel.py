"""Device script: launch one plan's attention kernel a few times, for Nsight Compute to profile
one of the launches (benchmarks/sm90/ncu_profile.sh skips the first). Random normal bf16 inputs
of a timeit preset, prepared and launched by what `vcbench.kernels.chosen` picks (the backend
`attention` would run: the 8-bit or the NVFP4 instances of the compiled kernel), as timeit
launches it. The preprocessing runs once before them; `--launches 0` runs it alone (what
ncu_profile.sh's NCU_PREP=1 profiles).

Usage: PYTHONPATH=. python3 benchmarks/sm90/ncu_kernel.py --method vc-8bit[/no-vsmooth]
       [--shape longcat-480p] [--launches 2]
"""

import argparse

import torch
from compiled_timeit import OPTIONS  # a sibling script: "METHOD/no-vsmooth" rows

from vcbench.kernels import chosen, group
from vcbench.timing.timeit import PRESETS, make_inputs, preprocessing


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", required=True, help="a method, or a row of compiled_timeit.OPTIONS")
    ap.add_argument("--shape", default="longcat-480p", choices=list(PRESETS))
    ap.add_argument("--launches", type=int, default=2)
    args = ap.parse_args()
    if "/" in args.method and args.method not in OPTIONS:
        raise SystemExit(f"error: unknown row {args.method} (known: {', '.join(OPTIONS)})")
    name, options = OPTIONS.get(args.method, (args.method, {}))  # the rows compiled_timeit times
    x = make_inputs(args.shape, None)
    impl = chosen(name, options, tuple(x.q.shape))
    if impl.kernel is None:
        raise SystemExit(f"error: {args.method} runs on {impl.implementation}, no prepared kernel")
    vsmooth = impl.plan.vsmooth
    perm = group(x.v, vsmooth).permutation if vsmooth is not None else None
    ops = preprocessing(impl, x, perm)()
    out = torch.empty_like(x.q)
    for _ in range(args.launches):
        impl.kernel(ops, out)
    torch.cuda.synchronize()
    print(f"{args.method} {args.shape} on {impl.implementation}: {args.launches} launches, "
          f"finite={bool(torch.isfinite(out).all())}")


if __name__ == "__main__":
    main()
