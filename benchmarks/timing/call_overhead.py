"""Device script: where a patched attention call spends its time beyond the kernel.

The Figure 6 projection showed low-bit methods losing 6-12 ms per attention call against what
kernel + preprocessing predict. This times, at one shape, for each method:
  kernel      the attention kernel alone on prepared operands (CUDA events, median);
  call HND    `vcbench.attention(q, k, v, method, backend="gpu")` on contiguous HND tensors;
  call view   the same on the (B, N, H, D)-memory views diffusers passes to SDPA;
and prints the kernels one `call view` launches (torch.profiler, device time each) and the
host time of one call with the GPU idle (what the CPU spends before the work is queued).
Usage: PYTHONPATH=. python3 benchmarks/timing/call_overhead.py [--shape wan22-720p]
"""

import argparse
import time

import torch

import vcbench
from vcbench.kernels import backends, get_method, group
from vcbench.timing.timeit import PRESETS


def events_ms(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def host_ms(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    host = (time.perf_counter() - t) * 1e3
    torch.cuda.synchronize()
    return host


def measure(name, contiguous, views):
    plan = get_method(name).plan()
    backend = backends.select(plan, tuple(contiguous[0].shape))
    perm = None
    if backend.prepare is not None:
        if plan.vsmooth is not None:
            perm = group(contiguous[2], plan.vsmooth).permutation
        ops = backend.prepare(*contiguous, plan, permutation=perm)
        out = torch.empty_like(contiguous[0])
        kernel = events_ms(lambda: backend.run_prepared(ops, plan, out))
    else:  # an external kernel: the bare call
        kernel = events_ms(lambda: backend.run(*contiguous, plan, {}))
    opts = {} if perm is None else {"permutation": perm}
    call_hnd = events_ms(lambda: vcbench.attention(*contiguous, name, backend="gpu", **opts))
    call_view = events_ms(lambda: vcbench.attention(*views, name, backend="gpu", **opts))
    host = host_ms(lambda: vcbench.attention(*views, name, backend="gpu", **opts))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        vcbench.attention(*views, name, backend="gpu", **opts)
        torch.cuda.synchronize()
    print(f"\n{name}: kernels of one call on the views")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10, max_name_column_width=60))
    return name, kernel, call_hnd, call_view, host


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="wan22-720p")
    ap.add_argument("--methods", default="bf16,sage2-8bit,fp8-fa4,vc-8bit-vsmooth,vc-8bit")
    args = ap.parse_args()
    b, h, n, d = PRESETS[args.shape]
    g = torch.Generator(device="cuda").manual_seed(0)
    bnhd = [torch.randn(b, n, h, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3)]
    views = [x.permute(0, 2, 1, 3) for x in bnhd]  # what diffusers hands to SDPA
    contiguous = [x.contiguous() for x in views]
    rows = [measure(name, contiguous, views) for name in args.methods.split(",")]
    print(f"\n{args.shape} B{b} H{h} N{n} D{d}, {torch.cuda.get_device_name()}")
    print(f"{'method':16s} {'kernel ms':>10s} {'call HND':>10s} {'call view':>10s} {'host ms':>8s}")
    for name, kernel, call_hnd, call_view, host in rows:
        print(f"{name:16s} {kernel:10.2f} {call_hnd:10.2f} {call_view:10.2f} {host:8.2f}")


if __name__ == "__main__":
    main()
