"""Kernels vcbench calls but does not own: FlashAttention-4 and cuDNN for exact BF16 attention,
the official SageAttention2 for its released configuration."""

from __future__ import annotations

import importlib.util
from functools import lru_cache

import torch

from vcbench.kernels.backends.common import Backend
from vcbench.kernels.spec.formats import BF16
from vcbench.kernels.spec.granularity import Unscaled
from vcbench.kernels.spec.method import Plan
from vcbench.kernels.spec.methods import sage2
from vcbench.kernels.spec.probability import ExpThenCast


@lru_cache(maxsize=1)  # asked on every BF16 call: look once
def flash_attn4():
    try:
        from flash_attn.cute import flash_attn_func
    except Exception:  # not installed, or its CUTLASS DSL runtime is missing
        return None
    return flash_attn_func


@lru_cache(maxsize=1)
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


def exact_bf16_reason(plan: Plan, shape=None) -> str | None:
    """FlashAttention's arithmetic: BF16 operands as they are, FP32 scores scaled after the
    product, P rounded to BF16, FP32 accumulation."""
    bf16 = all(x.fmt is BF16 and isinstance(x.granularity, Unscaled)
               for x in (plan.q, plan.k, plan.v))
    if not bf16 or plan.p != ExpThenCast(BF16) or plan.fold_scale_into_q:
        return "BF16 attention only"
    if plan.smooth_k or plan.smooth_q or plan.hadamard_qk or plan.vsmooth is not None:
        return "no smoothing or rotation"
    return None


def _cuda_reason() -> str | None:
    return None if torch.cuda.is_available() else "no CUDA GPU"


def _fa4_available() -> str | None:
    return _cuda_reason() or (None if flash_attn4() is not None else "flash-attn-4 not installed")


def _run_fa4(q, k, v, plan: Plan, call: dict) -> torch.Tensor:
    out = flash_attn4()(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                        softmax_scale=call.get("sm_scale"))
    out = out[0] if isinstance(out, tuple) else out
    return out.transpose(1, 2)


def _run_cudnn(q, k, v, plan: Plan, call: dict) -> torch.Tensor:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                scale=call.get("sm_scale"))


# SageAttention2 as released: what `sageattn` computes on Hopper (INT8 QK per warp with the K
# mean removed, FP8 PV with per-channel V, P scaled by 448).
SAGE2_RELEASED = sage2.METHOD.plan()


def sage2_version_reason(version: str) -> str | None:
    """The `sageattention` package is SageAttention2 from version 2 on; 1.x (the one on PyPI,
    Triton, FP16 PV) computes another plan and must not stand in for sage2-8bit's."""
    major = version.split(".", 1)[0]
    if major.isdigit() and int(major) >= 2:
        return None
    return f"sageattention {version} is SageAttention 1, not 2"


def _sage_available() -> str | None:
    found = official_sageattention()
    if found is None:
        return _cuda_reason() or "sageattention not installed"
    return _cuda_reason() or sage2_version_reason(found[1])


def _sage_supports(plan: Plan, shape=None) -> str | None:
    return None if plan == SAGE2_RELEASED else "SageAttention2's released configuration only"


def _run_sage(q, k, v, plan: Plan, call: dict) -> torch.Tensor:
    sage, _ = official_sageattention()
    return sage.sageattn(q, k, v, tensor_layout="HND", sm_scale=call.get("sm_scale"))


FA4 = Backend("flash-attn-4", _fa4_available, exact_bf16_reason, _run_fa4,
              label="FlashAttention-4 (BF16)", aliases=("fa4",))
CUDNN = Backend("cudnn-sdpa", _cuda_reason, exact_bf16_reason, _run_cudnn,
                label="cuDNN SDPA (BF16)", aliases=("cudnn",))
SAGE2_OFFICIAL = Backend("sageattention (official)", _sage_available, _sage_supports, _run_sage,
                         label="SageAttention2 (official)", aliases=("sage2",))
