"""Device script: a first look at the compiled kernel, small and diagnostic, before its tests.

For each plan, on B1 H2, against the emulation: (1) V constant over tokens: with
V-Smooth the residual codes are 0 and the whole value comes from the block means, so this
isolates the normaliser, ExpCast's row-sum column and the mean path (the output must also
equal V itself); (2) Q = 0: uniform attention (every P code the row maximum's); (3) random
inputs, with the relative error reported per group of 16 query rows (one warp of a consumer
warpgroup) and per 8 channels when a case is bad, so a wrong index shows as a pattern. Each
case prints before it launches, so a hang names itself.
Usage: python3 benchmarks/sm90/compiled_smoke.py [--n N]  (exit 1 if a case is bad)
"""

import argparse
import math
import sys

import torch

from vcbench.kernels import get_method
from vcbench.kernels.backends.sm90 import compiled
from vcbench.kernels.backends.triton.operands import prepare_gpu
from vcbench.kernels.reference.engine import finish, prepare, run

PLANS = [("vc-8bit", {}), ("vc-8bit-vsmooth", {}), ("vc-8bit", {"vsmooth": False}),
         ("sage2-8bit", {}), ("vc-8bit-fp8qk", {}), ("fp8-fa4", {})]


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def launch(q, k, v, method, options):
    m = get_method(method)
    plan = m.build(m.resolve(options))
    emu = prepare(q, k, v, plan)
    ops = prepare_gpu(q, k, v, plan, permutation=emu.permutation)
    out = torch.full_like(q, float("nan"))
    compiled.run(ops, plan, out)
    torch.cuda.synchronize()
    return out, finish(run(emu, plan)[0], q.shape[2], plan)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000)
    args = ap.parse_args()
    n = args.n
    if compiled.load() is None:
        print("not built:", compiled.status())
        return 1
    g = torch.Generator(device="cuda").manual_seed(0)
    bad = 0
    for method, options in PLANS:
        label = f"{method}{options or ''}"
        print(f"{label}: launching", flush=True)
        q, k, v = (torch.randn(1, 2, n, 128, device="cuda", generator=g).bfloat16()
                   for _ in range(3))
        vconst = torch.randn(1, 2, 1, 128, device="cuda", generator=g).expand(1, 2, n, 128)
        vconst = vconst.bfloat16().contiguous()
        out, emu = launch(q, k, vconst, method, options)
        e_const = max(rel(out, emu), rel(out, vconst) if options.get("vsmooth", True)
                      and method.startswith("vc") else 0.0)
        out, emu = launch(torch.zeros_like(q), k, v, method, options)
        e_uniform = rel(out, emu)
        out, emu = launch(q, k, v, method, options)
        finite = bool(torch.isfinite(out).all())
        e = rel(out, emu)
        # the GPU tests' rule: within max(4e-3, 0.5 e) of the emulation, e its own error
        # against FP64 (the FP8-score instances sit ~5e-3 from it: the FP8 wgmma's truncated
        # accumulation of the scores, which the emulation computes exactly)
        s64 = q.double() @ k.double().transpose(-1, -2) / math.sqrt(q.shape[-1])
        limit = max(4e-3, 0.5 * rel(emu, torch.softmax(s64, -1) @ v.double()))
        diff = (out.double() - emu.double()).pow(2)
        ref = emu.double().pow(2)
        rows = (diff.sum(-1).reshape(1, 2, -1)[..., : n // 16 * 16].reshape(2, -1, 16).sum(-1)
                / ref.sum(-1).reshape(1, 2, -1)[..., : n // 16 * 16].reshape(2, -1, 16).sum(-1)
                ).sqrt()
        cols = (diff.sum((0, 1, 2)).reshape(16, 8).sum(-1)
                / ref.sum((0, 1, 2)).reshape(16, 8).sum(-1)).sqrt()
        ok = finite and e <= limit and max(e_const, e_uniform) < 4e-3
        bad += not ok
        print(f"{label}: {'ok ' if ok else 'BAD'} finite={finite} vs-emulation={e:.2e} "
              f"(limit {limit:.1e}) const-V={e_const:.2e} uniform={e_uniform:.2e}", flush=True)
        if not ok:
            by_row = " ".join(f"{x:.0e}" for x in rows[0, :16].tolist())
            by_col = " ".join(f"{x:.0e}" for x in cols.tolist())
            print(f"   per 16 rows (head 0, first 256 rows): {by_row}")
            print(f"   per 8 channels: {by_col}")
    print(f"smoke: {bad} bad")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
