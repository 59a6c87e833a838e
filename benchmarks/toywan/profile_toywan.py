"""Profile ToyWan training steps (vcbench train-tiny's own loop) on this machine.

    python benchmarks/toywan/profile_toywan.py [--steps 6 --batch 64 --device cpu]

Per phase of the step (the trainer's record_function labels: data, forward, loss, backward,
optimizer, ema+stats): wall time per step and the number of leaf ATen ops that do work (views
and allocations left out). On a GPU each such op is one kernel launch or more, so the count
times the per-launch host cost (~5-10 us for an eager PyTorch op) bounds the eager GPU step
from below when the kernels themselves are short. Also: matmul/conv FLOPs per step (the
profiler's count; attention is added analytically) and the bytes the batch of clips holds.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from collections import defaultdict
from pathlib import Path

import torch

from vcbench.pipelines import toyvideo, toywan
from vcbench.pipelines.train_tiny import train

PHASES = ("data", "forward", "loss", "backward", "optimizer", "ema+stats")
NO_WORK = {"aten::view", "aten::as_strided", "aten::reshape", "aten::expand", "aten::permute",
           "aten::transpose", "aten::unsqueeze", "aten::squeeze", "aten::slice", "aten::select",
           "aten::t", "aten::detach", "aten::empty", "aten::empty_like", "aten::empty_strided",
           "aten::alias", "aten::unflatten", "aten::flatten", "aten::_unsafe_view",
           "aten::chunk", "aten::split", "aten::unbind", "aten::split_with_sizes",
           "aten::narrow", "aten::view_as", "aten::lift_fresh", "aten::_reshape_alias",
           "aten::resize_", "aten::set_", "aten::result_type", "aten::is_nonzero",
           "aten::_has_compatible_shallow_copy_type", "detach", "aten::item",
           "aten::_local_scalar_dense", "aten::contiguous", "aten::to", "aten::resolve_conj",
           "aten::resolve_neg", "aten::zeros", "aten::ones"}


def leaves(event):
    """The ops under `event` that launch work; a multi-tensor (_foreach_*, _fused_*) op counts
    once, as on CUDA, where it is one or a few launches (the CPU runs it tensor by tensor)."""
    kids = [c for c in event.cpu_children]
    if not kids or event.name.startswith(("aten::_foreach", "aten::_fused")):
        return [event]
    out = []
    for c in kids:
        out += leaves(c)
    return out


HBM_BYTES_PER_US = 3.0e6  # ~3 TB/s of the H200's 4.8 achievable by elementwise kernels
KERNEL_FLOOR_US = 2.5  # the shortest kernel plus its launch gap, back to back


def gpu_time_us(op) -> float:
    """A rough H200 time for one op: its inputs read and an output of their size written
    (4-byte elements, as the profile ran), at HBM speed, or the per-kernel floor. Matmuls here
    are small (K, N <= 768) and bandwidth-bound too."""
    numel = sum(math.prod(s) for s in op.input_shapes if isinstance(s, list | tuple))
    return max(KERNEL_FLOOR_US, 2 * 4 * numel / HBM_BYTES_PER_US)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp, torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True,
            record_shapes=True) as prof:
        train(Path(tmp), steps=a.steps, batch=a.batch, device=a.device, layers=a.layers,
              log_every=a.steps, check=False)
    wall, ops, kinds = defaultdict(float), defaultdict(int), defaultdict(lambda: defaultdict(int))
    gpu_us = defaultdict(float)
    flops = 0
    for e in prof.events():
        if e.name in PHASES:
            wall[e.name] += e.cpu_time_total / 1e3
            for leaf in leaves(e):
                if leaf.name.startswith("aten::") and leaf.name not in NO_WORK:
                    ops[e.name] += 1
                    kinds[e.name][leaf.name] += 1
                    gpu_us[e.name] += gpu_time_us(leaf)
        if e.name.startswith("aten::") and e.flops:
            flops += e.flops
    n = a.steps
    print(f"{a.steps} steps, batch {a.batch}, {a.device} ({torch.get_num_threads()} threads)")
    print(f"{'phase':<10} {'ms/step':>9} {'ops/step':>9} {'GPU ms':>7}")
    for name in PHASES:
        print(f"{name:<10} {wall[name] / n:>9.1f} {ops[name] / n:>9.0f} {gpu_us[name] / n / 1e3:>7.2f}   "
              + ", ".join(f"{k[6:]} {v // n}" for k, v in sorted(kinds[name].items(), key=lambda kv: -kv[1])[:6]))
    total_ops = sum(ops.values()) / n
    print(f"{'total':<10} {sum(wall.values()) / n:>9.1f} {total_ops:>9.0f} {sum(gpu_us.values()) / n / 1e3:>7.2f}")
    # Attention FLOPs (not in the profiler's count): self-attention over the clip's tokens,
    # QK^T and PV, forward + backward (~2.5x forward), per layer.
    cfg = toywan.transformer_config(a.layers)
    tokens = ((toyvideo.FRAMES - 1) // 4 + 1) * (toyvideo.SIZE // 4 // 2) ** 2
    dim = cfg["num_attention_heads"] * cfg["attention_head_dim"]
    attn = 3.5 * 4 * a.batch * tokens**2 * dim * a.layers
    mm = flops / n
    print(f"matmul/conv FLOPs per step (profiler: forward + backward) {mm / 1e9:.1f} G, "
          f"attention ~{attn / 1e9:.1f} G; tokens per clip {tokens}")
    clip_bytes = a.batch * toyvideo.FRAMES * toyvideo.SIZE**2 * 3 * 4
    print(f"clips per batch as float32: {clip_bytes / 1e6:.1f} MB")
    for rate_us in (5, 10):
        print(f"eager GPU floor at {rate_us} us per op: {total_ops * rate_us / 1e3:.1f} ms/step")


if __name__ == "__main__":
    main()
