"""The 8-bit attention kernel: one online-softmax pass over KV tiles, as in `online.run`.

One program owns BLOCK_M query rows of one (batch, head) and walks every KV tile:

    S   = (Q_codes K_codes^T) * q_scale[row] * k_scale[tile]        INT8 (or FP8) tensor cores
    m'  = max(m, rowmax S);  alpha = exp2(m - m')
    P   = E4M3(exp2(S - (m' - log2 P_SCALE)))      or ExpCast: byte = rne(S*8 + (120+beta-8m'))
    acc = alpha * acc + P V_codes                                    FP8 tensor cores
    acc += r * mean_tile                                             V-Smooth, Equation 6
    l   = alpha * l + r                           r: row sum of P (FP32, or decoded codes)
    O   = acc * v_scale[channel] / l                                 one epilogue

Constexpr switches select the method: QK_INT8 (sage2 / vc) or FP8 (fp8-fa4), EXPCAST,
VSMOOTH, V_PER_TILE (fp8-fa4's per-block V scale, applied per tile). Two implementation
switches, each an A/B measured in docs/perf.md:
  ROWSUM (ExpCast's row sum): 0 converts the bytes to FP32 and adds; 1 rebuilds the FP32 bits
    from the integer code with shifts (normal codes) and one multiply (subnormal codes); 2 has
    the tensor core add them (P times a tile of ones).
  MEAN_MMA (V-Smooth's rank-one term): 0 one FMA per accumulator element on the CUDA cores;
    1 a K=16 FP16 MMA of [r, 0...] by [mean; 0...], which rounds r to FP16.
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

MAGIC_ROUND = tl.constexpr(12582912.0)  # 1.5 * 2^23: adding it rounds a float in [0, 2^22) to an integer


@triton.jit
def _attention_fwd(Q, QS, K, KS, VT, VS, VM, Out, n_q, n_k, n_q_pad, n_k_pad, H,
                   stride_ob, stride_oh, stride_on, expcast_bias,
                   QK_INT8: tl.constexpr, Q_ROWS: tl.constexpr, EXPCAST: tl.constexpr,
                   ROWSUM: tl.constexpr, LOG2_P_SCALE: tl.constexpr, VSMOOTH: tl.constexpr,
                   V_PER_TILE: tl.constexpr, MEAN_MMA: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, D: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    n_tiles = n_k_pad // BLOCK_N

    # A query tile may be taller than the 128-row padding (BLOCK_M = 256): mask those rows.
    q_rows = offs_m < n_q_pad
    q = tl.load(Q + bh * n_q_pad * D + offs_m[:, None] * D + offs_d[None, :],
                mask=q_rows[:, None], other=0.0)
    q_scale = tl.load(QS + bh * (n_q_pad // Q_ROWS) + offs_m // Q_ROWS, mask=q_rows, other=0.0)
    k_ptrs = K + bh * n_k_pad * D + offs_n[:, None] * D + offs_d[None, :]
    vt_ptrs = VT + bh * D * n_k_pad + offs_d[:, None] * n_k_pad + offs_n[None, :]

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    for j in range(0, n_tiles):
        k = tl.load(k_ptrs)
        if QK_INT8:
            s = tl.dot(q, tl.trans(k), out_dtype=tl.int32).to(tl.float32)
        else:
            s = tl.dot(q, tl.trans(k))
        s = s * q_scale[:, None]
        s = s * tl.load(KS + bh * n_tiles + j)
        if (j + 1) * BLOCK_N > n_k:  # the tile holding padded keys
            s = tl.where((j * BLOCK_N + offs_n)[None, :] < n_k, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        if EXPCAST:
            t = s * 8.0 + (expcast_bias - m_new * 8.0)[:, None]
            t = tl.minimum(tl.maximum(t, 0.0), 120.0)
            code = (t + MAGIC_ROUND).to(tl.int32, bitcast=True) & 0xFF
            p = code.to(tl.uint8).to(tl.float8e4nv, bitcast=True)
            if ROWSUM == 0:
                r = tl.sum(p.to(tl.float32), 1)
            elif ROWSUM == 2:
                ones = tl.full([BLOCK_N, 16], 1.0, tl.float32).to(tl.float8e4nv)
                r = tl.max(tl.dot(p, ones), 1)
            else:
                normal = ((code + 960) << 20).to(tl.float32, bitcast=True)
                r = tl.sum(tl.where(code >= 8, normal, code.to(tl.float32) * 0.001953125), 1)
        else:
            # exp2(S - m + log2 P_SCALE): the P scale rides in the subtraction, no multiply.
            pf = tl.math.exp2(s - (m_new - LOG2_P_SCALE)[:, None])
            r = tl.sum(pf, 1)
            p = pf.to(tl.float8e4nv)
        vt = tl.load(vt_ptrs)
        if V_PER_TILE:
            acc = acc * alpha[:, None] + tl.dot(p, tl.trans(vt)) * tl.load(VS + bh * n_tiles + j)
        else:
            acc = acc * alpha[:, None]
            acc = tl.dot(p, tl.trans(vt), acc)
        if VSMOOTH:
            if MEAN_MMA:
                k16 = tl.arange(0, 16)
                r_col = tl.where(k16[None, :] == 0, r[:, None], 0.0).to(tl.float16)
                mu_row = tl.load(VM + (bh * n_tiles + j) * D + k16[:, None] * 0 + offs_d[None, :])
                mu_row = tl.where(k16[:, None] == 0, mu_row, 0.0).to(tl.float16)
                acc = tl.dot(r_col, mu_row, acc)
            else:
                mu = tl.load(VM + (bh * n_tiles + j) * D + offs_d).to(tl.float32)
                acc += r[:, None] * mu[None, :]
        l_i = l_i * alpha + r
        m_i = m_new
        k_ptrs += BLOCK_N * D
        vt_ptrs += BLOCK_N

    if not V_PER_TILE:
        acc = acc * tl.load(VS + bh * D + offs_d)[None, :]
    out = acc / l_i[:, None]
    o_ptrs = Out + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_on + offs_d[None, :]
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(offs_m < n_q)[:, None])


def launch(ops, out, *, qk_int8: bool, q_rows: int, expcast: bool, p_scale: float,
           vsmooth: bool, v_per_tile: bool, expcast_bias: float = 119.65, rowsum: int = 0,
           mean_mma: bool = True, block_m: int = 128, block_n: int = 128, num_warps: int = 8,
           num_stages: int = 3):
    """Run the kernel on prepared operands (`vcbench.kernels.gpu.GpuOperands`); out is
    (B, H, N, D) in the input's dtype, any strides with a unit last stride. The defaults are
    the fastest measured on the H200 at the Wan2.2 shape (docs/perf.md, 2026-11-30)."""
    b, h, n_q_pad, d = ops.q.shape
    grid = (triton.cdiv(ops.n, block_m), b * h)
    _attention_fwd[grid](
        ops.q, ops.q_scale, ops.k, ops.k_scale, ops.v_t, ops.v_scale,
        ops.v_mean if vsmooth else ops.v_scale, out,
        ops.n, ops.n, n_q_pad, ops.k.shape[2], h,
        out.stride(0), out.stride(1), out.stride(2), expcast_bias,
        QK_INT8=qk_int8, Q_ROWS=q_rows, EXPCAST=expcast, ROWSUM=rowsum,
        LOG2_P_SCALE=math.log2(p_scale),
        VSMOOTH=vsmooth, V_PER_TILE=v_per_tile, MEAN_MMA=mean_mma, BLOCK_M=block_m,
        BLOCK_N=block_n, D=d,
        num_warps=num_warps, num_stages=num_stages)
    return out
