"""Device script: the compiled sm_90a kernel timed beside BF16 (FA4, else cuDNN) and the Triton
kernels in one process, with `vcbench timeit`'s protocol (CUPTI per-launch medians through
vcbench.timing.cupti.time_kernels, preprocessing outside the timer, random normal bf16
inputs from timeit.make_inputs). Each compiled output is also compared with the Triton
kernel's on the same operands (relative L2), a check at the full shape.

Usage: PYTHONPATH=. python3 benchmarks/compiled_timeit.py [--shape wan22-720p]
       [--warmup-s 2] [--window-s 2] [--json OUT.json]
"""

import argparse
import json

import torch

from vcbench.kernels import compiled, get_method, gpu
from vcbench.kernels.triton.attention import launch as triton_launch
from vcbench.kernels.vsmooth import group
from vcbench.timing.cupti import time_kernels
from vcbench.timing.timeit import PRESETS, attention_flops, make_inputs

SAGE2_OFFICIAL_MS = 128.5  # ../shared/anchors/h200-attention.md, Wan2.2 shape, kernel only
METHODS = ("sage2-8bit", "vc-8bit-vsmooth", "vc-8bit")


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="wan22-720p", choices=list(PRESETS))
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--window-s", type=float, default=2.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    x = make_inputs(args.shape, None)
    flops = attention_flops(x.q)
    ready = compiled.load() is not None
    rows = []

    def timed(method, impl, fn, note=""):
        t = time_kernels(fn, args.warmup_s, args.window_s)
        ms = t.median_ms(t.main_kernel())
        rows.append(dict(method=method, implementation=impl, ms=ms,
                         tflops=flops / (ms * 1e-3) / 1e12, note=note))
        print(f"{method:16s} {impl:26s} {ms:9.2f} ms {note}", flush=True)

    timed("bf16", gpu.implementation(get_method("bf16")),
          lambda: gpu.bf16_attention(x.q, x.k, x.v))
    def time_method(name):
        plan = get_method(name).plan()
        perm = group(x.v, plan.vsmooth).permutation if plan.vsmooth is not None else None
        ops = gpu.prepare_gpu(x.q, x.k, x.v, plan, permutation=perm)
        out_t = torch.empty_like(x.q)
        switches = gpu.kernel_switches(plan)
        timed(name, "vcbench-triton", lambda: triton_launch(ops, out_t, **switches))
        if not ready:
            return
        for variant in compiled.VARIANTS:
            out_c = torch.empty_like(x.q)
            compiled.run(ops, plan, out_c, variant=variant)
            note = f"vs Triton {rel(out_c, out_t):.1e}"
            timed(name, f"{compiled.IMPLEMENTATION} {variant}",
                  lambda v=variant, o=out_c: compiled.run(ops, plan, o, variant=v), note)

    for name in METHODS:
        time_method(name)
        torch.cuda.empty_cache()

    base = rows[0]["ms"]
    b, h, n, d = PRESETS[args.shape]
    print(f"\n{args.shape} B{b} H{h} N{n} D{d}, {torch.cuda.get_device_name()}, CUPTI medians "
          f"(warm-up {args.warmup_s:g} s, window {args.window_s:g} s)"
          + ("" if ready else f"; compiled kernel not run: {compiled.status()}"))
    print(f"{'method':16s} {'implementation':26s} {'ms':>8s} {'TFLOPS':>7s} {'vs bf16':>7s} "
          f"{'vs sage2 128.5':>14s}  note")
    for r in rows:
        r["speedup_vs_bf16"] = base / r["ms"]
        r["speedup_vs_sage2_official"] = SAGE2_OFFICIAL_MS / r["ms"]
        print(f"{r['method']:16s} {r['implementation']:26s} {r['ms']:8.2f} {r['tflops']:7.0f} "
              f"{r['speedup_vs_bf16']:7.3f} {r['speedup_vs_sage2_official']:14.3f}  {r['note']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(shape=args.shape, device=torch.cuda.get_device_name(), rows=rows), f,
                      indent=1)


if __name__ == "__main__":
    main()
