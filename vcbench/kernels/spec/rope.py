"""The rotary position embedding an attention call may ask its Q and K quantizers to apply.

Wan's form (diffusers' `WanAttnProcessor.apply_rotary_emb`): channel pairs (2i, 2i+1) of each
token are rotated by the angle whose cosine the table holds at channel 2i and whose sine it
holds at 2i+1,

    out[2i]   = x[2i] * cos[2i] - x[2i+1] * sin[2i+1]
    out[2i+1] = x[2i] * sin[2i+1] + x[2i+1] * cos[2i]

each product and each sum an FP32 operation rounded on its own (16-bit x times FP32 tables
promotes to FP32), the result stored back in x's dtype. `apply_rope` is exactly that
computation, diffusers' own ops in diffusers' order, so a call given `Rope` computes what the
pipeline computes when it applies RoPE eagerly; the fused Triton quantizers do the same FP32
operations in the same order on load (`backends/triton/quantize.py`), bit for bit.

A call gives the tables as (N, D), or as the 4-D tables a pipeline keeps, broadcast over the
batch and head axes of q's layout ((1, N, 1, D) for NHD, diffusers' Wan; (1, 1, N, D) for
HND). One table serves every batch row and head: RoPE depends on the token's position only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vcbench.errors import UserError


@dataclass(frozen=True)
class Rope:
    """RoPE tables of one call, (N, D) each, as the pipeline built them (FP32 in Wan)."""

    cos: torch.Tensor
    sin: torch.Tensor

    @classmethod
    def from_tables(cls, tables, q_shape: tuple[int, ...], layout: str) -> Rope:
        """`tables` ((cos, sin) or a Rope) checked against q of `q_shape` in `layout` and
        flattened to (N, D). A table that does not fit is a UserError naming both shapes."""
        if isinstance(tables, Rope):
            cos, sin = tables.cos, tables.sin
        elif isinstance(tables, (tuple, list)) and len(tables) == 2:
            cos, sin = tables
        else:
            raise UserError("rope must be (cos, sin): two tables of the token positions' "
                            f"cosines and sines, got {type(tables).__name__}")
        n_axis = 2 if layout == "HND" else 1
        n, d = q_shape[n_axis], q_shape[-1]
        if d % 2:
            raise UserError(f"rope rotates channel pairs; head dim {d} is odd")
        flat = []
        for name, t in (("cos", cos), ("sin", sin)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise UserError(f"rope's {name} table must be a floating-point tensor")
            fits = t.shape == (n, d) or (
                t.dim() == 4 and t.shape[n_axis] == n and t.shape[-1] == d
                and all(t.shape[a] == 1 for a in range(3) if a != n_axis))
            if not fits:
                want = (n, d) if layout == "HND" else (1, n, 1, d)
                raise UserError(f"rope's {name} table has shape {tuple(t.shape)}; q of shape "
                                f"{tuple(q_shape)} ({layout}) needs {want} or (N, D) = {(n, d)}")
            flat.append(t.reshape(n, d))
        if flat[0].dtype != flat[1].dtype or flat[0].device != flat[1].device:
            raise UserError("rope's cos and sin tables must share one dtype and device")
        return cls(flat[0], flat[1])

    def fusable(self) -> bool:
        """Whether the fused quantizers compute this rotation bit for bit: FP32 tables (the
        FP32 arithmetic they implement; other tables promote the products differently)."""
        return self.cos.dtype == torch.float32


def rope_tables(n: int, d: int, device, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (N, D), FP32, each frequency repeated on its channel pair (one
    position axis; Wan splits the channels over three, the arithmetic is the same): the tables
    of synthetic calls (timing, Figure 7, tests)."""
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64, device=device) / d)
    angles = torch.arange(n, dtype=torch.float64, device=device)[:, None] * freqs
    angles = angles.repeat_interleave(2, dim=-1)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x (B, H, N, D) rotated as diffusers' WanAttnProcessor rotates it, in x's dtype."""
    cos, sin = rope.cos.to(x.device), rope.sin.to(x.device)
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c, s = cos[..., 0::2], sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out
