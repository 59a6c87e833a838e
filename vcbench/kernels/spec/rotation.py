"""The normalised Hadamard rotation used on Q and K (and, for an ablation, on V).

H is the Sylvester Hadamard matrix of order d divided by sqrt(d): symmetric and orthogonal,
so (Q H)(K H)^T = Q K^T and (P V H) H^T = P V. Rotating mixes channels within a token; it
spreads channel outliers, not token outliers.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=8)
def _hadamard_cpu(d: int) -> torch.Tensor:
    if d < 1 or d & (d - 1):
        raise ValueError(f"a Hadamard rotation needs a power-of-two head dim, got {d}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / d**0.5


def hadamard(d: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> torch.Tensor:
    return _hadamard_cpu(d).to(dtype=dtype, device=device)


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x @ H along the last axis."""
    return x @ hadamard(x.shape[-1], x.dtype, x.device)
