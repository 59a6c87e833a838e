"""Device script: the Triton kernel's launch configs, timed at one
shape with triton.testing.do_bench (median), BF16 cuDNN SDPA (and FA4 when importable) beside.
Usage: PYTHONPATH=. python3 benchmarks/timing/sweep_triton.py [--shape wan22-720p] [--quick]
       [--configs 8x3,8x2] [--baseline OLD.py]: OLD.py, an earlier attention.py with the same
       `launch`, is timed on the same operands for an A/B in one run."""

import argparse
import functools
import importlib.util

import torch
import triton

from vcbench.kernels import attention, backends, get_method, implementation
from vcbench.kernels.backends.external import flash_attn4
from vcbench.kernels.backends.triton.operands import kernel_switches, prepare_gpu
from vcbench.timing.timeit import PRESETS, attention_flops


def bench(fn, quick):
    return triton.testing.do_bench(fn, warmup=100 if quick else 500, rep=300 if quick else 1500,
                                   return_mode="median")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="wan22-720p")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--configs", default="8x3,8x2,4x3", help="warps x stages, comma-separated")
    ap.add_argument("--baseline", help="an earlier attention.py to time beside this one")
    args = ap.parse_args()
    b, h, n, d = PRESETS[args.shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    flops = attention_flops(q)
    rows = []
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def cudnn():
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    base = bench(lambda: attention(q, k, v, "bf16", backend="gpu"), args.quick)
    rows.append(("bf16", implementation("bf16"), base))
    if flash_attn4() is not None:
        rows.append(("bf16", "cudnn-sdpa", bench(cudnn, args.quick)))
    variants = {name: [dict()] for name in ("sage2-8bit", "fp8-fa4", "vc-8bit-vsmooth",
                                             "vc-8bit", "vc-8bit-fp8qk")}
    configs = [tuple(int(x) for x in c.split("x")) for c in args.configs.split(",")]
    baseline = None
    if args.baseline:
        spec = importlib.util.spec_from_file_location("baseline_attention", args.baseline)
        baseline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baseline)
    for name, switches in variants.items():
        plan = get_method(name).plan()
        perm = None
        if plan.vsmooth is not None:
            perm = torch.arange(n, device="cuda").expand(b, h, n).contiguous()
        ops = prepare_gpu(q, k, v, plan, permutation=perm)
        out = torch.empty_like(q)
        for sw in switches:
            for nw, ns in configs:
                try:
                    call = functools.partial(backends.TRITON.run_prepared, ops, plan, out, num_warps=nw,
                                             num_stages=ns, **sw)
                    t = bench(call, args.quick)
                except Exception as e:  # a config that does not compile is a result too
                    print(name, sw, nw, ns, "failed:", str(e).splitlines()[0][:120])
                    continue
                rows.append((name, f"{sw} w{nw} s{ns}", t))
        if baseline is not None:
            call = functools.partial(baseline.launch, ops, out, **kernel_switches(plan))
            rows.append((name, f"baseline {args.baseline.split('/')[-1]}", bench(call, args.quick)))
    print(f"\n{args.shape} B{b} H{h} N{n} D{d}, {torch.cuda.get_device_name()}")
    print(f"{'method':18s} {'variant':44s} {'ms':>8s} {'TFLOPS':>7s} {'vs bf16':>7s}")
    for name, var, t in rows:
        print(f"{name:18s} {var:44s} {t:8.2f} {flops / t / 1e9:7.0f} {base / t:7.3f}")


if __name__ == "__main__":
    main()
