"""Device script: V-Smooth grouping (k-means, batched over heads) at a preset shape: the
Triton k-means on the 16-bit V (what the gpu backend runs) and the torch one on FP32 V."""

import sys

import torch

from vcbench.kernels import group
from vcbench.kernels.spec.vsmooth import VSmoothConfig
from vcbench.timing.timeit import PRESETS

shape = sys.argv[1] if len(sys.argv) > 1 else "wan22-720p"
b, h, n, d = PRESETS[shape]
v = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
for path, x in (("triton bf16", v), ("torch fp32", None)):
    for iters in (10, 4):
        config = VSmoothConfig(clusters=32, iters=iters)
        xv = v.float() if x is None else x
        g = group(xv, config)
        for warm in (False, True):
            init = g.centroids if warm else None
            for _ in range(2):
                group(v.float() if x is None else x, config, init=init)
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(5):
                group(v.float() if x is None else x, config, init=init)
            end.record()
            torch.cuda.synchronize()
            print(f"grouping {path} {shape} k=32 iters={iters} warm={warm}: "
                  f"{start.elapsed_time(end) / 5:.2f} ms")
