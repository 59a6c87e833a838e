"""Video-like attention tensors made from a seed, for when no captured tensors are at hand.

Labelled synthetic wherever they are used. They carry the structure the paper's analyses are
about, each piece chosen to mimic what video DiT activations show:
  - tokens on a (T, H, W) grid covered by a few moving "objects": tokens of one object share a
    value component (what a block mean can remove once the tokens are grouped),
  - a smooth spatiotemporal field on top, and per-token noise,
  - token outliers in V: a few tokens with a large spike whose channels differ per head,
  - channel outliers in Q and K: a constant per-channel bias shared by all tokens (what K
    smoothing and a Hadamard rotation remove),
  - queries aligned with the keys of their own object, so attention is structured, not uniform.
"""

from __future__ import annotations

import math

import torch

from vcbench.tensors import AttentionTensors


def synthetic_qkv(seed: int = 0, heads: int = 2, grid: tuple[int, int, int] = (8, 32, 32),
                  head_dim: int = 128, objects: int = 6, outlier_share: float = 0.005,
                  dtype: torch.dtype = torch.bfloat16) -> AttentionTensors:
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=g)

    t, h, w = grid
    n, d = t * h * w, head_dim
    ti, hi, wi = torch.meshgrid(torch.linspace(0, 1, t), torch.linspace(0, 1, h),
                                torch.linspace(0, 1, w), indexing="ij")
    pos = torch.stack([ti, hi, wi], -1).reshape(n, 3)

    # Objects: nearest moving centre owns the token.
    start, velocity = torch.rand(objects, 2, generator=g), 0.3 * randn(objects, 2)
    centres = start[None] + velocity[None] * pos[:, None, :1]          # (n, objects, 2)
    label = ((pos[:, None, 1:] - centres) ** 2).sum(-1).argmin(-1)     # (n,)

    qs, ks, vs = [], [], []
    for _ in range(heads):
        obj_v, obj_k = 2.0 * randn(objects, d), 1.5 * randn(objects, d)
        freqs = 3.0 * randn(4, 3)
        field = torch.sin(pos @ freqs.T + 2 * math.pi * torch.rand(4, generator=g))  # (n, 4)
        v = obj_v[label] + field @ (0.5 * randn(4, d)) + 0.3 * randn(n, d)
        n_out = max(1, int(outlier_share * n))
        rows = torch.randperm(n, generator=g)[:n_out]
        spike_channels = torch.randperm(d, generator=g)[:4]
        v[rows[:, None], spike_channels] += 25.0 * (1 + torch.rand(n_out, 4, generator=g))

        k_bias = torch.zeros(d)
        k_bias[torch.randperm(d, generator=g)[:6]] = 8.0 * randn(6)
        q_bias = torch.zeros(d)
        q_bias[torch.randperm(d, generator=g)[:6]] = 4.0 * randn(6)
        k = obj_k[label] + field @ randn(4, d) * 0.5 + 0.6 * randn(n, d) + k_bias
        q = 1.2 * obj_k[label] + 0.8 * randn(n, d) + q_bias
        qs.append(q), ks.append(k), vs.append(v)

    def stack(xs):
        return torch.stack(xs)[None].to(dtype)

    return AttentionTensors(stack(qs), stack(ks), stack(vs), grid, f"synthetic(seed={seed})")
