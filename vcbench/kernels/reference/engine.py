"""The tiled online-softmax engine every emulation runs through (paper Equation 1 and 6).

`prepare` does what the fused preprocessing kernels do (RoPE, scale folding, K/Q smoothing, the
V-Smooth gather and block demeaning, Hadamard rotations, padding, quantization, a non-finite
input's NaN carried into V's scales) and returns the quantized operands. `run` then walks
the key/value tiles exactly as a FlashAttention kernel does: all query rows at once (rows are
independent), one KV tile at a time, P quantized per tile against the *running* row max, the
block mean restored from the row sum in the same accumulator, one epilogue multiply and
divide at the end.

Arithmetic is FP32 (FP64 when the inputs are FP64, so identities can be checked exactly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from vcbench.errors import UserError
from vcbench.kernels.reference.vsmooth import (
    block_means,
    demean_and_quantize,
    group,
    permute_tokens,
    token_mean,
    zero_rows,
)
from vcbench.kernels.spec.formats import round_fp22
from vcbench.kernels.spec.granularity import (
    Microscale16,
    PerBlock,
    Quantized,
    Unscaled,
    nonfinite_poison,
)
from vcbench.kernels.spec.method import SUPPORTED_HEAD_DIMS, Plan
from vcbench.kernels.spec.rope import Rope, apply_rope
from vcbench.kernels.spec.rotation import hadamard, rotate

LOG2E = 1.0 / math.log(2.0)


@dataclass
class Operands:
    """Quantized operands as the attention kernel reads them (HND, N padded to the tiles).

    v_mean: block means of the permuted V (B, H, Nk/block_n, D), already divided by the V
        epilogue scale (8 bits) or unscaled (4 bits), rounded to FP16: what the V kernel writes.
    q_mean: SageAttention's Q-smoothing means (B, H, Nq/block_m, D), log2 units; with
        `k_smooth`, the (smoothed, rotated, padded, unquantized) K (B, H, Nk, D), they give the
        term mean_q . K^T that `run` adds back to the scores, one KV tile at a time (a kernel
        never holds it for all keys: at N = 75600 it would be N^2 / block_m per head).
    v_exact: the unquantized V the kernel's V operand stands for (permuted, rotated), kept only
        to split the output error into its probability and value terms (Equation 2).
    """

    q: Quantized
    k: Quantized
    v: Quantized
    n_tokens: int
    sm_scale_log2: float
    v_mean: torch.Tensor | None = None
    q_mean: torch.Tensor | None = None
    k_smooth: torch.Tensor | None = None
    v_exact: torch.Tensor | None = None
    permutation: torch.Tensor | None = None


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise UserError(f"q, k, v must be 4-D (B, H, N, D); got {tuple(q.shape)}, "
                        f"{tuple(k.shape)}, {tuple(v.shape)}")
    if not (q.shape == k.shape == v.shape):
        raise UserError(f"self-attention needs q, k, v of one shape; got {tuple(q.shape)}, "
                        f"{tuple(k.shape)}, {tuple(v.shape)}")
    d = q.shape[-1]
    if d not in SUPPORTED_HEAD_DIMS:
        raise UserError(f"head dim {d} is not supported (supported: "
                        f"{', '.join(map(str, SUPPORTED_HEAD_DIMS))})")
    if q.shape[-2] < 1:
        raise UserError("empty sequence")
    if not (q.is_floating_point() and k.is_floating_point() and v.is_floating_point()):
        raise UserError("q, k, v must be floating point")


def softmax_scale_log2(head_dim: int, sm_scale: float | None = None) -> float:
    """softmax_scale * log2(e): what turns Q K^T into log2-domain scores."""
    return (1.0 / math.sqrt(head_dim) if sm_scale is None else float(sm_scale)) * LOG2E


def pad_tokens(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """Zero rows appended so the token count is a multiple of `multiple`."""
    pad = -x.shape[-2] % multiple
    return torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x


def prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan, *,
            permutation: torch.Tensor | None = None, grid: Any = None,
            centroids: torch.Tensor | None = None, sm_scale: float | None = None,
            rope: Rope | None = None, keep_exact_v: bool = False) -> Operands:
    """HND inputs -> quantized operands, as the fused preprocessing kernels produce them.
    `rope`: Q and K are given before RoPE, which is applied first, in their dtype, exactly as
    the pipeline applies it eagerly (spec.rope)."""
    check_inputs(q, k, v)
    if rope is not None:
        q, k = apply_rope(q, rope), apply_rope(k, rope)
    dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    n, d = q.shape[-2], q.shape[-1]
    scale_log2 = softmax_scale_log2(d, sm_scale)
    if plan.fold_scale_into_q:  # one FP32 multiply, as the Q quantization kernel does it
        q = q * torch.tensor(scale_log2, dtype=dtype, device=q.device)

    if plan.vsmooth is not None:
        if permutation is None:
            permutation = group(v, plan.vsmooth, grid=grid, init=centroids).permutation
        elif permutation.shape != v.shape[:-1]:
            raise UserError(f"permutation must have shape {tuple(v.shape[:-1])}, got "
                            f"{tuple(permutation.shape)}")
        permutation = permutation.to(device=v.device, dtype=torch.long)
        k, v = permute_tokens(k, permutation), permute_tokens(v, permutation)
    elif permutation is not None:
        raise UserError("a permutation was given to a method without V-Smooth")

    # K's token mean: softmax is invariant to it, the quantizer is not. The fused kernel's
    # order (paper, appendix B): the statistic from the unrotated K, then the rotation, then
    # the subtraction of the rotated mean (equal to rotating K - mean in exact arithmetic).
    # Q smoothing's block means (SageAttention3's) take the same order: from the unrotated Q,
    # rotated once a block, so a quantizer rotates each Q row once per pass, not once more
    # for its mean.
    k_mean = token_mean(k) if plan.smooth_k else None
    q = pad_tokens(q, plan.block_m)  # zero rows: the rotation keeps them zero
    q_mean = block_means(q, plan.block_m, n) if plan.smooth_q else None
    if plan.hadamard_qk:
        q, k = rotate(q), rotate(k)
        k_mean = None if k_mean is None else rotate(k_mean)
        q_mean = None if q_mean is None else rotate(q_mean)
    if k_mean is not None:
        k = k - k_mean
    if plan.vsmooth is not None and plan.vsmooth.hadamard_v:
        v = rotate(v)

    k = pad_tokens(k, plan.block_n)
    v = pad_tokens(v, plan.block_n)

    if q_mean is not None:
        q = zero_rows(q - q_mean.repeat_interleave(plan.block_m, dim=-2), n)

    v_mean = None
    if plan.vsmooth is not None:
        if plan.vsmooth.block_rows != plan.block_n:
            raise UserError(f"V-Smooth blocks ({plan.vsmooth.block_rows} rows) must be the KV "
                            f"tile ({plan.block_n})")
        vq, v_mean = demean_and_quantize(v, plan.v, plan.vsmooth.block_rows, n)
    else:
        vq = plan.v(v)

    qq, kq = plan.q(q), plan.k(k)
    # A non-finite value of a (batch, head) left a NaN scale; V's scales, which every kernel's
    # output is multiplied by, carry it (granularity.nonfinite_poison).
    poison = nonfinite_poison(q.shape[:2], qq.scale, qq.outer, kq.scale, kq.outer, vq.scale,
                              vq.outer)
    return Operands(q=qq, k=kq, v=vq.poisoned(poison), n_tokens=n,
                    sm_scale_log2=1.0 if plan.fold_scale_into_q else scale_log2,
                    v_mean=v_mean, q_mean=q_mean, k_smooth=k if q_mean is not None else None,
                    v_exact=v if keep_exact_v else None, permutation=permutation)


def _row_scale(x: Quantized) -> torch.Tensor | float:
    """The part of a Q/K scale that factors out of the QK product, per token: (B, H, N, 1)."""
    g = x.granularity
    if isinstance(g, Microscale16):
        return 1.0 if x.outer is None else x.outer[..., None, None]
    if isinstance(g, Unscaled):
        return 1.0
    return g.expand(x.scale)  # PerTensor / PerBlock / PerWarp: broadcast over tokens


def score_bias_tile(ops: Operands, cols: slice, block_m: int) -> torch.Tensor:
    """Q smoothing's term mean_q . K^T for the keys `cols` only, one row per query row:
    (B, H, Nq, len(cols)). Taken per KV tile, as a kernel takes it, so the emulation never
    holds a tensor with two sequence axes."""
    bias = ops.q_mean @ ops.k_smooth[..., cols, :].transpose(-1, -2)
    return bias.repeat_interleave(block_m, dim=-2)


def run(ops: Operands, plan: Plan) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The online softmax over KV tiles. Returns (O, O_mixed), (B, H, Nq_padded, D).

    O_mixed = P_q V_exact / l (the quantized probabilities against the exact values) is
    computed only when `ops.v_exact` is set: O - O_mixed is the value term of Equation 2.
    """
    bn = plan.block_n
    qi, ki, vi = ops.q.inner(), ops.k.inner(), ops.v.inner()
    q_row = _row_scale(ops.q)
    k_col = _row_scale(ops.k)
    k_col = k_col.transpose(-1, -2) if isinstance(k_col, torch.Tensor) else k_col
    v_tile = ops.v.scale if isinstance(ops.v.granularity, PerBlock) else None
    if v_tile is not None and ops.v.granularity.rows != bn:
        raise UserError(f"per-block V scales must cover one KV tile ({bn} rows)")
    v_epi = ops.v.epilogue_scale()

    shape = (*qi.shape[:-1], 1)
    m = torch.full(shape, -math.inf, dtype=qi.dtype, device=qi.device)
    normalizer = torch.zeros(shape, dtype=qi.dtype, device=qi.device)
    acc = torch.zeros(qi.shape[:-1] + (vi.shape[-1],), dtype=qi.dtype, device=qi.device)
    acc_mixed = torch.zeros_like(acc) if ops.v_exact is not None else None

    for j in range(ki.shape[-2] // bn):
        cols = slice(j * bn, (j + 1) * bn)
        s = qi @ ki[..., cols, :].transpose(-1, -2)
        s = s * q_row
        per_key = isinstance(k_col, torch.Tensor) and k_col.shape[-1] > 1
        s = s * (k_col[..., cols] if per_key else k_col)
        if ops.sm_scale_log2 != 1.0:
            s = s * ops.sm_scale_log2
        if ops.q_mean is not None:
            s = s + score_bias_tile(ops, cols, plan.block_m)
        n_real = ops.n_tokens - j * bn
        if n_real < bn:  # padded keys take no probability
            s[..., n_real:] = -math.inf
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        alpha = torch.exp2(m - m_new)
        p_inner, p_row, r = plan.p.encode(s, m_new)

        pv = p_inner @ vi[..., cols, :]
        if plan.accum == "fp22":
            pv = round_fp22(pv)
        if p_row is not None:
            pv = pv * p_row
        if v_tile is not None:
            pv = pv * v_tile[..., j, None, None]
        acc = acc * alpha + pv
        if ops.v_mean is not None:  # Equation 6: the rank-one mean term, same accumulator
            acc = acc + r * ops.v_mean[..., j, None, :]
        if acc_mixed is not None:
            p_deq = p_inner if p_row is None else p_inner * p_row
            acc_mixed = acc_mixed * alpha + p_deq @ ops.v_exact[..., cols, :]
        normalizer = normalizer * alpha + r
        m = m_new

    out = acc if v_epi is None else acc * v_epi
    out = out / normalizer
    mixed = acc_mixed / normalizer if acc_mixed is not None else None
    return out, mixed


def finish(out: torch.Tensor, n: int, plan: Plan) -> torch.Tensor:
    """Drop padded query rows and undo the V rotation of the Hadamard-V ablation."""
    out = out[..., :n, :]
    if plan.vsmooth is not None and plan.vsmooth.hadamard_v:
        out = out @ hadamard(out.shape[-1], out.dtype, out.device).T
    return out


def emulate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan, **call) -> torch.Tensor:
    """HND in, HND out, in the input dtype."""
    ops = prepare(q, k, v, plan, **call)
    out, _ = run(ops, plan)
    return finish(out, q.shape[-2], plan).to(q.dtype)
