"""Device check: RoPE fused into the 8-bit Triton quantizers against the emulation, at a
small shape and at Wan2.2's (B1 H40 N75600 D128), on inputs with channel and token outliers.

For each 8-bit method (the VC methods with and without the QK Hadamard, V-Smooth's gather,
SageAttention2 and FP8-FA4's plans): the fused preprocessing's codes, scales and block means
against the emulation's `prepare(..., rope=...)` (RoPE applied first, as diffusers does) on
the same CUDA tensors, bit for bit; then the preprocessing's CUPTI time with RoPE fused and
with RoPE eager before it (what the patch saved per call).

    python3 benchmarks/checks/rope_check.py [--shapes small,wan] [--seconds 2,2]
"""

from __future__ import annotations

import argparse
import sys
import zlib

import torch

from vcbench.kernels import get_method, group
from vcbench.kernels.backends import triton_ready
from vcbench.kernels.backends.triton.operands import prepare_gpu
from vcbench.kernels.reference.engine import prepare
from vcbench.kernels.spec.rope import Rope, apply_rope, rope_tables
from vcbench.timing.cupti import time_kernels

SHAPES = {"small": (1, 2, 4133, 128), "wan": (1, 40, 75600, 128)}
CASES = [("vc-8bit", {}), ("vc-8bit", {"hadamard_qk": False}), ("vc-8bit-vsmooth", {}),
         ("vc-8bit-vsmooth", {"hadamard_qk": False}), ("vc-8bit-fp8qk", {}),
         ("sage2-8bit", {}), ("fp8-fa4", {})]


def outlier_inputs(shape, seed, device="cuda"):
    b, h, n, d = shape
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, device=device, generator=g) for _ in range(3))
    k = k + 3 * torch.randn(b, h, 1, d, device=device, generator=g)
    q[..., 7] *= 16
    k[..., 3] += 12
    rows = torch.randperm(n, device=device, generator=g)[: n // 50]
    v[:, :, rows] += 20 * torch.randn(b, h, 1, d, device=device, generator=g)
    q[:, :, rows[:8]] *= 30  # token outliers: their blocks' scales
    return tuple(x.bfloat16() for x in (q, k, v)) + (Rope(*rope_tables(n, d, device)),)


def differing(got: torch.Tensor, want: torch.Tensor) -> int:
    got, want = got.float(), want.float()
    same = (got == want) | (got.isnan() & want.isnan())
    return int((~same).sum())


def mismatches(method, options, q, k, v, rope, perm) -> dict[str, int]:
    """Per operand, how many elements of the fused preprocessing differ from the emulation's."""
    plan = get_method(method).plan(options)
    ops = prepare_gpu(q, k, v, plan, permutation=perm, rope=rope)
    emu = prepare(q, k, v, plan, permutation=perm, rope=rope)
    pairs = {"q": (ops.q, emu.q.codes), "q_scale": (ops.q_scale, emu.q.scale),
             "k": (ops.k, emu.k.codes), "k_scale": (ops.k_scale, emu.k.scale),
             "v": (ops.v_t.transpose(-1, -2), emu.v.codes), "v_scale": (ops.v_scale, emu.v.scale)}
    return {name: differing(a, b) for name, (a, b) in pairs.items()}


def check(method, options, shape, seconds) -> dict:
    q, k, v, rope = outlier_inputs(shape, zlib.crc32(f"{method}{options}{shape}".encode()))
    plan = get_method(method).plan(options)
    perm = None if plan.vsmooth is None else group(v, plan.vsmooth).permutation
    bad = mismatches(method, options, q, k, v, rope, perm)
    torch.cuda.empty_cache()
    warm, window = seconds
    fused = time_kernels(lambda: prepare_gpu(q, k, v, plan, permutation=perm, rope=rope),
                         warm, window, min_calls=3).per_call_ms()
    eager = time_kernels(lambda: prepare_gpu(apply_rope(q, rope), apply_rope(k, rope), v, plan,
                                             permutation=perm), warm, window, min_calls=3).per_call_ms()
    return {"bad": bad, "fused_ms": fused, "eager_ms": eager}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="small,wan")
    ap.add_argument("--seconds", default="2,2", help="warm-up,window of each timing (s)")
    args = ap.parse_args()
    if not triton_ready():
        print("error: needs a CUDA GPU (sm_90+) and Triton", file=sys.stderr)
        return 2
    seconds = tuple(float(s) for s in args.seconds.split(","))
    failed = 0
    print(f"{'shape':>22} {'method':<34} {'bit-equal':<10} {'fused ms':>9} {'eager ms':>9} {'saved':>7}")
    for key in args.shapes.split(","):
        shape = SHAPES[key]
        for method, options in CASES:
            r = check(method, options, shape, seconds)
            name = method + "".join(f" {o}={x}" for o, x in options.items())
            ok = not any(r["bad"].values())
            failed += not ok
            verdict = "yes" if ok else "NO " + ",".join(f"{n}:{c}" for n, c in r["bad"].items() if c)
            b, h, n, d = shape
            print(f"{f'B{b} H{h} N{n} D{d}':>22} {name:<34} {verdict:<10} "
                  f"{r['fused_ms']:9.3f} {r['eager_ms']:9.3f} {r['eager_ms'] - r['fused_ms']:7.3f}",
                  flush=True)
    print(f"{failed} case(s) not bit-equal" if failed else "every case bit-equal")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
