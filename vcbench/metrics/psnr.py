"""PSNR of a clip: one MSE pooled over every frame, pixel and channel, data range 255.

Pooling (rather than averaging per-frame PSNRs) is what the paper reports: a clip that is
exact except for one ruined frame keeps a finite score that still shows the damage. Identical
clips have MSE 0 and PSNR `inf`, which is reported as such.
"""

from __future__ import annotations

import math

import torch

DATA_RANGE = 255.0


def psnr(ref: torch.Tensor, cand: torch.Tensor) -> float:
    """ref, cand: (T, H, W, C) in [0, 255], same shape, any device."""
    # float64: a 17x480x832x3 sum of squares loses digits in float32.
    mse = torch.mean((ref.double() - cand.double()) ** 2).item()
    if mse == 0.0:
        return math.inf
    return 10.0 * math.log10(DATA_RANGE**2 / mse)
