"""The `gpu` backend: which methods have a GPU kernel, and the thin function that runs one.

A method runs on the GPU when its plan is one the Triton kernel implements (8-bit Q/K in
INT8 or E4M3, E4M3 V per channel or per KV tile, P by exp-then-cast to E4M3 or by ExpCast,
optional V-Smooth, 128x128 tiles, FP32 accumulation). The plan decides the kernel's switches,
so the emulation and the kernel read one declaration. `bf16` runs FlashAttention-4
(`flash_attn.cute`) when it is installed, else cuDNN SDPA; `sage2-8bit` runs the official
`sageattention` package when it is installed; both say which in `implementation(...)`.
NVFP4 plans (E2M1 Q/K/V under per-16 E4M3 microscales, NVFP4 P: sage3-4bit, vc-4bit,
attnqat-tf) run on `triton/nvfp4.py` + `triton/nvfp4_attention.py`, NVFP4 computed exactly on
16-bit tensor cores: a fidelity kernel, labelled `NVFP4_IMPLEMENTATION` wherever it is named.
The plans the compiled Hopper kernel covers (`compiled.py`) run on it when a current build
exists (`make kernels`), else on Triton. VCBENCH_KERNEL=auto (default) | sm90 (as auto, but
a missing build is said in one line) | triton (never the compiled kernel).
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from dataclasses import dataclass
from functools import lru_cache

import torch

from vcbench.errors import UserError
from vcbench.kernels.formats import E2M1, E4M3, INT8, scale_for
from vcbench.kernels.granularity import Microscale16, PerBlock, PerChannel
from vcbench.kernels.method import Method, Plan
from vcbench.kernels.online import softmax_scale_log2
from vcbench.kernels.probability import ExpCast, ExpThenCast, NVFP4Probability
from vcbench.kernels.rotation import rotate
from vcbench.kernels.vsmooth import group, token_mean

TILE = 128
# NVFP4 emulated exactly on FP16 tensor cores: its times are no FP4 kernel's (module docstring).
NVFP4_IMPLEMENTATION = "vcbench-triton (nvfp4 on fp16 mma)"
MAX_GRID_Y = 65535  # CUDA's limit on the second grid axis, where the kernels put batch x heads
KERNEL_ENV = "VCBENCH_KERNEL"  # auto (default) | sm90 | triton: see the module docstring


@lru_cache(maxsize=1)
def triton_ready() -> bool:
    """CUDA, a Hopper-or-newer GPU (FP8 tensor cores), and Triton importable."""
    if not torch.cuda.is_available() or importlib.util.find_spec("triton") is None:
        return False
    return torch.cuda.get_device_capability() >= (9, 0)


def flash_attn4():
    try:
        from flash_attn.cute import flash_attn_func
    except Exception:  # not installed, or its CUTLASS DSL runtime is missing
        return None
    return flash_attn_func


def official_sageattention():
    """(module, version) of the official SageAttention2 package, or None."""
    if importlib.util.find_spec("sageattention") is None:
        return None
    from importlib import metadata

    import sageattention

    try:
        version = metadata.version("sageattention")
    except metadata.PackageNotFoundError:
        version = getattr(sageattention, "__version__", "unknown")
    return sageattention, version


# The GPU kernels never clamp ExpCast's code at 120: the row maximum's t = 120 + beta plus the
# rounding of m (a few ulps of 8m) stays below 120.5 when beta <= 0.25, even at |m| ~ 2^16.
# (The compiled kernel's byte packing also relies on codes below 256.)
EXPCAST_BETA_MAX = 0.25


def unsupported_reason(plan: Plan) -> str | None:
    """Why the Triton kernel cannot run this plan, or None if it can."""
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


def nvfp4_unsupported_reason(plan: Plan) -> str | None:
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


def kernel_unsupported_reason(plan: Plan, shape: tuple[int, ...] | None = None) -> str | None:
    """Why no vcbench GPU kernel runs `plan` (on inputs of `shape`, if given), or None."""
    eight_bit = unsupported_reason(plan)
    if eight_bit is None:
        return None
    fp4 = nvfp4_unsupported_reason(plan)
    if fp4 is None:
        return nvfp4_shape_reason(shape) if shape is not None else None
    return fp4 if plan.q.fmt is E2M1 else eight_bit


@lru_cache(maxsize=64)
def fallback_note(method: str, reason: str) -> None:
    warnings.warn(f"{method}: no GPU kernel for these options or this shape ({reason}); "
                  "running the emulation", stacklevel=3)


def kernel_preference() -> str:
    choice = os.environ.get(KERNEL_ENV, "").strip().lower() or "auto"
    if choice not in ("auto", "triton", "sm90"):
        raise UserError(f"{KERNEL_ENV} must be 'auto', 'triton' or 'sm90', got {choice!r}")
    return choice


@lru_cache(maxsize=64)
def _fallback_note(reason: str) -> None:
    warnings.warn(f"{KERNEL_ENV}=sm90: {reason}; running the Triton kernel", stacklevel=3)


def compiled_for(plan: Plan, head_dim: int = 128) -> bool:
    """Whether `plan` at this head dim runs on the compiled sm_90a kernel: not refused,
    supported, built (tests/test_gpu_compiled.py holds it to the Triton kernel's tolerance
    rule). A head dim it does not take (64) stays on Triton instead of failing."""
    preference = kernel_preference()
    if preference == "triton":
        return False
    from vcbench.kernels import compiled

    if compiled.unsupported_reason(plan, head_dim) is not None:
        return False
    reason = compiled.status()
    if reason is not None:
        if preference == "sm90":
            _fallback_note(reason)
        return False
    return True


def implementation(method: Method) -> str | None:
    """What runs `method` with backend='gpu' on this machine, or None."""
    if not torch.cuda.is_available():
        return None
    if method.name == "bf16":
        return "flash-attn-4" if flash_attn4() is not None else "cudnn-sdpa"
    if not triton_ready():
        return None
    if method.name == "sage2-8bit" and official_sageattention() is not None:
        return f"sageattention {official_sageattention()[1]} (official)"
    if unsupported_reason(method.plan()) is None:
        return "vcbench-sm90" if compiled_for(method.plan()) else "vcbench-triton"
    if nvfp4_unsupported_reason(method.plan()) is None:
        return NVFP4_IMPLEMENTATION
    return None


def implementation_label(method: Method, options: dict, backend: str, on_cuda: bool) -> str:
    """What computes `method` with `options` under `backend` ("emulate", "gpu", "auto") on
    this machine: "emulate", or the GPU implementation (`implementation`), for the records of
    a run (an NVFP4 kernel's results keep NVFP4_IMPLEMENTATION's label)."""
    impl = implementation(method) if on_cuda and backend != "emulate" else None
    if impl is None:
        return "emulate"
    if method.name != "bf16" and kernel_unsupported_reason(method.plan(options)) is not None:
        return "emulate"
    return impl


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
    # v_mean as the compiled kernel's simple-3wg and -vs3s read it (compiled.blocked_means),
    # written here when the plan runs on the compiled kernel, so it is timed as preprocessing
    v_mean_blocked: torch.Tensor | None = None


def _last_dim_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def prepare_gpu(q, k, v, plan: Plan, *, permutation=None, grid=None, centroids=None,
                sm_scale=None) -> GpuOperands:
    """The fused preprocessing: HND 16-bit inputs -> quantized operands (`GpuOperands`, or
    for an NVFP4 plan `triton.nvfp4.Nvfp4Operands`)."""
    reason = kernel_unsupported_reason(plan, tuple(q.shape))
    if reason:
        raise UserError(f"no GPU kernel for this configuration: {reason}")
    if unsupported_reason(plan) is not None:  # an NVFP4 plan
        from vcbench.kernels.triton import nvfp4

        return nvfp4.prepare(q, k, v, plan, permutation=permutation, grid=grid,
                             centroids=centroids, sm_scale=sm_scale)
    from vcbench.kernels.triton import quantize as tq

    b, h, n, d = q.shape
    n_pad = -(-n // TILE) * TILE
    scale_log2 = softmax_scale_log2(d, sm_scale)
    fmt = tq.FMT_INT8 if plan.q.fmt is INT8 else tq.FMT_E4M3
    code_dtype = torch.int8 if plan.q.fmt is INT8 else torch.float8_e4m3fn
    dev = q.device

    if plan.vsmooth is not None and permutation is None:
        permutation = group(v, plan.vsmooth, grid=grid, init=centroids).permutation
    perm = None if permutation is None else permutation.to(dev, torch.int32).contiguous()

    def rows(x, rows_per_scale, mean=None, multiplier=None, gather=None):
        out = torch.empty(b, h, n_pad, d, device=dev, dtype=code_dtype)
        scale = torch.empty(b, h, n_pad // rows_per_scale, device=dev, dtype=torch.float32)
        x = _last_dim_contiguous(x)
        tq._quantize_rows[(n_pad // rows_per_scale, b * h)](
            x, gather if gather is not None else scale, mean if mean is not None else scale,
            out, scale, n, n_pad, x.stride(0), x.stride(1), x.stride(2), h,
            multiplier if multiplier is not None else 1.0, ROWS=rows_per_scale, D=d, FMT=fmt,
            HAS_PERM=gather is not None, HAS_MEAN=mean is not None,
            MULTIPLY=multiplier is not None)
        return out, scale

    q_rows = plan.q.granularity.rows
    if plan.hadamard_qk:  # unfused: rotation in torch, exactly as the emulation orders it
        qf = rotate(q.float() * torch.tensor(scale_log2, dtype=torch.float32, device=dev))
        kf = k.float()
        if perm is not None:
            kf = torch.gather(kf, 2, perm.long()[..., None].expand_as(kf))
        if plan.smooth_k:
            kf = kf - token_mean(kf)
        qc, qs = rows(qf, q_rows)
        kc, ks = rows(rotate(kf), TILE)
    else:
        qc, qs = rows(q, q_rows, multiplier=scale_log2)
        k = _last_dim_contiguous(k)
        mean = tq.token_mean_gpu(k) if plan.smooth_k else None
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
        tq._v_block_stats[(n_blocks, b * h)](
            v, perm if perm is not None else block_amax, means, block_amax, n,
            v.stride(0), v.stride(1), v.stride(2), h, ROWS=TILE, D=d,
            HAS_PERM=perm is not None, DEMEAN=demean)
        v_scale = scale_for(block_amax.amax(2), E4M3.max)
        if demean:  # as vsmooth.demean_and_quantize: zero-residual channels keep scale 1
            v_scale = torch.where(v_scale > 0, v_scale, torch.ones_like(v_scale))
            stored = torch.empty(b, h, n_blocks, d, device=dev, dtype=torch.float16)
    tq._quantize_v[(n_blocks, b * h)](
        v, perm if perm is not None else v_scale, means if means is not None else v_scale,
        v_scale, v_t, stored if stored is not None else v_scale, n, n_pad,
        v.stride(0), v.stride(1), v.stride(2), h, ROWS=TILE, D=d,
        HAS_PERM=perm is not None, DEMEAN=demean, PER_BLOCK=per_block)
    blocked = None
    if stored is not None and compiled_for(plan, d):
        from vcbench.kernels.compiled import blocked_means

        blocked = blocked_means(stored)
    return GpuOperands(qc, qs, kc, ks, v_t, v_scale, stored, n, permutation, blocked)


def kernel_switches(plan: Plan) -> dict:
    expcast = isinstance(plan.p, ExpCast)
    return dict(qk_int8=plan.q.fmt is INT8, q_rows=plan.q.granularity.rows, expcast=expcast,
                p_scale=float(plan.p.scale), vsmooth=plan.vsmooth is not None,
                v_per_tile=isinstance(plan.v.granularity, PerBlock),
                expcast_bias=120.0 + (plan.p.beta if expcast else 0.0))


def run_prepared(ops: GpuOperands, plan: Plan, out: torch.Tensor, **tuning) -> torch.Tensor:
    """Triton switches in `tuning` pick the Triton kernel; `variant=` the compiled one."""
    if not isinstance(ops, GpuOperands):  # NVFP4 operands: the NVFP4 kernel
        from vcbench.kernels.triton.nvfp4_attention import launch as launch_nvfp4

        return launch_nvfp4(ops, plan, out, **tuning)
    if "variant" in tuning or (not tuning and compiled_for(plan, ops.q.shape[-1])):
        from vcbench.kernels import compiled

        return compiled.run(ops, plan, out, **tuning)
    from vcbench.kernels.triton.attention import launch

    return launch(ops, out, **kernel_switches(plan), **tuning)


def bf16_attention(q, k, v, sm_scale=None):
    """BF16 reference on the GPU: FlashAttention-4 if installed, else cuDNN SDPA. HND."""
    fa4 = flash_attn4()
    if fa4 is not None:
        out = fa4(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=sm_scale)
        out = out[0] if isinstance(out, tuple) else out
        return out.transpose(1, 2)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=sm_scale)


def gpu_attention(q, k, v, method: Method, opts: dict) -> torch.Tensor:
    """HND in, HND out (in the input dtype), on the GPU."""
    if not q.is_cuda:
        raise UserError("backend='gpu' needs CUDA tensors")
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise UserError(f"the GPU kernels take bf16 or fp16 inputs, got {q.dtype}")
    if method.name == "bf16":
        return bf16_attention(q, k, v, opts.get("sm_scale"))
    plan = method.build(opts)
    ops = prepare_gpu(q, k, v, plan, permutation=opts.get("permutation"), grid=opts.get("grid"),
                      centroids=opts.get("centroids"), sm_scale=opts.get("sm_scale"))
    out = torch.empty_like(q)
    return run_prepared(ops, plan, out)
