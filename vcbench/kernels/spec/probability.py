"""How each method turns the log-domain score tile into the low-bit P tile of the PV product.

Every encoder takes the score tile S and the running row max m' (log2 units, as the online
softmax has them; u = S - m' <= 0) and returns
    inner:   what enters the PV matrix product (codes, times any per-16 microscale),
    outer:   a per-row scale applied to that product afterwards, or None,
    row_sum: the row sum r_ij the normalizer l accumulates, in the same units as inner*outer.
Where the kernel has an FP32 probability it sums that (before rounding); ExpCast has none, so
its row sum is the sum of the decoded codes, which also makes the code error cancel in l.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vcbench.kernels.spec.expcast import (
    DEFAULT_BETA,
    P_SCALE,
    decode_e4m3_bytes,
    expcast_code_from_scores,
)
from vcbench.kernels.spec.formats import E2M1, E4M3, Format, true_divide
from vcbench.kernels.spec.granularity import Microscale16, Quantizer


@dataclass(frozen=True)
class ExpThenCast:
    """FP32 exp2, times a static scale, rounded to `fmt` (SageAttention2 scales P~ in [0, 1]
    by 448 so the row max lands on E4M3's largest code; BF16 FlashAttention uses scale 1)."""

    fmt: Format
    scale: float = 1.0

    def encode(self, s: torch.Tensor, m: torch.Tensor):
        # The kernel folds the static scale into the exponent: exp2(S - (m - log2 scale)).
        shift = m - math.log2(self.scale) if self.scale != 1.0 else m
        p = torch.exp2(s - shift)
        return self.fmt.round(p), None, p.sum(-1, keepdim=True)

    def describe(self) -> str:
        return f"exp2 -> {self.fmt.name}" + (f" (x{self.scale:g})" if self.scale != 1.0 else "")


@dataclass(frozen=True)
class ExpCast:
    """ExpCast-FP8: the E4M3 byte of 2^(u+8) in one multiply-add (see expcast.py)."""

    beta: float = DEFAULT_BETA
    scale: float = P_SCALE

    def encode(self, s: torch.Tensor, m: torch.Tensor):
        p = decode_e4m3_bytes(expcast_code_from_scores(s, m, self.beta)).to(s.dtype)
        return p, None, p.sum(-1, keepdim=True)

    def describe(self) -> str:
        return f"ExpCast-FP8 (beta {self.beta:g})"


@dataclass(frozen=True)
class NVFP4Probability:
    """P~ in NVFP4 along the key axis (per-16 E4M3 microscale).

    two_level (SageAttention3): first a per-row FP32 scale s1 = rowmax(P~)/(448*6) spreads each
    row over the full E4M3 x E2M1 range, then the microscale; s1 is the `outer` row scale.
    Without it (plain microscaling), P~ <= 1 is microscaled directly and small entries'
    scales fall into E4M3's subnormals or to zero.
    """

    two_level: bool = True

    def encode(self, s: torch.Tensor, m: torch.Tensor):
        p = torch.exp2(s - m)
        quantizer = Quantizer(E2M1, Microscale16(axis=-1))
        outer = None
        x = p
        if self.two_level:
            outer = true_divide(p.amax(-1, keepdim=True), E4M3.max * E2M1.max)
            x = p / torch.where(outer > 0, outer, 1.0)
        q = quantizer(x)
        return q.inner(), outer, p.sum(-1, keepdim=True)

    def describe(self) -> str:
        return "NVFP4" + (" two-level" if self.two_level else " plain")


PEncoder = ExpThenCast | ExpCast | NVFP4Probability
