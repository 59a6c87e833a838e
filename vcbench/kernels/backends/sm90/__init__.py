"""The compiled sm_90a backends: `compiled.py` builds, loads and runs `csrc/` (one file per
phase of the kernel). SM90 reads the 8-bit Triton preprocessing's operands, with V-Smooth's
means blocked as its mean product reads them; SM90_NVFP4 (a fidelity kernel, NVFP4 on FP16
wgmma) reads the NVFP4 Triton preprocessing's, K's and V's tile rows in its key order. It
runs where a current build exists (`make kernels`); where a user prefers it
(VCBENCH_KERNEL=sm90) and it cannot run, the selection says why in one line."""

from __future__ import annotations

from vcbench.kernels.backends.common import MAX_GRID_Y, Backend, split_prepared
from vcbench.kernels.backends.sm90 import compiled
from vcbench.kernels.backends.triton import operands


def supports(plan, shape=None) -> str | None:
    """The 8-bit Triton preprocessing's plans that the kernel itself takes. Its grid holds one
    (batch, head) per row of CTAs, so past MAX_GRID_Y of them the Triton kernel (1-D grid) runs
    the call."""
    reason = operands.unsupported_reason(plan) or compiled.unsupported_reason(
        plan, shape[-1] if shape is not None else 128)
    if reason is None and shape is not None and shape[0] * shape[1] > MAX_GRID_Y:
        reason = f"batch x heads above {MAX_GRID_Y}"
    return reason


def available() -> str | None:
    return compiled.status()


def prepare(q, k, v, plan, **call):
    ops = operands.prepare_gpu(q, k, v, plan, **call)
    if ops.v_mean is not None:
        ops.v_mean_blocked = compiled.blocked_means(ops.v_mean)
    return ops


SM90 = Backend(compiled.IMPLEMENTATION, available, supports,
               split_prepared(prepare, compiled.run), prepare, compiled.run,
               label="compiled sm_90a kernel", aliases=("sm90",), fused_rope=True)


def supports_nvfp4(plan, shape=None) -> str | None:
    """The NVFP4 Triton preprocessing's plans (and shapes) that the NVFP4 instances take."""
    return (operands.nvfp4_unsupported_reason(plan, shape)
            or compiled.nvfp4_unsupported_reason(plan, shape))


def prepare_nvfp4(q, k, v, plan, **call):
    """nvfp4.prepare's operands in the kernel's key order (K's and V's tile rows as its TMA
    copies them), with what it reads besides: V-Smooth's mean steps, Q smoothing's score term."""
    from vcbench.kernels.backends.triton import nvfp4

    ops = nvfp4.prepare(q, k, v, plan, key_order="sm90", **call)
    ops.mean_steps = compiled.mean_steps(ops.v_mean) if ops.v_mean is not None else None
    ops.score_bias = nvfp4.score_term(ops, ops.k.shape[1]) if plan.smooth_q else None
    return ops


SM90_NVFP4 = Backend(compiled.NVFP4_IMPLEMENTATION, available, supports_nvfp4,
                     split_prepared(prepare_nvfp4, compiled.run_nvfp4), prepare_nvfp4,
                     compiled.run_nvfp4, label="nvfp4 on fp16 wgmma, compiled sm_90a",
                     aliases=("sm90-nvfp4",), fidelity_only=True, fused_rope=True,
                     cost="H200, Wan2.2 shape: 1.30-1.44x BF16 FA4's time (2026-12-07; "
                     "docs/perf.md)")
