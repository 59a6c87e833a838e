"""Fused preprocessing of the NVFP4 methods: E2M1 codes and E4M3 microscales, bit for bit.

What `vcbench.kernels.reference.engine.prepare` computes for a plan whose Q, K, V are NVFP4 (E2M1
under one E4M3 scale per 16 elements along the contraction axis, optionally under one FP32
scale per (batch, head)), written in the layout `nvfp4_attention.py` reads:

    Q, K codes   int8 (B*H, N_pad, D), twice the E2M1 value (integers -12..12, exact in FP16)
    Q, K scales  fp16 (B*H, N_pad, D / 16), the E4M3 microscale's value (E4M3 is a subset
                 of FP16, subnormals included, so the value is exact)
    V codes      int8 (B*H, N_pad, D), as Q and K; V scales fp16 (B*H, N_pad / 16, D): along
                 the tokens, the contraction axis of P V
    V means      fp16 (B*H, N_pad / block_n, D): V-Smooth's stored block means (unscaled)
    Q means      fp32 (B*H, N_pad / block_m, D): Q smoothing's block means, for the bias
    outer scales fp32 (B*H,): the two-level scale of an operand that has one

One byte per code, not two codes per byte: the attention kernel dequantizes to FP16 for a
16-bit MMA, so packing would only add an unpack. Roundings are done in integer and float
arithmetic with explicit ties-to-even (the magic-number add), never by a conversion, so the
codes do not depend on how a compiler lowers a cast; divisions are `div_rn`; block means are
summed in FP64, as the emulation sums them. A group holding a non-finite value has a NaN
microscale and zero codes (`quantize.abs_max`), as the emulation's. Both kernels are compiled
with `enable_fp_fusion=False`: the scale fold q * c followed by Q smoothing's subtraction
would otherwise become one FMA, rounded once where the emulation rounds twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from vcbench.kernels.backends.triton.quantize import abs_max
from vcbench.kernels.spec import granularity

MAGIC_ROUND = tl.constexpr(12582912.0)  # 1.5 * 2^23: (y + M) - M is y rounded half to even, |y| < 2^22
E4M3_BIAS_SHIFT = tl.constexpr(3)  # E4M3 has 3 mantissa bits: its quantum is 2^(exponent - 3)
E4M3_MIN_EXP = tl.constexpr(121)  # FP32 biased exponent of 2^-6, E4M3's smallest normal binade


@triton.jit
def rne(y):
    """y rounded to the nearest integer, ties to even (|y| < 2^22), as a float."""
    return (y + MAGIC_ROUND) - MAGIC_ROUND


@triton.jit
def round_e4m3_nonneg(x):
    """`formats.round_e4m3` for x >= 0: clamp to 448, then round to E4M3's grid, nearest even.
    The grid step in the binade of x is 2^(e - 3) (e its exponent, at least -6: below 2^-6 the
    subnormal step 2^-9 holds), so x times the power of two 2^(3 - e) is rounded to an integer
    and scaled back, both exactly."""
    x = tl.minimum(x, 448.0, propagate_nan=tl.PropagateNan.ALL)  # a NaN amax stays NaN
    e = tl.maximum((x.to(tl.int32, bitcast=True) >> 23) & 0xFF, E4M3_MIN_EXP)
    quantum = ((e - E4M3_BIAS_SHIFT) << 23).to(tl.float32, bitcast=True)
    inverse = ((254 - e + E4M3_BIAS_SHIFT) << 23).to(tl.float32, bitcast=True)
    return rne(x * inverse) * quantum


@triton.jit
def round_e2m1_twice(y):
    """`formats.round_e2m1` times 2, as a float holding an integer in -12..12: the grid has
    step 0.5 on [0, 2], 1 on [2, 4], 2 on [4, 6]; saturating at 6."""
    mag = tl.minimum(tl.abs(y), 6.0)
    v = tl.where(mag < 2.0, rne(mag * 2.0) * 0.5,
                 tl.where(mag < 4.0, rne(mag - 2.0) + 2.0, rne((mag - 4.0) * 0.5) * 2.0 + 4.0))
    return tl.where(y < 0, -2.0 * v, 2.0 * v)


@triton.jit
def microscale(amax):
    """The E4M3 microscale of a group whose (outer-divided) absolute max is amax:
    `formats.scale_for` (a multiply by the FP32 reciprocal of 6), rounded to E4M3."""
    return round_e4m3_nonneg(amax * (1.0 / 6.0))


@triton.jit
def codes_twice(x, full):
    """E2M1 codes (times 2) of x under the full scale `full` (microscale times any outer
    scale); a zero scale gives zero codes."""
    y = tl.math.div_rn(x, tl.where(full > 0, full, 1.0))
    return round_e2m1_twice(tl.where(full > 0, y, 0.0))


@triton.jit
def _microscales(amax, Outer, bh, OUTER: tl.constexpr):
    """(microscale, full scale) of groups whose absolute max is amax: with an outer scale per
    (batch, head) (attnqat-tf's two levels) the microscale is of amax / outer and the full
    scale their product, else both are the microscale."""
    if OUTER:
        outer = tl.load(Outer + bh)
        scale = microscale(tl.math.div_rn(amax, tl.zeros_like(amax) + outer))
        return scale, scale * outer
    scale = microscale(amax)
    return scale, scale


@triton.jit
def _quantize_qk(X, Perm, Mean, Outer, Codes, Scales, QMean, n, n_pad, stride_b, stride_h,
                 stride_n, H, multiplier, ROWS: tl.constexpr, D: tl.constexpr,
                 HAS_PERM: tl.constexpr, HAS_MEAN: tl.constexpr, MULTIPLY: tl.constexpr,
                 SMOOTH: tl.constexpr, OUTER: tl.constexpr):
    """Q or K, ROWS tokens of one (batch, head): optional gather by the permutation, scale
    fold, token-mean subtraction (K smoothing), block-mean subtraction (Q smoothing, the mean
    written out); microscales along D; codes. Loaded as (ROWS, D / 16, 16)."""
    block = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    rows = block * ROWS + tl.arange(0, ROWS)
    groups = tl.arange(0, D // 16)
    cols = groups[:, None] * 16 + tl.arange(0, 16)[None, :]  # (D / 16, 16)
    valid = rows < n
    src = rows.to(tl.int64)
    if HAS_PERM:
        src = tl.load(Perm + bh * n + rows, mask=valid, other=0).to(tl.int64)
    x = tl.load(X + b * stride_b + h * stride_h + src[:, None, None] * stride_n + cols[None],
                mask=valid[:, None, None], other=0.0).to(tl.float32)
    if MULTIPLY:
        x = x * multiplier
    if HAS_MEAN:
        x = tl.where(valid[:, None, None], x - tl.load(Mean + bh * D + cols)[None], 0.0)
    if SMOOTH:
        count = tl.minimum(n - block * ROWS, ROWS).to(tl.float64)
        mean = (tl.sum(x.to(tl.float64), 0) / count).to(tl.float32)
        tl.store(QMean + (bh * (n_pad // ROWS) + block) * D + cols, mean)
        x = tl.where(valid[:, None, None], x - mean[None], 0.0)
    scale, full = _microscales(abs_max(x, 2), Outer, bh, OUTER)  # (ROWS, D / 16)
    codes = codes_twice(x, full[:, :, None])
    r64 = rows.to(tl.int64)
    tl.store(Codes + bh * n_pad * D + r64[:, None, None] * D + cols[None], codes.to(tl.int8))
    tl.store(Scales + bh * n_pad * (D // 16) + r64[:, None] * (D // 16) + groups[None, :],
             scale.to(tl.float16))


@triton.jit
def _quantize_v(X, Perm, Outer, Codes, Scales, StoredMeans, n, n_pad, stride_b, stride_h,
                stride_n, H, ROWS: tl.constexpr, D: tl.constexpr, HAS_PERM: tl.constexpr,
                DEMEAN: tl.constexpr, OUTER: tl.constexpr):
    """V, one KV tile (ROWS tokens) of one (batch, head): optional gather by the permutation,
    V-Smooth's block mean (FP64 sum, stored FP16, the residual taken against the stored
    value); microscales along the tokens; codes. Loaded as (ROWS / 16, 16, D)."""
    tile = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    b = bh // H
    h = bh % H
    groups = tl.arange(0, ROWS // 16)
    rows = tile * ROWS + groups[:, None] * 16 + tl.arange(0, 16)[None, :]  # (ROWS / 16, 16)
    cols = tl.arange(0, D)
    valid = rows < n
    src = rows.to(tl.int64)
    if HAS_PERM:
        src = tl.load(Perm + bh * n + rows, mask=valid, other=0).to(tl.int64)
    x = tl.load(X + b * stride_b + h * stride_h + src[:, :, None] * stride_n + cols[None, None, :],
                mask=valid[:, :, None], other=0.0).to(tl.float32)
    if DEMEAN:
        count = tl.minimum(n - tile * ROWS, ROWS).to(tl.float64)
        mean = (tl.sum(tl.sum(x.to(tl.float64), 0), 0) / count).to(tl.float32)
        stored = tl.clamp(mean, -65504.0, 65504.0, propagate_nan=tl.PropagateNan.ALL)
        stored = stored.to(tl.float16)
        tl.store(StoredMeans + (bh * (n_pad // ROWS) + tile) * D + cols, stored)
        x = tl.where(valid[:, :, None], x - stored.to(tl.float32)[None, None, :], 0.0)
    scale, full = _microscales(abs_max(x, 1), Outer, bh, OUTER)  # (ROWS / 16, D)
    codes = codes_twice(x, full[:, None, :])
    r64 = rows.to(tl.int64)
    tl.store(Codes + bh * n_pad * D + r64[:, :, None] * D + cols[None, None, :],
             codes.to(tl.int8))
    scale_rows = (tile * (ROWS // 16) + groups).to(tl.int64)
    tl.store(Scales + bh * (n_pad // 16) * D + scale_rows[:, None] * D + cols[None, :],
             scale.to(tl.float16))


# --- the host side ------------------------------------------------------------------------

OUTER_DIVISOR = 448.0 * 6.0  # E4M3 max x E2M1 max: what a two-level scale divides the amax by


@dataclass
class Nvfp4Operands:
    """What `nvfp4_attention.launch` reads (layouts in the module docstring)."""

    q: torch.Tensor
    q_scale: torch.Tensor
    k: torch.Tensor
    k_scale: torch.Tensor
    v: torch.Tensor
    v_scale: torch.Tensor
    n: int
    block_m: int
    block_n: int
    q_outer: torch.Tensor | None = None
    k_outer: torch.Tensor | None = None
    v_outer: torch.Tensor | None = None
    v_mean: torch.Tensor | None = None
    # Q smoothing: the block means (as the emulation's q_mean), the vector each query block
    # dots with the smoothed keys (the means, or their Hadamard rotation: (q H) . k = q . (k H)
    # for the symmetric H), and what the bias reads of K: the 16-bit input (contiguous HND),
    # gathered through the permutation, minus its token mean.
    q_mean: torch.Tensor | None = None
    bias_q: torch.Tensor | None = None
    k_mean: torch.Tensor | None = None
    k_input: torch.Tensor | None = None
    perm: torch.Tensor | None = None
    permutation: torch.Tensor | None = None


def _outer(amax: torch.Tensor) -> torch.Tensor:
    """The two-level NVFP4 scale of `granularity.Quantizer`: amax / (448 * 6) (a true division,
    as the emulation's), 1 where the operand is all zero. (B, H) -> (B*H,) FP32."""
    outer = amax.float() / torch.tensor(OUTER_DIVISOR, dtype=torch.float32, device=amax.device)
    outer = torch.where(outer == 0, torch.ones_like(outer), outer)  # a NaN amax stays NaN
    return outer.reshape(-1).contiguous()


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def prepare(q, k, v, plan, *, permutation=None, grid=None, centroids=None, sm_scale=None
            ) -> Nvfp4Operands:
    """HND 16-bit (or FP32) inputs -> the NVFP4 operands of `plan`, bit-equal to
    `reference.engine.prepare` on the same tensors. The plan is one
    `operands.nvfp4_unsupported_reason` accepts."""
    from vcbench.kernels.backends.triton.kmeans import grouping
    from vcbench.kernels.reference.engine import softmax_scale_log2
    from vcbench.kernels.reference.vsmooth import token_mean
    from vcbench.kernels.spec.rotation import rotate

    b, h, n, d = q.shape
    bm, bn = plan.block_m, plan.block_n
    nq_pad, nk_pad = triton.cdiv(n, bm) * bm, triton.cdiv(n, bn) * bn
    dev = q.device
    scale_log2 = torch.tensor(softmax_scale_log2(d, sm_scale), dtype=torch.float32)

    if plan.vsmooth is not None and permutation is None:
        permutation = grouping(v, plan.vsmooth, grid=grid, init=centroids).permutation
    perm = None if permutation is None else permutation.to(dev, torch.int32).contiguous()

    def outer_of(x, quantizer, scale=None):
        if not quantizer.granularity.global_scale:
            return None
        amax = granularity.abs_max(x, (-2, -1)).float()
        # Rounded multiplication is monotone: max |x * c| = max |x| * c, bit for bit.
        return _outer(amax if scale is None else amax * scale.to(dev))

    def quantize_qk(x, quantizer, rows, n_pad, *, multiplier=None, mean=None, gather=None,
                    smooth=False, outer=None):
        codes = torch.empty(b * h, n_pad, d, device=dev, dtype=torch.int8)
        scales = torch.empty(b * h, n_pad, d // 16, device=dev, dtype=torch.float16)
        q_mean = (torch.empty(b * h, n_pad // rows, d, device=dev, dtype=torch.float32)
                  if smooth else None)
        x = _last_dim_contiguous(x)
        spare = scales  # any pointer, for the arguments a switch leaves unread
        _quantize_qk[(n_pad // rows, b * h)](
            x, gather if gather is not None else spare, mean if mean is not None else spare,
            outer if outer is not None else spare, codes, scales,
            q_mean if q_mean is not None else spare, n, n_pad, x.stride(0), x.stride(1),
            x.stride(2), h, float(multiplier) if multiplier is not None else 1.0, ROWS=rows, D=d,
            HAS_PERM=gather is not None, HAS_MEAN=mean is not None,
            MULTIPLY=multiplier is not None, SMOOTH=smooth, OUTER=outer is not None,
            enable_fp_fusion=False)
        return codes, scales, q_mean

    def token_mean_fp32(x):  # vsmooth.token_mean of x in FP32, without an FP32 or FP64 copy
        return (x.sum(dim=-2, dtype=torch.float64) / n).float().reshape(b * h, d).contiguous()

    k_mean = None
    if plan.hadamard_qk:  # rotations in torch, exactly as the emulation orders them
        qf = rotate(q.float() * scale_log2.to(dev))
        kf = k.float()
        if perm is not None:
            kf = torch.gather(kf, 2, perm.long()[..., None].expand_as(kf))
        kf = rotate(kf) - rotate(token_mean(kf)) if plan.smooth_k else rotate(kf)
        q_out, k_out = outer_of(qf, plan.q), outer_of(kf, plan.k)
        qc, qs, q_mean = quantize_qk(qf, plan.q, bm, nq_pad, smooth=plan.smooth_q, outer=q_out)
        kc, ks, _ = quantize_qk(kf, plan.k, bn, nk_pad, outer=k_out)
        del kf
        if plan.smooth_q:
            k_mean = token_mean_fp32(k) if plan.smooth_k else torch.zeros(b * h, d, device=dev)
    else:
        q_out, k_out = outer_of(q, plan.q, scale_log2), outer_of(k, plan.k)
        qc, qs, q_mean = quantize_qk(q, plan.q, bm, nq_pad, multiplier=scale_log2.item(),
                                     smooth=plan.smooth_q, outer=q_out)
        k = _last_dim_contiguous(k)
        if plan.smooth_k:
            k_mean = token_mean_fp32(k)
        kc, ks, _ = quantize_qk(k, plan.k, bn, nk_pad, mean=k_mean, gather=perm, outer=k_out)
        if plan.smooth_q and k_mean is None:
            k_mean = torch.zeros(b * h, d, device=dev)

    v = _last_dim_contiguous(v)
    v_out = outer_of(v, plan.v)
    vc = torch.empty(b * h, nk_pad, d, device=dev, dtype=torch.int8)
    vs = torch.empty(b * h, nk_pad // 16, d, device=dev, dtype=torch.float16)
    demean = plan.vsmooth is not None
    v_mean = torch.empty(b * h, nk_pad // bn, d, device=dev, dtype=torch.float16) if demean else None
    _quantize_v[(nk_pad // bn, b * h)](
        v, perm if perm is not None else vs, v_out if v_out is not None else vs, vc, vs,
        v_mean if v_mean is not None else vs, n, nk_pad, v.stride(0), v.stride(1), v.stride(2),
        h, ROWS=bn, D=d, HAS_PERM=perm is not None, DEMEAN=demean, OUTER=v_out is not None,
        enable_fp_fusion=False)

    # as engine.prepare: a (batch, head) with a NaN scale has NaN V scales (the microscales
    # of the PV product's operand, and the epilogue's outer scale where there is one)
    poison = granularity.nonfinite_poison((b, h), qs, q_out, ks, k_out, vs, v_out).reshape(-1)
    vs += poison.half()[:, None, None]
    if v_out is not None:
        v_out = v_out + poison

    bias_q = None
    if q_mean is not None:
        bias_q = rotate(q_mean) if plan.hadamard_qk else q_mean
    return Nvfp4Operands(
        q=qc, q_scale=qs, k=kc, k_scale=ks, v=vc, v_scale=vs, n=n, block_m=bm, block_n=bn,
        q_outer=q_out, k_outer=k_out, v_outer=v_out, v_mean=v_mean, q_mean=q_mean,
        bias_q=None if bias_q is None else bias_q.contiguous(), k_mean=k_mean,
        k_input=k.contiguous() if q_mean is not None else None, perm=perm,
        permutation=permutation)
