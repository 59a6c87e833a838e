"""The Triton kernels' operands: which plans the 8-bit attention kernel computes, and the fused
preprocessing that quantizes Q, K and V for it (and for the compiled sm90 kernel); which plans
and shapes the NVFP4 kernels take (their preprocessing is nvfp4.py). No Triton import here:
a machine without it still reads every backend's reasons.

A plan runs here when it is one the kernel implements: 8-bit Q/K in INT8 or E4M3, E4M3 V per
channel or per KV tile, P by exp-then-cast to E4M3 or by ExpCast, optional V-Smooth, 128x128
tiles, FP32 accumulation. The plan decides the kernel's switches (`kernel_switches`), so the
emulation and the kernel read one declaration.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vcbench.errors import UserError
from vcbench.kernels.backends.common import MAX_GRID_Y, TILE
from vcbench.kernels.reference.engine import softmax_scale_log2
from vcbench.kernels.spec.formats import E2M1, E4M3, INT8, scale_for
from vcbench.kernels.spec.granularity import Microscale16, PerBlock, PerChannel, nonfinite_poison
from vcbench.kernels.spec.method import Plan
from vcbench.kernels.spec.probability import ExpCast, ExpThenCast, NVFP4Probability
from vcbench.kernels.spec.rotation import rotate

# The GPU kernels never clamp ExpCast's code at 120: the row maximum's t = 120 + beta plus the
# rounding of m (a few ulps of 8m) stays below 120.5 when beta <= 0.25, even at |m| ~ 2^16.
# (The compiled kernel's byte packing also relies on codes below 256.)
EXPCAST_BETA_MAX = 0.25


def unsupported_reason(plan: Plan, shape: tuple[int, ...] | None = None) -> str | None:
    """Why the 8-bit Triton kernel cannot run this plan, or None if it can (any shape the
    emulation takes: 64-bit offsets, 1-D grids)."""
    if plan.q.fmt not in (INT8, E4M3) or plan.k.fmt is not plan.q.fmt:
        return "Q/K must be INT8 or E4M3"
    if not isinstance(plan.k.granularity, PerBlock) or plan.k.granularity.rows != TILE:
        return "K needs one scale per 128-token block"
    if not isinstance(plan.q.granularity, PerBlock):
        return "Q needs per-block or per-warp scales"
    if plan.v.fmt is not E4M3 or not isinstance(plan.v.granularity, (PerChannel, PerBlock)):
        return "V must be E4M3 per channel or per block"
    if not isinstance(plan.p, (ExpCast, ExpThenCast)) or (
            isinstance(plan.p, ExpThenCast) and plan.p.fmt is not E4M3):
        return "P must be E4M3"
    if isinstance(plan.p, ExpCast) and not plan.p.beta <= EXPCAST_BETA_MAX:
        return (f"ExpCast's beta must be at most {EXPCAST_BETA_MAX:g} on the GPU kernels (they "
                "reach the emulation's clip at code 120 by t <= 120 + beta, not by a clamp)")
    if plan.accum != "fp32":
        return "only FP32 accumulation"
    if plan.smooth_q or plan.block_m != TILE or plan.block_n != TILE:
        return "only 128x128 tiles without Q smoothing"
    if plan.vsmooth is not None and plan.vsmooth.hadamard_v:
        return "hadamard_v is an emulation-only ablation"
    return None


@dataclass
class GpuOperands:
    """What the attention kernel reads: codes, scales and block means, HND, N padded."""

    q: torch.Tensor
    q_scale: torch.Tensor
    k: torch.Tensor
    k_scale: torch.Tensor
    v_t: torch.Tensor  # (B, H, D, N_pad): transposed, as the FP8 PV product wants it
    v_scale: torch.Tensor  # per channel (B, H, D) or per block (B, H, N_pad / 128)
    v_mean: torch.Tensor | None
    n: int
    permutation: torch.Tensor | None = None
    # v_mean as the compiled kernel reads it (compiled.blocked_means), written by the sm90
    # backend's preprocessing, so it is timed as preprocessing
    v_mean_blocked: torch.Tensor | None = None


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def prepare_gpu(q, k, v, plan: Plan, *, permutation=None, grid=None, centroids=None,
                sm_scale=None, rope=None) -> GpuOperands:
    """The fused preprocessing: HND 16-bit inputs -> quantized operands. With `rope`
    (spec.rope.Rope, FP32 tables), q and k come before RoPE and the Q and K quantizers (and
    K's token mean) rotate them on load."""
    from vcbench.kernels.backends.triton import quantize as tq

    reason = unsupported_reason(plan)
    if reason:
        raise UserError(f"no GPU kernel for this configuration: {reason}")
    b, h, n, d = q.shape
    n_pad = -(-n // TILE) * TILE
    scale_log2 = softmax_scale_log2(d, sm_scale)
    fmt = tq.FMT_INT8 if plan.q.fmt is INT8 else tq.FMT_E4M3
    code_dtype = torch.int8 if plan.q.fmt is INT8 else torch.float8_e4m3fn
    dev = q.device

    if plan.vsmooth is not None and permutation is None:
        from vcbench.kernels.backends.triton.kmeans import grouping

        permutation = grouping(v, plan.vsmooth, grid=grid, init=centroids).permutation
    perm = None if permutation is None else permutation.to(dev, torch.int32).contiguous()

    rotated = plan.hadamard_qk
    norm = tq.hadamard_norm(d) if rotated else 1.0
    cos, sin, rope_switch = tq.rope_args(rope, q)

    def rows(x, rows_per_scale, mean=None, multiplier=None, gather=None):
        out = torch.empty(b, h, n_pad, d, device=dev, dtype=code_dtype)
        scale = torch.empty(b, h, n_pad // rows_per_scale, device=dev, dtype=torch.float32)
        x = _last_dim_contiguous(x)
        tq._quantize_rows[(n_pad // rows_per_scale * b * h,)](
            x, gather if gather is not None else scale, mean if mean is not None else scale,
            out, scale, n, n_pad, x.stride(0), x.stride(1), x.stride(2), h,
            multiplier if multiplier is not None else 1.0, norm, ROWS=rows_per_scale, D=d,
            FMT=fmt, HAS_PERM=gather is not None, HAS_MEAN=mean is not None,
            MULTIPLY=multiplier is not None, HADAMARD=rotated, LOG2_D=d.bit_length() - 1,
            Cos=cos, Sin=sin, ROPE=rope_switch,
            num_warps=quantize_warps(rows_per_scale, d, rotated or rope is not None))
        return out, scale

    # RoPE and the QK Hadamard run inside the quantizers (spec.rope's FP32 ops, then
    # spec.rotation's butterfly); K's mean is taken from K after RoPE, before the Hadamard,
    # and rotated once per head, then subtracted from the rotated rows, the emulation's (and
    # the paper's) order.
    qc, qs = rows(q, plan.q.granularity.rows, multiplier=scale_log2)
    k = _last_dim_contiguous(k)
    mean = tq.token_mean_gpu(k, (cos, sin, rope_switch)) if plan.smooth_k else None
    if mean is not None and rotated:
        mean = rotate(mean).contiguous()
    kc, ks = rows(k, TILE, mean=mean, gather=perm)

    v = _last_dim_contiguous(v)
    n_blocks = n_pad // TILE
    v_t = torch.empty(b, h, d, n_pad, device=dev, dtype=torch.float8_e4m3fn)
    demean = plan.vsmooth is not None
    per_block = isinstance(plan.v.granularity, PerBlock)
    means = stored = None
    if per_block:
        v_scale = torch.empty(b, h, n_blocks, device=dev, dtype=torch.float32)
    else:
        means = torch.empty(b, h, n_blocks, d, device=dev, dtype=torch.float32)
        block_amax = torch.empty(b, h, n_blocks, d, device=dev, dtype=torch.float32)
        tq._v_block_stats[(n_blocks * b * h,)](
            v, perm if perm is not None else block_amax, means, block_amax, n, n_blocks,
            v.stride(0), v.stride(1), v.stride(2), h, ROWS=TILE, D=d,
            HAS_PERM=perm is not None, DEMEAN=demean)
        v_scale = scale_for(block_amax.amax(2), E4M3.max)
        if demean:  # as vsmooth.demean_and_quantize: zero-residual channels keep scale 1
            v_scale = torch.where(v_scale == 0, torch.ones_like(v_scale), v_scale)
            stored = torch.empty(b, h, n_blocks, d, device=dev, dtype=torch.float16)
    tq._quantize_v[(n_blocks * b * h,)](
        v, perm if perm is not None else v_scale, means if means is not None else v_scale,
        v_scale, v_t, stored if stored is not None else v_scale, n, n_pad,
        v.stride(0), v.stride(1), v.stride(2), h, ROWS=TILE, D=d,
        HAS_PERM=perm is not None, DEMEAN=demean, PER_BLOCK=per_block)
    # as engine.prepare: a (batch, head) with a NaN scale has NaN V scales, which both
    # kernels multiply their output by (the epilogue, or each tile's product)
    poison = nonfinite_poison((b, h), qs, ks, v_scale)
    v_scale = v_scale + poison[..., None]
    return GpuOperands(qc, qs, kc, ks, v_t, v_scale, stored, n, permutation)


def quantize_warps(rows: int, d: int, rotating: bool) -> int:
    """Warps of the Q/K quantizer over one scale's `rows` x `d` tile: 4, or 8 where the QK
    Hadamard or RoPE keeps temporaries beside more than 64 elements a thread (a 128-row K tile
    on 4 warps spills with both, sm_90; tests/test_nvfp4_compile.py)."""
    return 8 if rotating and rows * d > 64 * 128 else 4


def kernel_switches(plan: Plan) -> dict:
    expcast = isinstance(plan.p, ExpCast)
    return dict(qk_int8=plan.q.fmt is INT8, q_rows=plan.q.granularity.rows, expcast=expcast,
                p_scale=float(plan.p.scale), vsmooth=plan.vsmooth is not None,
                v_per_tile=isinstance(plan.v.granularity, PerBlock),
                expcast_bias=120.0 + (plan.p.beta if expcast else 0.0))


# ---- which plans and shapes the NVFP4 kernels take (nvfp4.py, nvfp4_attention.py) -----------



def nvfp4_plan_reason(plan: Plan) -> str | None:
    """Why the NVFP4 kernel cannot run this plan, or None if it can."""
    operands = (plan.q, plan.k, plan.v)
    if any(x.fmt is not E2M1 or not isinstance(x.granularity, Microscale16)
           or x.granularity.size != 16 for x in operands):
        return "Q, K, V must be NVFP4 (E2M1 under per-16 E4M3 microscales)"
    if (plan.q.granularity.axis, plan.k.granularity.axis, plan.v.granularity.axis) != (-1, -1, -2):
        return "microscales must run along the contraction axes (head dim for Q and K, tokens for V)"
    if not isinstance(plan.p, NVFP4Probability):
        return "P must be NVFP4"
    q_outer, k_outer = plan.q.granularity.global_scale, plan.k.granularity.global_scale
    if q_outer != k_outer:
        return "Q and K take a per-tensor scale together or not at all"
    if q_outer and (plan.smooth_q or plan.smooth_k):
        return "a per-tensor Q/K scale only on unsmoothed Q and K"
    if plan.v.granularity.global_scale and plan.vsmooth is not None:
        return "a per-tensor V scale only without V-Smooth"
    if not plan.fold_scale_into_q:
        return "the softmax scale must be folded into Q"
    if plan.accum != "fp32":
        return "only FP32 accumulation"
    if plan.vsmooth is not None and plan.vsmooth.hadamard_v:
        return "hadamard_v is an emulation-only ablation"
    if plan.vsmooth is not None and plan.vsmooth.block_rows != plan.block_n:
        return "V-Smooth blocks must be the KV tile"
    return None


def nvfp4_shape_reason(shape: tuple[int, ...]) -> str | None:
    """Why the NVFP4 kernel cannot take inputs of this (B, H, N, D) shape, or None."""
    b, h, n, d = shape
    if b * h > MAX_GRID_Y:
        return f"batch x heads = {b * h} is above the kernel grid's {MAX_GRID_Y}"
    if d % 16:
        return f"head dim {d} is not a whole number of 16-element microscale groups"
    n_pad = -(-n // TILE) * TILE
    if n_pad * d >= 2**31:  # the kernel's offsets inside one head are 32-bit
        return f"N x D = {n_pad} x {d} is 2^31 elements or more per head"
    return None


def nvfp4_unsupported_reason(plan: Plan, shape: tuple[int, ...] | None = None) -> str | None:
    """Why the NVFP4 kernels cannot run `plan` (on (B, H, N, D) inputs of `shape`), or None."""
    return nvfp4_plan_reason(plan) or (nvfp4_shape_reason(shape) if shape is not None else None)
