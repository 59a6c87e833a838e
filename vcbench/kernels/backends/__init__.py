"""Where a plan runs on the GPU: the backends in priority order, each saying what it takes.

    external.FA4, external.CUDNN       exact BF16 attention (FlashAttention-4, else cuDNN)
    external.SAGE2_OFFICIAL            SageAttention2's released configuration, if installed
    sm90.SM90                          the compiled sm_90a kernel (INT8 QK, per-channel V)
    triton.TRITON                      vcbench's Triton kernels (the 8-bit plans)
    triton.NVFP4                       NVFP4 plans, exactly, on 16-bit tensor cores (fidelity)

The first that is available here and supports the plan (on inputs of this shape) runs it;
`vcbench methods` prints every backend's reason for every method from the same list.
"""

from __future__ import annotations

from vcbench.kernels.backends.common import KERNEL_ENV, TILE, Backend, triton_ready
from vcbench.kernels.backends.external import CUDNN, FA4, SAGE2_OFFICIAL
from vcbench.kernels.backends.sm90 import SM90
from vcbench.kernels.backends.triton import NVFP4, NVFP4_IMPLEMENTATION, TRITON
from vcbench.kernels.spec.method import Plan

BACKENDS: tuple[Backend, ...] = (FA4, CUDNN, SAGE2_OFFICIAL, SM90, TRITON, NVFP4)
__all__ = ["BACKENDS", "CUDNN", "FA4", "KERNEL_ENV", "NVFP4", "NVFP4_IMPLEMENTATION",
           "SAGE2_OFFICIAL", "SM90", "TILE", "TRITON",
           "Backend", "reasons", "select", "triton_ready", "why_none"]


def reasons(plan: Plan, shape: tuple[int, ...] | None = None) -> list[tuple[Backend, str | None]]:
    """Each backend with None (it would run `plan`) or why it would not, in priority order."""
    return [(b, b.supports(plan, shape) or b.available()) for b in BACKENDS]


def select(plan: Plan, shape: tuple[int, ...] | None = None) -> Backend | None:
    """The backend that runs `plan` (on (B, H, N, D) inputs of `shape`) here, or None."""
    for b in BACKENDS:
        if b.supports(plan, shape) is None and b.available() is None:
            return b
    return None


def why_none(plan: Plan, shape: tuple[int, ...] | None = None,
             among: Plan | None = None) -> str:
    """One line: why no backend runs `plan` here; with `among` (the method's default plan),
    only the backends that compute that plan are named, the ones a user would expect."""
    named = [(b, why) for b, why in reasons(plan, shape) if why]
    if among is not None:
        named = [(b, why) for b, why in named if b.supports(among, None) is None] or named
    return "; ".join(f"{b.name}: {why}" for b, why in named)
