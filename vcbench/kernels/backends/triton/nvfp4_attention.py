"""NVFP4 attention on 16-bit tensor cores: one online-softmax pass, as the emulation's
`reference.engine.run` walks it.

A fidelity kernel, not an FP4 speed claim. An E2M1 value (2 significant bits) times an E4M3
microscale (4) has at most 6 significant bits and lies in [2^-10, 2688], inside FP16's normal
range: every dequantized operand is exact in FP16 and every product exact in the FP32
accumulator of an FP16 MMA. Only the order (and the tensor core's internal rounding) of the
FP32 sums differs from the emulation's, and MUFU's exp2 from torch's.

Q, K and V arrive dequantized (`nvfp4.prepare` writes codes times microscale in FP16, once a
call), so the tiles stream into shared memory as a BF16 kernel's do, pipelined by Triton, and
no tile is dequantized by each of the N / BLOCK_M programs that read it. One program owns
BLOCK_M query rows (one Q-smoothing block) of one (batch, head):

    per KV tile j:
      s    = q k_j^T                                    FP16 MMA, FP32 accumulation
             [* q_outer * k_outer]                      two-level Q/K scales (attnqat-tf)
             [+ bias_q . (K_j - mean_K)]                Q smoothing's term, this tile's keys
      m'   = max(m, rowmax s);  alpha = exp2(m - m');  p = exp2(s - m')
      r    = rowsum p
      P    = NVFP4(p / s1) with s1 = rowmax(p) / 2688   two-level (sage3, vc-4bit), or of p
             itself (attnqat-tf): per 16 keys an E4M3 microscale, E2M1 codes
      acc  = alpha acc + (P V_j) [* s1]                 FP16 MMA, FP32 accumulation
      acc += r * mean_j                                 V-Smooth, Equation 6
      l    = alpha l + r
    O = acc [* v_outer] / l                             one epilogue

P's arithmetic is the emulation's, bit for bit on the same p, without a division per element
(a div_rn is a subroutine call; 16K of them a tile spilled the kernel):
  - p / s1 by Markstein's correction on operands scaled by 2^64 (`_div_rn_by`), one
    reciprocal per row;
  - x / microscale as the preprocessing divides (`nvfp4.nvfp4_values`): the same correction
    unscaled, the reciprocal from a table of the microscale's three mantissa bits; an
    intermediate can be subnormal only where the code is 0 either way;
  - the E2M1 rounding as one magic-number add whose quantum (0.5, 1 or 2) is read off the
    quotient's exponent (`nvfp4.round_e2m1_nonneg`), where the emulation's piecewise form
    takes three roundings and two selects.

Offsets that can pass 2^31 elements are 64-bit: each (batch, head)'s base is added to the
pointers once, in 64 bits; offsets inside one head's operands (rows * D + column, below
N_pad * D < 2^31, which `operands.nvfp4_shape_reason` requires) stay 32-bit, so a tile of
pointers is one 64-bit base plus 32-bit offsets rather than a tile of 64-bit products.
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from vcbench.kernels.backends.triton.nvfp4 import (
    OUTER_DIVISOR,
    div_rn_markstein,
    microscale,
    recip_e4m3,
    round_e2m1_nonneg,
)

TWO_64 = tl.constexpr(18446744073709551616.0)  # 2^64, exact scaling of dividend and divisor
# SageAttention3's s1 = rowmax(P~) / (448 * 6): the divisor scaled by 2^64, and its RN reciprocal
P_ROW_DIVISOR_UP = tl.constexpr(OUTER_DIVISOR * 2.0**64)
P_ROW_RECIP_UP = tl.constexpr(float(np.float32(1) / np.float32(OUTER_DIVISOR * 2.0**64)))


@triton.jit
def _div_rn_by(x, d_up, recip):
    """x / d rounded to nearest, x >= 0, d > 0, given d_up = d * 2^64 and recip = div_rn(1,
    d_up): Markstein's correction on x_up = x * 2^64. The exact scaling of both operands keeps
    every intermediate normal for every x >= 2^-149 (d is a row scale, down to subnormal)."""
    return div_rn_markstein(x * TWO_64, d_up, recip)


@triton.jit
def _quantize_p(p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """NVFP4 of x >= 0 (BLOCK_M, BLOCK_N) along the keys, dequantized to FP16: E2M1 codes of
    x / microscale, times the microscale."""
    x3 = tl.reshape(p, (BLOCK_M, BLOCK_N // 16, 16))
    scale = microscale(tl.max(x3, 2))[:, :, None]  # x >= 0: its max is its amax
    # A zero scale is not guarded: its reciprocal is the table's 2^127, every x of the group
    # below 0.006, so the quotient is finite (garbage) and its code times the scale 0.
    codes = round_e2m1_nonneg(div_rn_markstein(x3, scale, recip_e4m3(scale)))
    return tl.reshape(codes * scale, (BLOCK_M, BLOCK_N)).to(tl.float16)


@triton.jit
def _kv_tile(acc, m_i, l_i, q, bias_q, k_mean, q_outer, k_outer, K, V, VM, KIn, j, n,
             OUTER_QK: tl.constexpr, BIAS: tl.constexpr, VSMOOTH: tl.constexpr,
             TWO_LEVEL: tl.constexpr, MASK: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, D: tl.constexpr):
    """One KV tile; MASK only for the tile that holds padded keys. Every pointer is at its
    (batch, head)'s base."""
    keys = j * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, D)
    real = keys < n
    k = tl.load(K + keys[:, None] * D + cols[None, :])
    s = tl.dot(q, tl.trans(k))
    if OUTER_QK:
        s = s * q_outer
        s = s * k_outer
    if BIAS:
        kin = tl.load(KIn + keys[:, None] * D + cols[None, :], mask=real[:, None],
                      other=0.0).to(tl.float32)
        s = s + tl.sum((kin - k_mean[None, :]) * bias_q[None, :], 1)[None, :]
    if MASK:
        s = tl.where(real[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.math.exp2(m_i - m_new)
    p = tl.math.exp2(s - m_new[:, None])
    r = tl.sum(p, 1)

    if TWO_LEVEL:  # per row: s1 = rowmax / (448 * 6), so the row spans E4M3 x E2M1
        s1 = _div_rn_by(tl.max(p, 1), P_ROW_DIVISOR_UP, P_ROW_RECIP_UP)
        s1_up = tl.where(s1 > 0, s1, 1.0) * TWO_64
        x = _div_rn_by(p, s1_up[:, None], tl.math.div_rn(tl.zeros_like(s1_up) + 1.0, s1_up)[:, None])
    else:
        x = p
    v = tl.load(V + keys[:, None] * D + cols[None, :])
    pv = tl.dot(_quantize_p(x, BLOCK_M, BLOCK_N), v)
    if TWO_LEVEL:
        pv = pv * s1[:, None]
    acc = acc * alpha[:, None] + pv
    if VSMOOTH:
        mu = tl.load(VM + j * D + cols).to(tl.float32)
        acc = acc + r[:, None] * mu[None, :]
    l_i = l_i * alpha + r
    return acc, m_new, l_i


@triton.jit
def _nvfp4_attention_fwd(Q, K, V, QO, KO, VO, VM, BiasQ, KMean, KIn, Out,
                         n, n_q_pad, n_k_pad, H, stride_ob, stride_oh, stride_on,
                         OUTER_QK: tl.constexpr, OUTER_V: tl.constexpr, BIAS: tl.constexpr,
                         VSMOOTH: tl.constexpr, TWO_LEVEL: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    # Each operand's pointer moved to this (batch, head) once, in 64 bits.
    q = tl.load(Q + bh * n_q_pad * D + rows[:, None] * D + cols[None, :])
    K += bh * n_k_pad * D
    V += bh * n_k_pad * D
    VM += bh * (n_k_pad // BLOCK_N) * D
    KIn += bh * n * D
    q_outer = 1.0
    k_outer = 1.0
    if OUTER_QK:
        q_outer = tl.load(QO + bh)
        k_outer = tl.load(KO + bh)
    bias_q = tl.zeros([D], tl.float32)
    k_mean = tl.zeros([D], tl.float32)
    if BIAS:
        bias_q = tl.load(BiasQ + (bh * (n_q_pad // BLOCK_M) + pid_m) * D + cols)
        k_mean = tl.load(KMean + bh * D + cols)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    n_full = n // BLOCK_N
    for j in range(0, n_full):
        acc, m_i, l_i = _kv_tile(
            acc, m_i, l_i, q, bias_q, k_mean, q_outer, k_outer, K, V, VM, KIn, j, n, OUTER_QK, BIAS,
            VSMOOTH, TWO_LEVEL, False, BLOCK_M, BLOCK_N, D)
    if n_full * BLOCK_N < n:
        acc, m_i, l_i = _kv_tile(
            acc, m_i, l_i, q, bias_q, k_mean, q_outer, k_outer, K, V, VM, KIn, n_full, n, OUTER_QK,
            BIAS, VSMOOTH, TWO_LEVEL, True, BLOCK_M, BLOCK_N, D)

    if OUTER_V:
        acc = acc * tl.load(VO + bh)
    out = tl.math.div_rn(acc, l_i[:, None] + tl.zeros_like(acc))
    r64 = rows.to(tl.int64)  # the caller's row stride may be H * D: 64-bit products
    o_ptrs = Out + b * stride_ob + h * stride_oh + r64[:, None] * stride_on + cols[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(rows < n)[:, None])


# One program: 128 query rows on two warpgroups; K and V tiles two stages deep in shared memory.
NUM_WARPS = 8
NUM_STAGES = 2


def switches(plan) -> dict:
    """The kernel's constexpr switches for `plan` (one `operands.nvfp4_plan_reason` accepts)."""
    return dict(OUTER_QK=plan.q.granularity.global_scale, OUTER_V=plan.v.granularity.global_scale,
                BIAS=plan.smooth_q, VSMOOTH=plan.vsmooth is not None,
                TWO_LEVEL=plan.p.two_level)


def launch(ops, plan, out, *, num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES):
    """Run the kernel on `nvfp4.prepare`'s operands; out (B, H, N, D), unit last stride."""
    if ops.key_order != "natural":  # P's microscale groups would span other keys: no error
        raise ValueError("the Triton NVFP4 kernel reads operands prepared with "
                         f"key_order='natural', got {ops.key_order!r}")
    b, h, _, d = out.shape
    spare = ops.q  # any pointer, for the arguments a switch leaves unread
    grid = (triton.cdiv(ops.n, ops.block_m), b * h)
    _nvfp4_attention_fwd[grid](
        ops.q, ops.k, ops.v,
        ops.q_outer if ops.q_outer is not None else spare,
        ops.k_outer if ops.k_outer is not None else spare,
        ops.v_outer if ops.v_outer is not None else spare,
        ops.v_mean if ops.v_mean is not None else spare,
        ops.bias_q if ops.bias_q is not None else spare,
        ops.k_mean if ops.k_mean is not None else spare,
        ops.k_input if ops.k_input is not None else spare, out,
        ops.n, ops.q.shape[1], ops.k.shape[1], h, out.stride(0), out.stride(1), out.stride(2),
        **switches(plan), BLOCK_M=ops.block_m, BLOCK_N=ops.block_n, D=d, num_warps=num_warps,
        num_stages=num_stages)
    return out
