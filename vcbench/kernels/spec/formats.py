"""Number formats of low-bit attention: round-to-grid functions on float tensors.

Every function maps a float tensor to the nearest value of the format's grid, as the GPU's
conversion instruction does: round to nearest, ties to even, saturating at the largest finite
value (`cvt.rn.satfinite`). Values stay in a float tensor ("value space"): an INT8 code 17 is
the float 17.0, an E4M3 code is the float it decodes to. `to_storage` turns values into the
bytes a kernel stores, for bit-for-bit comparison with a GPU kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
INT8_MAX = 127.0

# E2M1 (the NVFP4 element): sign + 2 exponent bits + 1 mantissa bit, no inf/nan.
E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def round_int8(x: torch.Tensor) -> torch.Tensor:
    """Nearest integer (ties to even) clipped to [-127, 127] (symmetric INT8, `cvt.rni.sat`)."""
    return torch.round(x).clamp_(-INT8_MAX, INT8_MAX)


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Nearest float8 E4M3 (the `fn` variant: max 448, subnormals down to 2^-9), saturating."""
    dtype = x.dtype
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).to(dtype)


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 value (ties to the even code), saturating at +-6.

    The grid has step 0.5 on [0, 2], 1 on [2, 4] and 2 on [4, 6]; in each piece the code is
    an offset plus the rounded position, and its parity is the position's, so rounding the
    position half-to-even sends every tie to the even code.
    """
    mag = x.abs().clamp(max=E2M1_MAX)
    out = torch.where(mag < 2.0, torch.round(mag * 2.0) * 0.5,
                      torch.where(mag < 4.0, torch.round(mag - 2.0) + 2.0,
                                  torch.round((mag - 4.0) * 0.5) * 2.0 + 4.0))
    return torch.copysign(out, x)


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).to(x.dtype)


def round_fp16(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-65504.0, 65504.0).to(torch.float16).to(x.dtype)


def round_fp22(x: torch.Tensor) -> torch.Tensor:
    """Truncate an FP32 value to 13 mantissa bits: the accumulator width of Hopper FP8 MMA
    as SageAttention2 models it (two-level accumulation adds each tile's product, rounded so,
    into an FP32 buffer)."""
    bits = x.float().view(torch.int32)
    return (bits & ~((1 << 10) - 1)).view(torch.float32).to(x.dtype)


def scale_for(amax: torch.Tensor, fmt_max: float) -> torch.Tensor:
    """amax / fmt_max as every kernel computes it: one FP32 multiply by the reciprocal, rounded
    to FP32 once. (A division by a scalar is turned into exactly this by some frameworks on
    some devices; fixing the rule here keeps CPU, GPU emulation and kernels bit-equal.)"""
    return amax * torch.tensor(1.0 / fmt_max, dtype=amax.dtype, device=amax.device)


def true_divide(x: torch.Tensor, divisor: float) -> torch.Tensor:
    """x / divisor rounded once, on every device. (torch divides by a Python number truly on
    the CPU but multiplies by its FP32 reciprocal on CUDA; a divisor on x's own device is a
    true division on both, which is what the GPU kernels do: `div_rn`.)"""
    return x / torch.tensor(divisor, dtype=x.dtype, device=x.device)


@dataclass(frozen=True)
class Format:
    """A number format: its name, bit width, largest finite value and rounding function."""

    name: str
    bits: int
    max: float
    round: callable  # type: ignore[valid-type]

    def __repr__(self) -> str:
        return self.name


INT8 = Format("int8", 8, INT8_MAX, round_int8)
E4M3 = Format("e4m3", 8, E4M3_MAX, round_e4m3)
E2M1 = Format("e2m1", 4, E2M1_MAX, round_e2m1)
BF16 = Format("bf16", 16, float(torch.finfo(torch.bfloat16).max), round_bf16)
# No rounding at all: lets the engine be checked in float64 against the exact formula.
EXACT = Format("exact", 64, float("inf"), lambda x: x)


def to_storage(values: torch.Tensor, fmt: Format) -> torch.Tensor:
    """The stored representation of value-space codes: int8, float8_e4m3fn, or E2M1 nibbles
    (uint8 holding sign<<3 | index into E2M1_GRID, unpacked one per byte)."""
    if fmt is INT8:
        return values.to(torch.int8)
    if fmt is E4M3:
        return values.float().to(torch.float8_e4m3fn)
    if fmt is E2M1:
        grid = torch.tensor(E2M1_GRID, dtype=torch.float32, device=values.device)
        index = (values.abs().float()[..., None] == grid).int().argmax(-1)
        return (index | (torch.signbit(values).int() << 3)).to(torch.uint8)
    if fmt is BF16:
        return values.to(torch.bfloat16)
    raise ValueError(f"no storage form for {fmt}")
