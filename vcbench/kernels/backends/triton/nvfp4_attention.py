"""NVFP4 attention on 16-bit tensor cores: one online-softmax pass, as the emulation's
`reference.engine.run` walks it.

A fidelity kernel, not an FP4 speed claim. An E2M1 value (2 significant bits) times an E4M3
microscale (4) has at most 6 significant bits and lies in [2^-10, 2688], inside FP16's normal
range: every dequantized operand is exact in FP16 and every product exact in the FP32
accumulator of an FP16 MMA. Only the order (and the tensor core's internal rounding) of the
FP32 sums differs from the emulation's, and MUFU's exp2 from torch's.

One program owns BLOCK_M query rows (one Q-smoothing block) of one (batch, head):

    q      = codes/2 * microscale (FP16, once)
    per KV tile j:
      s    = q k_j^T                                    FP16 MMA, FP32 accumulation
             [* q_outer * k_outer]                      two-level Q/K scales (attnqat-tf)
             [+ bias_q . (K_j - mean_K)]                Q smoothing's term, this tile's keys
      m'   = max(m, rowmax s);  alpha = exp2(m - m');  p = exp2(s - m')
      r    = rowsum p
      P    = NVFP4(p / s1) with s1 = rowmax(p) / 2688   two-level (sage3, vc-4bit), or of p
             itself (attnqat-tf): per 16 keys an E4M3 microscale, E2M1 codes (explicit RNE)
      acc  = alpha acc + (P V_j) [* s1]                 FP16 MMA, FP32 accumulation
      acc += r * mean_j                                 V-Smooth, Equation 6
      l    = alpha l + r
    O = acc [* v_outer] / l                             one epilogue

Offsets that can pass 2^31 elements are 64-bit: each (batch, head)'s base is added to the
pointers once, in 64 bits; offsets inside one head's operands (rows * D + column, below
N_pad * D < 2^31, which `operands.nvfp4_shape_reason` requires) stay 32-bit, so a tile of
pointers is one 64-bit base plus 32-bit offsets rather than a tile of 64-bit products.
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from vcbench.kernels.backends.triton.nvfp4 import OUTER_DIVISOR, microscale, round_e2m1_twice

TWO_64 = tl.constexpr(18446744073709551616.0)  # 2^64, exact scaling of dividend and divisor
# RN(1 / (1 + m/8)) in FP32 for an E4M3 value's three mantissa bits m (the reciprocal of a
# microscale is one of these times a power of two)
_R = [float(np.float32(1) / np.float32(1 + m / 8)) for m in range(8)]
R1, R2, R3, R4, R5, R6, R7 = (tl.constexpr(r) for r in _R[1:])
# SageAttention3's s1 = rowmax(P~) / (448 * 6): the divisor scaled by 2^64, and its RN reciprocal
P_ROW_DIVISOR_UP = tl.constexpr(OUTER_DIVISOR * 2.0**64)
P_ROW_RECIP_UP = tl.constexpr(float(np.float32(1) / np.float32(OUTER_DIVISOR * 2.0**64)))


@triton.jit
def _recip_e4m3_up(x):
    """div_rn(1, x) for x an E4M3 value times 2^64 (normal, mantissa in its top three bits):
    the table's entry for the mantissa times 2^-exponent, exact, with no division."""
    bits = x.to(tl.int32, bitcast=True)
    m = (bits >> 20) & 7
    pow2 = ((254 - ((bits >> 23) & 0xFF)) << 23).to(tl.float32, bitcast=True)
    t = tl.where(m < 4, tl.where(m < 2, tl.where(m == 0, 1.0, R1), tl.where(m == 2, R2, R3)),
                 tl.where(m < 6, tl.where(m == 4, R4, R5), tl.where(m == 6, R6, R7)))
    return t * pow2


@triton.jit
def _div_rn_by(x, d_up, recip):
    """x / d rounded to nearest (div_rn's result), x >= 0, d > 0, given d_up = d * 2^64 and
    recip = div_rn(1, d_up): one division per row or group instead of one per element (a
    div_rn is a subroutine call; 16K of them a tile spilled the kernel). Markstein's
    correction: q = x_up * recip is within an ulp of the quotient, r = x_up - q d_up is exact
    by FMA, and q + r * recip rounded once is the correctly rounded quotient when no
    intermediate is subnormal, which the exact 2^64 scaling of both operands ensures for every
    x >= 2^-149 (tests/test_exact_division.py checks the sequence against exact arithmetic)."""
    x_up = x * TWO_64
    q = x_up * recip
    r = tl.fma(-q, d_up, x_up)
    return tl.fma(r, recip, q)


@triton.jit
def _dequantize_rows(Codes, Scales, rows, R: tl.constexpr, D: tl.constexpr):
    """Q or K rows (R, D) of one head (pointers at its base) in FP16: codes/2 times the
    microscale of their 16-column group."""
    cols = tl.arange(0, D)
    codes = tl.load(Codes + rows[:, None] * D + cols[None, :])
    scale = tl.load(Scales + rows[:, None] * (D // 16) + tl.arange(0, D // 16)[None, :])
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (R, D // 16, 16)), (R, D))
    return (codes.to(tl.float32) * 0.5 * scale.to(tl.float32)).to(tl.float16)


@triton.jit
def _kv_tile(acc, m_i, l_i, q, bias_q, k_mean, q_outer, k_outer, Kc, Ks, Vc, Vs, VM, KIn,
             Perm, j, n, OUTER_QK: tl.constexpr, BIAS: tl.constexpr, HAS_PERM: tl.constexpr,
             VSMOOTH: tl.constexpr, TWO_LEVEL: tl.constexpr, MASK: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """One KV tile; MASK only for the tile that holds padded keys. Every pointer is at its
    (batch, head)'s base."""
    keys = j * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, D)
    real = keys < n
    k = _dequantize_rows(Kc, Ks, keys, BLOCK_N, D)
    s = tl.dot(q, tl.trans(k))
    if OUTER_QK:
        s = s * q_outer
        s = s * k_outer
    if BIAS:
        src = keys
        if HAS_PERM:
            src = tl.load(Perm + keys, mask=real, other=0)
        kin = tl.load(KIn + src[:, None] * D + cols[None, :], mask=real[:, None],
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
    x3 = tl.reshape(x, (BLOCK_M, BLOCK_N // 16, 16))
    scale = microscale(tl.max(x3, 2))  # x >= 0: its max is its amax
    # codes_twice's x / scale (a zero scale gives zero codes), one division per group
    full_up = tl.where(scale > 0, scale, 1.0) * TWO_64
    recip = _recip_e4m3_up(full_up)
    y = _div_rn_by(x3, full_up[:, :, None], recip[:, :, None])
    codes = round_e2m1_twice(tl.where(scale[:, :, None] > 0, y, 0.0))
    p_deq = tl.reshape(codes * 0.5 * scale[:, :, None], (BLOCK_M, BLOCK_N))

    v_codes = tl.load(Vc + keys[:, None] * D + cols[None, :])
    v_scale = tl.load(Vs + (j * (BLOCK_N // 16) + tl.arange(0, BLOCK_N // 16))[:, None] * D
                      + cols[None, :])
    v_scale = tl.reshape(tl.broadcast_to(v_scale[:, None, :], (BLOCK_N // 16, 16, D)),
                         (BLOCK_N, D))
    v = (v_codes.to(tl.float32) * 0.5 * v_scale.to(tl.float32)).to(tl.float16)
    pv = tl.dot(p_deq.to(tl.float16), v)
    if TWO_LEVEL:
        pv = pv * s1[:, None]
    acc = acc * alpha[:, None] + pv
    if VSMOOTH:
        mu = tl.load(VM + j * D + cols).to(tl.float32)
        acc = acc + r[:, None] * mu[None, :]
    l_i = l_i * alpha + r
    return acc, m_new, l_i


@triton.jit
def _nvfp4_attention_fwd(Qc, Qs, Kc, Ks, Vc, Vs, QO, KO, VO, VM, BiasQ, KMean, KIn, Perm, Out,
                         n, n_q_pad, n_k_pad, H, stride_ob, stride_oh, stride_on,
                         OUTER_QK: tl.constexpr, OUTER_V: tl.constexpr, BIAS: tl.constexpr,
                         HAS_PERM: tl.constexpr, VSMOOTH: tl.constexpr, TWO_LEVEL: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, D)
    # Each operand's pointer moved to this (batch, head) once, in 64 bits.
    q = _dequantize_rows(Qc + bh * n_q_pad * D, Qs + bh * n_q_pad * (D // 16), rows, BLOCK_M,
                         D)
    Kc += bh * n_k_pad * D
    Ks += bh * n_k_pad * (D // 16)
    Vc += bh * n_k_pad * D
    Vs += bh * (n_k_pad // 16) * D
    VM += bh * (n_k_pad // BLOCK_N) * D
    KIn += bh * n * D
    Perm += bh * n
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
            acc, m_i, l_i, q, bias_q, k_mean, q_outer, k_outer, Kc, Ks, Vc, Vs, VM, KIn, Perm,
            j, n, OUTER_QK, BIAS, HAS_PERM, VSMOOTH, TWO_LEVEL, False, BLOCK_M, BLOCK_N, D)
    if n_full * BLOCK_N < n:
        acc, m_i, l_i = _kv_tile(
            acc, m_i, l_i, q, bias_q, k_mean, q_outer, k_outer, Kc, Ks, Vc, Vs, VM, KIn, Perm,
            n_full, n, OUTER_QK, BIAS, HAS_PERM, VSMOOTH, TWO_LEVEL, True, BLOCK_M, BLOCK_N, D)

    if OUTER_V:
        acc = acc * tl.load(VO + bh)
    out = tl.math.div_rn(acc, l_i[:, None] + tl.zeros_like(acc))
    r64 = rows.to(tl.int64)  # the caller's row stride may be H * D: 64-bit products
    o_ptrs = Out + b * stride_ob + h * stride_oh + r64[:, None] * stride_on + cols[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(rows < n)[:, None])


def launch(ops, plan, out, *, num_warps: int = 8, num_stages: int = 2):
    """Run the kernel on `nvfp4.prepare`'s operands; out (B, H, N, D), unit last stride.
    Untuned: 0.84-1.19 s a call at the Wan2.2 shape on the H200 (docs/perf.md)."""
    b, h, _, d = out.shape
    spare = ops.q_scale  # any pointer, for the arguments a switch leaves unread
    bias = ops.bias_q is not None
    grid = (triton.cdiv(ops.n, ops.block_m), b * h)
    _nvfp4_attention_fwd[grid](
        ops.q, ops.q_scale, ops.k, ops.k_scale, ops.v, ops.v_scale,
        ops.q_outer if ops.q_outer is not None else spare,
        ops.k_outer if ops.k_outer is not None else spare,
        ops.v_outer if ops.v_outer is not None else spare,
        ops.v_mean if ops.v_mean is not None else spare,
        ops.bias_q if bias else spare, ops.k_mean if bias else spare,
        ops.k_input if bias else spare, ops.perm if ops.perm is not None else spare, out,
        ops.n, ops.q.shape[1], ops.k.shape[1], h, out.stride(0), out.stride(1), out.stride(2),
        OUTER_QK=ops.q_outer is not None, OUTER_V=ops.v_outer is not None, BIAS=bias,
        HAS_PERM=ops.perm is not None, VSMOOTH=ops.v_mean is not None,
        TWO_LEVEL=plan.p.two_level, BLOCK_M=ops.block_m, BLOCK_N=ops.block_n, D=d,
        num_warps=num_warps, num_stages=num_stages)
    return out
