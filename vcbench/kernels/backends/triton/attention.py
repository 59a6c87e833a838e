"""The 8-bit attention kernel: one online-softmax pass over KV tiles, as in the emulation's
`reference.engine.run`.

One program owns BLOCK_M query rows of one (batch, head) and walks every KV tile:

    raw = Q_codes K_codes^T                       INT8 (or FP8) tensor cores; c = q_scale[row] * k_scale[tile]
    m'  = max(m, c * rowmax raw);  alpha = exp2(m - m')        the max taken on the raw (integer) scores
    P   = E4M3(exp2(raw*c + (log2 P_SCALE - m')))  or ExpCast: byte = rne(raw*8c + (120+beta-8m'))
    acc = alpha * acc + P V_codes                                    FP8 tensor cores
    acc += r * mean_tile                                             V-Smooth, Equation 6
    l   = alpha * l + r                           r: row sum of P (FP32, or decoded codes)
    O   = acc * v_scale[channel] / l                                 one epilogue

The score enters the exponent (or the ExpCast byte) through one FMA from the raw product;
the emulation rounds S = raw * q_scale * k_scale first. The two differ by about one FP32 ulp
of the score, so a P code can differ by one where the exponent sits on a rounding boundary,
which the GPU tests' output tolerance covers. Full KV tiles run unmasked; only the last tile,
which holds the padded keys, is masked.

Constexpr switches select the method: QK_INT8 (sage2 / vc) or FP8 (fp8-fa4, vc-8bit-fp8qk),
EXPCAST, VSMOOTH, V_PER_TILE (fp8-fa4's per-block V scale, applied per tile). How each piece is
computed, with the measured alternatives (docs/perf.md):
  INT8 scores to FP32: the bits of 1.5 * 2^23 added as an integer, the sum read as FP32, 1.5 *
    2^23 subtracted (exact for |raw| < 2^22, i.e. D <= 256): no I2F, a quarter-rate instruction
    on Hopper. Folding the subtraction into the FMA's constant would cancel ~0.75 ulp of
    2^23 * c and move the output by 4e-3, so it is not done.
  ExpCast's row sum: the bytes converted to FP32 and added (rebuilding the bits by shifts, or a
    tile of ones on the tensor core, were slower).
  PV: each tile's FP8 product in its own MMA accumulator, added to the FP32 one, as the
    emulation accumulates. One chained accumulator is 13% faster for vc-8bit but Hopper's FP8
    MMA truncates it at every step (13 mantissa bits): 4.7e-2 against 4.2e-2 error vs FP64 at
    N = 75600.
  V-Smooth's rank-one term: the row sums of 16 tiles (rescaled by alpha like the accumulator)
    and their means kept in registers, added by one K=16 FP16 MMA per 16 tiles (one FMA per
    element, or one MMA per tile, were slower).
"""

from __future__ import annotations

import math

import triton
import triton.language as tl

from vcbench.kernels.backends.triton.quantize import program

MAGIC_ROUND = tl.constexpr(12582912.0)  # 1.5 * 2^23: adding it rounds a float in [0, 2^22) to an integer
MAGIC_INT = tl.constexpr(0x4B400000)  # the bits of MAGIC_ROUND: int + MAGIC_INT, read as FP32, is MAGIC_ROUND + int


@triton.jit
def _kv_tile(acc, m_i, l_i, rbuf, mbuf, q, score_scale, K, VT, KS, VS, VM, bh, j, n_k,
             n_k_pad, n_tiles, expcast_bias, QK_INT8: tl.constexpr, EXPCAST: tl.constexpr,
             LOG2_P_SCALE: tl.constexpr, VSMOOTH: tl.constexpr, V_PER_TILE: tl.constexpr,
             MASK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             D: tl.constexpr):
    """One KV tile of the online softmax; MASK only for the tile that holds padded keys."""
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, D)
    key0 = tl.cast(j, tl.int64) * BLOCK_N  # K and VT are this (batch, head)'s; 64-bit past 2^31
    k = tl.load(K + key0 * D + offs_n[:, None] * D + offs_d[None, :])
    c = score_scale * tl.load(KS + bh * n_tiles + j)  # per row: S = raw * c
    keep = (j * BLOCK_N + offs_n)[None, :] < n_k
    if QK_INT8:
        raw = tl.dot(q, tl.trans(k), out_dtype=tl.int32)
        if MASK:
            row_max = tl.max(tl.where(keep, raw, -2147483647), 1).to(tl.float32)
        else:
            row_max = tl.max(raw, 1).to(tl.float32)  # an integer max, one convert per row
        # |raw| < 2^22: an integer add and an exact FP32 subtract, no I2F
        s = (raw + MAGIC_INT).to(tl.float32, bitcast=True) - MAGIC_ROUND
    else:
        s = tl.dot(q, tl.trans(k))
        row_max = tl.max(tl.where(keep, s, float("-inf")), 1) if MASK else tl.max(s, 1)
    m_new = tl.maximum(m_i, row_max * c)  # c > 0, so the max commutes with the scale
    alpha = tl.math.exp2(m_i - m_new)
    if EXPCAST:  # the code from the score in one FMA: S*8 + (120 + beta - 8m)
        t = s * (c * 8.0)[:, None] + (expcast_bias - m_new * 8.0)[:, None]
        if MASK:
            t = tl.where(keep, t, 0.0)
        # t <= 120 + beta < 120.5 by construction; below 0 the code underflows to 0.
        code = (tl.maximum(t, 0.0) + MAGIC_ROUND).to(tl.int32, bitcast=True) & 0xFF
        p = code.to(tl.uint8).to(tl.float8e4nv, bitcast=True)
        r = tl.sum(p.to(tl.float32), 1)
    else:
        # exp2(S - m + log2 P_SCALE) with S = s*c: one FMA, the P scale in the constant.
        x = s * c[:, None] + (LOG2_P_SCALE - m_new)[:, None]
        if MASK:
            x = tl.where(keep, x, float("-inf"))
        pf = tl.math.exp2(x)
        r = tl.sum(pf, 1)
        p = pf.to(tl.float8e4nv)
    vt = tl.load(VT + key0 + offs_d.to(tl.int64)[:, None] * n_k_pad + offs_n[None, :])
    if V_PER_TILE:
        acc = acc * alpha[:, None] + tl.dot(p, tl.trans(vt)) * tl.load(VS + bh * n_tiles + j)
    else:  # the tile's product on its own, then added in FP32
        acc = acc * alpha[:, None] + tl.dot(p, tl.trans(vt))
    if VSMOOTH:  # r and the mean into column / row j % 16; one MMA per 16 tiles
        k16 = tl.arange(0, 16)
        col = j % 16
        rbuf = tl.where(k16[None, :] == col, r[:, None], rbuf * alpha[:, None])
        mu = tl.load(VM + (bh * n_tiles + j) * D + offs_d)
        mbuf = tl.where(k16[:, None] == col, mu[None, :], mbuf)
        if col == 15:
            acc = tl.dot(rbuf.to(tl.float16), mbuf, acc)
            rbuf = tl.zeros_like(rbuf)
    l_i = l_i * alpha + r
    return acc, m_new, l_i, rbuf, mbuf


@triton.jit
def _attention_fwd(Q, QS, K, KS, VT, VS, VM, Out, n_q, n_k, n_q_pad, n_k_pad, H, m_blocks,
                   stride_ob, stride_oh, stride_on, expcast_bias,
                   QK_INT8: tl.constexpr, Q_ROWS: tl.constexpr, EXPCAST: tl.constexpr,
                   LOG2_P_SCALE: tl.constexpr, VSMOOTH: tl.constexpr, V_PER_TILE: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr):
    # A 1-D grid, query blocks fastest (the order of the 2-D grid it replaces, so a head's K
    # and V stay hot in L2); bh and the per-(batch, head) bases are 64-bit: an operand of a
    # Wan2.2 1080p call holds 3.5e9 elements.
    pid_m, bh = program(m_blocks)
    b = bh // H
    h = bh % H
    Q = Q + bh * n_q_pad * D
    K = K + bh * n_k_pad * D
    VT = VT + bh * D * n_k_pad
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, D)
    n_tiles = n_k_pad // BLOCK_N
    n_full = n_k // BLOCK_N

    # A query tile may be taller than the 128-row padding (BLOCK_M = 256): mask those rows.
    q_rows = offs_m < n_q_pad
    q = tl.load(Q + offs_m.to(tl.int64)[:, None] * D + offs_d[None, :],
                mask=q_rows[:, None], other=0.0)
    q_scale = tl.load(QS + bh * (n_q_pad // Q_ROWS) + offs_m // Q_ROWS, mask=q_rows, other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D], tl.float32)
    rbuf = tl.zeros([BLOCK_M, 16], tl.float32)  # V-Smooth: pending row sums, rescaled
    mbuf = tl.zeros([16, D], tl.float16)  # ... and the means they multiply
    # Full tiles without a mask; the tile that holds padded keys (if any) after them.
    for j in range(0, n_full):
        acc, m_i, l_i, rbuf, mbuf = _kv_tile(
            acc, m_i, l_i, rbuf, mbuf, q, q_scale, K, VT, KS, VS, VM, bh, j, n_k, n_k_pad,
            n_tiles, expcast_bias, QK_INT8, EXPCAST, LOG2_P_SCALE, VSMOOTH, V_PER_TILE, False,
            BLOCK_M, BLOCK_N, D)
    if n_full < n_tiles:
        acc, m_i, l_i, rbuf, mbuf = _kv_tile(
            acc, m_i, l_i, rbuf, mbuf, q, q_scale, K, VT, KS, VS, VM, bh, n_full, n_k, n_k_pad,
            n_tiles, expcast_bias, QK_INT8, EXPCAST, LOG2_P_SCALE, VSMOOTH, V_PER_TILE, True,
            BLOCK_M, BLOCK_N, D)

    if VSMOOTH:  # what the last, incomplete group of 16 tiles left
        acc = tl.dot(rbuf.to(tl.float16), mbuf, acc)
    if not V_PER_TILE:
        acc = acc * tl.load(VS + bh * D + offs_d)[None, :]
    out = acc / l_i[:, None]
    o_ptrs = (Out + b * stride_ob + h * stride_oh + offs_m.to(tl.int64)[:, None] * stride_on
              + offs_d[None, :])
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=(offs_m < n_q)[:, None])


def launch(ops, out, *, qk_int8: bool, q_rows: int, expcast: bool, p_scale: float,
           vsmooth: bool, v_per_tile: bool, expcast_bias: float = 119.65, block_m: int = 128,
           block_n: int = 128, num_warps: int = 8, num_stages: int = 3):
    """Run the kernel on prepared operands (`operands.GpuOperands`); out is
    (B, H, N, D) in the input's dtype, any strides with a unit last stride. The launch
    configuration's defaults are the fastest measured on the H200 at the Wan2.2 shape
    (benchmarks/timing/sweep_triton.py)."""
    b, h, n_q_pad, d = ops.q.shape
    m_blocks = triton.cdiv(ops.n, block_m)
    _attention_fwd[(m_blocks * b * h,)](
        ops.q, ops.q_scale, ops.k, ops.k_scale, ops.v_t, ops.v_scale,
        ops.v_mean if vsmooth else ops.v_scale, out,
        ops.n, ops.n, n_q_pad, ops.k.shape[2], h, m_blocks,
        out.stride(0), out.stride(1), out.stride(2), expcast_bias,
        QK_INT8=qk_int8, Q_ROWS=q_rows, EXPCAST=expcast, LOG2_P_SCALE=math.log2(p_scale),
        VSMOOTH=vsmooth, V_PER_TILE=v_per_tile, BLOCK_M=block_m, BLOCK_N=block_n, D=d,
        num_warps=num_warps, num_stages=num_stages)
    return out
