"""Device script: V-Smooth grouping (k-means, batched over heads) at a preset shape."""

import sys

import torch

from vcbench.kernels.vsmooth import VSmoothConfig, group
from vcbench.timing.timeit import PRESETS

shape = sys.argv[1] if len(sys.argv) > 1 else "wan22-720p"
b, h, n, d = PRESETS[shape]
v = torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16)
for iters in (10, 4):
    config = VSmoothConfig(clusters=32, iters=iters)
    g = group(v.float(), config)
    for warm in (False, True):
        init = g.centroids if warm else None
        for _ in range(2):
            group(v.float(), config, init=init)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(5):
            group(v.float(), config, init=init)
        end.record()
        torch.cuda.synchronize()
        print(f"grouping {shape} k=32 iters={iters} warm={warm}: {start.elapsed_time(end) / 5:.2f} ms")
