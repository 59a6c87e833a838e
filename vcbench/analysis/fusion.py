"""Figure 7: the preprocessing chain of one V-Smooth attention call, fused one stage at a time.

Every rung computes the same thing from the same inputs (Q and K before RoPE, V, Wan's RoPE
tables): the token order (k-means on V), RoPE on Q and K, K's token mean, V's block means,
the gather by pi, the QK Hadamard, and the quantizers, ending in the codes, scales and block
means the attention kernel reads. What differs is which passes are separate kernels writing
full tensors back to memory:

    1 eager        every pass a PyTorch op (the emulation's `prepare` run on the GPU, RoPE and
                   torch's k-means before it)
    2 quantizers   the Q, K and V quantizers and the Hadamard in vcbench's fused kernels; RoPE,
                   the gather, K's mean and V's block means (with the residual's amax that
                   sets V's scale) still eager
    3 + means      the gather and both means fused too (`prepare_gpu`); RoPE eager
    4 + RoPE       RoPE inside the Q and K quantizers and K's token sums (`prepare_gpu` given
                   the tables: Q and K read once, before RoPE)
    5 final        vcbench's final kernels: rung 4's and the Triton k-means grouping

Each rung's time is the CUPTI GPU time of all its kernels per call (`time_kernels`); the
factor is against the rung before it and, cumulatively, against rung 1. Rungs 1-4 group with
torch's k-means; the grouping is a pass of the chain like the others (Figure 7's last rung
hand-writes it). The operands of every rung are equal (tests/test_fusion.py): the ladder
times one computation.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch

from vcbench.errors import UserError
from vcbench.kernels import get_method
from vcbench.kernels.spec.method import Plan
from vcbench.kernels.spec.rope import Rope, apply_rope, rope_tables

METHOD = "vc-8bit-vsmooth"  # Figure 7's V-Smooth call (its preprocessing is vc-8bit's too)
RUNGS = [("eager", "every pass eager (RoPE, means, gather, Hadamard, quantizers)"),
         ("quantizers", "quantizers and Hadamard fused"),
         ("means", "+ K mean, V block means and the gather"),
         ("rope", "+ RoPE"),
         ("final", "vcbench's final kernels, incl. the grouping")]


@dataclass
class CallInputs:
    """One attention call before RoPE: HND q, k, v and the RoPE tables (N, D)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Wan's rotary embedding (diffusers' WanAttnProcessor, spec.rope) on HND x, eagerly."""
    return apply_rope(x, Rope(cos, sin))


def call_inputs(shape: tuple[int, int, int, int], device, seed: int = 0,
                dtype=torch.bfloat16) -> CallInputs:
    b, h, n, d = shape
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, device=device, generator=g).to(dtype) for _ in range(3))
    cos, sin = rope_tables(n, d, device)
    return CallInputs(q, k, v, cos, sin)


def plan() -> Plan:
    return get_method(METHOD).plan()


def _torch_group(v, p: Plan):
    from vcbench.kernels.reference.vsmooth import group

    return group(v, p.vsmooth).permutation


def _gpu_group(v, p: Plan):
    from vcbench.kernels import group

    return group(v, p.vsmooth).permutation


def operands_eager(x: CallInputs, p: Plan, permutation: torch.Tensor) -> dict:
    """Rung 1: every pass a PyTorch op."""
    from vcbench.kernels.reference.engine import prepare

    q, k = rope(x.q, x.cos, x.sin), rope(x.k, x.cos, x.sin)
    ops = prepare(q, k, x.v, p, permutation=permutation)
    return {"q": ops.q.codes, "q_scale": ops.q.scale, "k": ops.k.codes, "k_scale": ops.k.scale,
            "v": ops.v.codes, "v_scale": ops.v.scale, "v_mean": ops.v_mean}


def operands_quantizers(x: CallInputs, p: Plan, permutation: torch.Tensor) -> dict:
    """Rung 2: RoPE, the gather and both means in PyTorch, written out; then the fused Q, K
    (with the Hadamard) and V quantizers of `triton/quantize.py` on those tensors."""
    from vcbench.kernels.backends.common import TILE
    from vcbench.kernels.backends.triton import quantize as tq
    from vcbench.kernels.reference.engine import pad_tokens, softmax_scale_log2
    from vcbench.kernels.reference.vsmooth import block_means, permute_tokens, token_mean
    from vcbench.kernels.spec.formats import E4M3, scale_for
    from vcbench.kernels.spec.rotation import rotate

    b, h, n, d = x.q.shape
    n_pad = -(-n // TILE) * TILE
    perm = permutation.to(x.q.device, torch.long)
    q, k = rope(x.q, x.cos, x.sin), rope(x.k, x.cos, x.sin)
    k, v = permute_tokens(k, perm), permute_tokens(x.v, perm)
    k_mean = rotate(token_mean(k.float())).reshape(b * h, d).contiguous()
    vf = pad_tokens(v.float(), TILE)
    v_means = block_means(vf, TILE, n)
    residual = vf - v_means.repeat_interleave(TILE, dim=-2)
    residual[..., n:, :] = 0
    v_scale = scale_for(residual.abs().amax(-2), E4M3.max)
    v_scale = torch.where(v_scale > 0, v_scale, torch.ones_like(v_scale))

    int8 = p.q.fmt.name == "int8"
    code_dtype = torch.int8 if int8 else torch.float8_e4m3fn
    norm = tq.hadamard_norm(d) if p.hadamard_qk else 1.0

    def rows(t, per, mean=None, multiplier=None):
        out = torch.empty(b, h, n_pad, d, device=t.device, dtype=code_dtype)
        scale = torch.empty(b, h, n_pad // per, device=t.device, dtype=torch.float32)
        tq._quantize_rows[(n_pad // per * b * h,)](
            t, scale, mean if mean is not None else scale, out, scale, n, n_pad, t.stride(0),
            t.stride(1), t.stride(2), h, multiplier if multiplier is not None else 1.0, norm,
            ROWS=per, D=d, FMT=tq.FMT_INT8 if int8 else tq.FMT_E4M3, HAS_PERM=False,
            HAS_MEAN=mean is not None, MULTIPLY=multiplier is not None,
            HADAMARD=p.hadamard_qk, LOG2_D=d.bit_length() - 1)
        return out, scale

    qc, qs = rows(q.contiguous(), p.q.granularity.rows, multiplier=softmax_scale_log2(d))
    kc, ks = rows(k.contiguous(), TILE, mean=k_mean)
    v = v.contiguous()
    v_t = torch.empty(b, h, d, n_pad, device=v.device, dtype=torch.float8_e4m3fn)
    stored = torch.empty(b, h, n_pad // TILE, d, device=v.device, dtype=torch.float16)
    means = v_means.float().contiguous()
    tq._quantize_v[(n_pad // TILE * b * h,)](
        v, v_scale, means, v_scale.contiguous(), v_t, stored, n, n_pad, v.stride(0), v.stride(1),
        v.stride(2), h, ROWS=TILE, D=d, HAS_PERM=False, DEMEAN=True, PER_BLOCK=False)
    return {"q": qc, "q_scale": qs, "k": kc, "k_scale": ks, "v": v_t.transpose(-1, -2),
            "v_scale": v_scale, "v_mean": stored}


def operands_fused(x: CallInputs, p: Plan, permutation: torch.Tensor) -> dict:
    """Rung 3: RoPE in PyTorch, everything else in vcbench's fused preprocessing."""
    from vcbench.kernels.backends.triton.operands import prepare_gpu

    q, k = rope(x.q, x.cos, x.sin), rope(x.k, x.cos, x.sin)
    return _gpu_operands(prepare_gpu(q, k, x.v, p, permutation=permutation))


def operands_rope(x: CallInputs, p: Plan, permutation: torch.Tensor) -> dict:
    """Rung 4 (and 5): RoPE too inside vcbench's fused preprocessing, on Q and K as loaded."""
    from vcbench.kernels.backends.triton.operands import prepare_gpu

    return _gpu_operands(prepare_gpu(x.q, x.k, x.v, p, permutation=permutation,
                                     rope=Rope(x.cos, x.sin)))


def _gpu_operands(ops) -> dict:
    return {"q": ops.q, "q_scale": ops.q_scale, "k": ops.k, "k_scale": ops.k_scale,
            "v": ops.v_t.transpose(-1, -2), "v_scale": ops.v_scale, "v_mean": ops.v_mean}


# rung -> (grouping, operands); None: not built
LADDER = {"eager": (_torch_group, operands_eager),
          "quantizers": (_torch_group, operands_quantizers),
          "means": (_torch_group, operands_fused),
          "rope": (_torch_group, operands_rope),
          "final": (_gpu_group, operands_rope)}
NOT_BUILT: dict[str, str] = {}  # rung -> why it is listed and not timed (every rung is built)


def rung_call(name: str, x: CallInputs, p: Plan):
    """The whole chain of one call at rung `name`: grouping, then the operands."""
    group, operands = LADDER[name]
    return lambda: operands(x, p, group(x.v, p))


def with_factors(table: pd.DataFrame) -> pd.DataFrame:
    """`step_factor`: the last timed rung before this one over this one; `cumulative_factor`:
    the first rung over this one (a rung not timed has neither, and is skipped)."""
    table = table.copy()
    timed = table.ms.dropna()
    before = table.ms.ffill().shift(1)
    table["step_factor"] = before / table.ms
    table["cumulative_factor"] = timed.iloc[0] / table.ms
    return table


def fusion_table(shape=(1, 40, 75600, 128), warmup_s: float = 3.0, window_s: float = 3.0,
                 progress=None) -> tuple[pd.DataFrame, str]:
    """The ladder timed on this GPU: one row per rung, ms per call and the factors."""
    from vcbench.timing.cupti import time_kernels

    if not torch.cuda.is_available():
        raise UserError("analyze fusion needs a CUDA GPU (it times kernels with CUPTI); "
                        "this machine has none")
    x = call_inputs(shape, "cuda")
    p = plan()
    rows = []
    for name, label in RUNGS:
        if LADDER[name] is None:
            rows.append({"rung": name, "stage": label, "ms": float("nan"), "note": NOT_BUILT[name]})
        else:
            t = time_kernels(rung_call(name, x, p), warmup_s, window_s, min_calls=3)
            rows.append({"rung": name, "stage": label, "ms": t.per_call_ms(), "note": ""})
        if progress is not None:
            progress()
    table = with_factors(pd.DataFrame(rows))
    b, h, n, d = shape
    return table, (f"{METHOD} at B{b} H{h} N{n} D{d}, random normal inputs; "
                   f"{torch.cuda.get_device_name()}")
