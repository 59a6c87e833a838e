"""ExpCast-FP8 (paper 3.3, appendices C and D): the E4M3 probability byte from the log score.

An E4M3 byte read as the integer 8e + m is, up to a bounded mantissa term, an affine function
of log2 of the value it stores: byte = 8 log2(v) + 56 + eps(m). With the row maximum placed at
2^8 (so the largest probability of a row decodes to 256), the byte of 2^u, u <= 0, is

    code(u) = clip_[0,120]( round_half_even( 8 u + 120 + beta ) )

one multiply-add from the log2-domain score u = S - m (S already in log2 units: the kernels
fold log2(e)/sqrt(d) into Q). beta centres the mantissa error eps; its minimax value is
-0.3443, the paper uses -0.35. Codes 1..7 are E4M3 subnormals: the underflow tail.
"""

from __future__ import annotations

import torch

DEFAULT_BETA = -0.35
# The row maximum decodes to 2^8: code 120 is exponent field 15, mantissa 0.
ROW_MAX_CODE = 120
P_SCALE = 256.0


def expcast_code(u: torch.Tensor, beta: float = DEFAULT_BETA) -> torch.Tensor:
    """E4M3 bytes (uint8) for log2-domain scores u = S - rowmax <= 0.

    Computed as t = 8*u + (120 + beta): multiplying by 8 is exact in binary floating point, so
    this equals the kernel's single FMA bit for bit; then ties-to-even rounding and the clip.
    """
    bias = torch.tensor(ROW_MAX_CODE + beta, dtype=torch.float32, device=u.device)
    t = u.float() * 8.0 + bias
    return torch.round(t).clamp_(0, ROW_MAX_CODE).to(torch.uint8)


def expcast_code_from_scores(s: torch.Tensor, row_max: torch.Tensor,
                             beta: float = DEFAULT_BETA) -> torch.Tensor:
    """The kernel's form of the same map: t = S * 8 + (120 + beta - 8 m), one FMA per element
    with the row term computed once per row. S and m are FP32 log2-domain scores; because 8 is
    a power of two, S * 8 and m * 8 are exact and this equals `fma(S, 8, b)` bit for bit."""
    bias = torch.tensor(ROW_MAX_CODE + beta, dtype=torch.float32, device=s.device)
    row_term = bias - row_max.float() * 8.0
    t = s.float() * 8.0 + row_term
    return torch.round(t).clamp_(0, ROW_MAX_CODE).to(torch.uint8)


def decode_e4m3_bytes(code: torch.Tensor) -> torch.Tensor:
    """Reinterpret bytes as float8_e4m3fn and widen to FP32 (no conversion of the bits)."""
    return code.view(torch.float8_e4m3fn).float()


def expcast_value(u: torch.Tensor, beta: float = DEFAULT_BETA) -> torch.Tensor:
    """The probability (times 2^8) that ExpCast's byte decodes to, as FP32."""
    return decode_e4m3_bytes(expcast_code(u, beta))


def exp_then_cast_value(u: torch.Tensor) -> torch.Tensor:
    """The conventional path: FP32 exp2(u + 8), then round to E4M3 (what ExpCast replaces)."""
    from vcbench.kernels.spec.formats import round_e4m3

    return round_e4m3(torch.exp2(u.float() + 8.0))
