"""The normalised Hadamard rotation used on Q and K (and, for an ablation, on V).

H is the Sylvester Hadamard matrix of order d divided by sqrt(d): symmetric and orthogonal,
so (Q H)(K H)^T = Q K^T and (P V H) H^T = P V. Rotating mixes channels within a token; it
spreads channel outliers, not token outliers.

`rotate` computes x H as the fast Walsh-Hadamard butterfly, log2(d) stages of x_j +- x_(j^h)
for h = 1, 2, ..., d/2, then one multiply by the FP32 (or FP64) 1/sqrt(d). Every addition is
an elementwise IEEE operation in a fixed order, so the fused GPU quantizers, which run the
same butterfly in registers, produce the same bits on any device; a matrix product would not
(its summation order is the library's). In exact arithmetic the butterfly is x @ hadamard(d).
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=8)
def _hadamard_cpu(d: int) -> torch.Tensor:
    _check(d)
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / d**0.5


def _check(d: int) -> None:
    if d < 1 or d & (d - 1):
        raise ValueError(f"a Hadamard rotation needs a power-of-two head dim, got {d}")


def hadamard(d: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    return _hadamard_cpu(d).to(dtype=dtype, device=device)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x @ H along the last axis, by the butterfly (the kernels' order of operations)."""
    d = x.shape[-1]
    _check(d)
    lead = x.shape[:-1]
    h = 1
    while h < d:
        pairs = x.reshape(*lead, d // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2).reshape(*lead, d)
        h *= 2
    return x * torch.tensor(1.0 / d**0.5, dtype=x.dtype, device=x.device)
