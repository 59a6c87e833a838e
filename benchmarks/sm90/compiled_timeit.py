"""Device script: the compiled sm_90a kernel timed beside BF16 (FA4, else cuDNN) and the Triton
kernels in one process, with `vcbench timeit`'s protocol (CUPTI per-launch medians through
vcbench.timing.cupti.time_kernels, preprocessing outside the timer, random normal bf16
inputs from timeit.make_inputs). Accuracy at the full shape, where the emulation is too slow:
each output's relative L2 against an FP64 reference on a sample of query rows (256 rows of
two heads, all keys), and each compiled output against the Triton kernel's.

Usage: PYTHONPATH=. python3 benchmarks/sm90/compiled_timeit.py [--shape wan22-720p]
       [--warmup-s 2] [--window-s 2] [--json OUT.json] [--methods A,B] [--skip-triton]
"""

import argparse
import json

import torch

from vcbench.kernels import attention, get_method, group, implementation
from vcbench.kernels.backends.sm90 import compiled
from vcbench.kernels.backends.triton.attention import launch as triton_launch
from vcbench.kernels.backends.triton.operands import kernel_switches, prepare_gpu
from vcbench.timing.cupti import time_kernels
from vcbench.timing.timeit import PRESETS, attention_flops, make_inputs

SAGE2_OFFICIAL_MS = 128.5  # ../shared/anchors/h200-attention.md, Wan2.2 shape, kernel only
# The rows timed: methods, and methods with options, which measure V-Smooth's cost inside one
# plan (the same P path and scales, the mean term off), not against sage2-8bit's different plan.
OPTIONS = {"vc-8bit-vsmooth/no-vsmooth": ("vc-8bit-vsmooth", {"vsmooth": False}),
           "vc-8bit/no-vsmooth": ("vc-8bit", {"vsmooth": False}),
           "vc-8bit-fp8qk/no-vsmooth": ("vc-8bit-fp8qk", {"vsmooth": False})}
METHODS = ("sage2-8bit", "fp8-fa4", "vc-8bit-vsmooth", "vc-8bit", "vc-8bit-fp8qk", *OPTIONS)
SAMPLE_HEADS, SAMPLE_ROWS = (0, 1), 256


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="wan22-720p", choices=list(PRESETS))
    ap.add_argument("--warmup-s", type=float, default=2.0)
    ap.add_argument("--window-s", type=float, default=2.0)
    ap.add_argument("--json")
    ap.add_argument("--methods", help="comma list of METHODS rows (default: all)")
    ap.add_argument("--skip-triton", action="store_true", help="time only the compiled kernel")
    args = ap.parse_args()
    names = args.methods.split(",") if args.methods else list(METHODS)
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise SystemExit(f"error: unknown --methods {unknown}; known: {', '.join(METHODS)}")
    x = make_inputs(args.shape, None)
    flops = attention_flops(x.q)
    heads = [h for h in SAMPLE_HEADS if h < x.q.shape[1]]
    rows = torch.arange(0, x.q.shape[2], max(1, x.q.shape[2] // SAMPLE_ROWS), device="cuda")

    def sample(o):
        return o[0, heads][:, rows].double()

    qs, ks, vs = (t[0, heads].double() for t in (x.q, x.k, x.v))
    ref = torch.softmax(qs[:, rows] @ ks.transpose(-1, -2) / qs.shape[-1] ** 0.5, -1) @ vs
    del qs, ks, vs

    def vs_fp64(o):
        return f"vs FP64 {((sample(o) - ref).norm() / ref.norm()).item():.1e}"

    ready = compiled.load() is not None
    table = []

    def timed(method, impl, fn, note=""):
        t = time_kernels(fn, args.warmup_s, args.window_s)
        ms = t.median_ms(t.main_kernel())
        table.append(dict(method=method, implementation=impl, ms=ms,
                         tflops=flops / (ms * 1e-3) / 1e12, sm_mhz=t.sm_mhz, power_w=t.power_w,
                         note=note))
        print(f"{method:16s} {impl:26s} {ms:9.2f} ms {t.sm_mhz:5.0f} MHz {note}", flush=True)

    out_b = attention(x.q, x.k, x.v, "bf16", backend="gpu")
    timed("bf16", implementation("bf16"),
          lambda: attention(x.q, x.k, x.v, "bf16", backend="gpu"), vs_fp64(out_b))
    del out_b

    def time_method(name):
        method, options = OPTIONS.get(name, (name, {}))
        plan = get_method(method).plan(options)
        perm = group(x.v, plan.vsmooth).permutation if plan.vsmooth is not None else None
        ops = prepare_gpu(x.q, x.k, x.v, plan, permutation=perm)
        out_t = None
        if not args.skip_triton:
            out_t = torch.empty_like(x.q)
            switches = kernel_switches(plan)
            triton_launch(ops, out_t, **switches)
            timed(name, "vcbench-triton", lambda: triton_launch(ops, out_t, **switches),
                  vs_fp64(out_t))
        if not ready:
            return
        out_c = torch.full_like(x.q, float("nan"))
        compiled.run(ops, plan, out_c)
        finite = bool(torch.isfinite(out_c).all())
        note = (vs_fp64(out_c) + (f", vs Triton {rel(out_c, out_t):.1e}" if out_t is not None else "")
                + ("" if finite else ", NOT FINITE"))
        timed(name, compiled.IMPLEMENTATION, lambda: compiled.run(ops, plan, out_c), note)

    for name in names:
        time_method(name)
        torch.cuda.empty_cache()

    base = table[0]["ms"]
    b, h, n, d = PRESETS[args.shape]
    print(f"\n{args.shape} B{b} H{h} N{n} D{d}, {torch.cuda.get_device_name()}, CUPTI medians "
          f"(warm-up {args.warmup_s:g} s, window {args.window_s:g} s)"
          + ("" if ready else f"; compiled kernel not run: {compiled.status()}"))
    print(f"{'method':16s} {'implementation':26s} {'ms':>8s} {'TFLOPS':>7s} {'MHz':>5s} {'W':>4s} "
          f"{'vs bf16':>7s} {'vs sage2 128.5':>14s}  note")
    for r in table:
        r["speedup_vs_bf16"] = base / r["ms"]
        r["speedup_vs_sage2_official"] = SAGE2_OFFICIAL_MS / r["ms"]
        print(f"{r['method']:16s} {r['implementation']:26s} {r['ms']:8.2f} {r['tflops']:7.0f} "
              f"{r['sm_mhz']:5.0f} {r['power_w']:4.0f} {r['speedup_vs_bf16']:7.3f} "
              f"{r['speedup_vs_sage2_official']:14.3f}  {r['note']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(shape=args.shape, device=torch.cuda.get_device_name(), rows=table), f,
                      indent=1)


if __name__ == "__main__":
    main()
