"""Where a plan runs on the GPU: the backends in priority order, each saying what it takes.

    external.FA4, external.CUDNN       exact BF16 attention (FlashAttention-4, else cuDNN)
    external.SAGE2_OFFICIAL            SageAttention2's released configuration, if installed
    sm90.SM90                          the compiled sm_90a kernel (INT8 QK, per-channel V)
    sm90.SM90_NVFP4                    NVFP4 plans on FP16 wgmma, compiled sm_90a (fidelity)
    triton.TRITON                      vcbench's Triton kernels (the 8-bit plans)
    triton.NVFP4                       NVFP4 plans, exactly, on 16-bit tensor cores (fidelity)

They are the built-in entries of `BACKENDS`, a registry like the methods' (vcbench/registry.py):
a plugin's backend registers after them. `select` is the one place that chooses: the preferred
backend first (VCBENCH_KERNEL=NAME, a backend's name or alias; `auto`, the default, prefers
none), then the registry's order; the first that is available here and supports the plan (on
inputs of this shape) runs it. `vcbench methods` prints every backend's reason for every
method from the same registry.
"""

from __future__ import annotations

import os
import warnings
from functools import lru_cache

from vcbench.errors import UserError
from vcbench.kernels.backends.common import TILE, Backend, triton_ready
from vcbench.kernels.backends.external import CUDNN, FA4, SAGE2_OFFICIAL
from vcbench.kernels.backends.sm90 import SM90, SM90_NVFP4
from vcbench.kernels.backends.triton import NVFP4, NVFP4_IMPLEMENTATION, TRITON
from vcbench.kernels.spec.method import Plan
from vcbench.registry import Registry

BACKENDS: Registry[Backend] = Registry("backend", "vcbench.backends")
BACKENDS.register_builtins((FA4, CUDNN, SAGE2_OFFICIAL, SM90, SM90_NVFP4, TRITON, NVFP4))
KERNEL_ENV = "VCBENCH_KERNEL"  # auto (default) | a backend's name or alias: tried first
_AUTO = object()
__all__ = ["BACKENDS", "CUDNN", "FA4", "KERNEL_ENV", "NVFP4", "NVFP4_IMPLEMENTATION",
           "SAGE2_OFFICIAL", "SM90", "SM90_NVFP4", "TILE", "TRITON",
           "Backend", "fidelity_label", "preference", "reasons", "select", "triton_ready", "why_none"]


def preference() -> Backend | None:
    """The backend VCBENCH_KERNEL asks for first, or None (`auto`, the default). An unknown
    name is a UserError listing the choices."""
    choice = os.environ.get(KERNEL_ENV, "").strip() or "auto"
    if choice.lower() == "auto":
        return None
    for b in BACKENDS.values():
        if choice == b.name or choice.lower() in b.aliases:
            return b
    names = ["auto"] + [a for b in BACKENDS.values() for a in (b.aliases or (b.name,))]
    raise UserError(f"{KERNEL_ENV} must be one of {', '.join(names)}, got {choice!r}")


def _order(prefer: Backend | None) -> list[Backend]:
    ordered = BACKENDS.values()
    return ordered if prefer is None else [prefer] + [b for b in ordered if b is not prefer]


def reasons(plan: Plan, shape: tuple[int, ...] | None = None) -> list[tuple[Backend, str | None]]:
    """Each backend with None (it would run `plan`) or why it would not, in priority order."""
    return [(b, b.supports(plan, shape) or b.available()) for b in BACKENDS.values()]


def select(plan: Plan, shape: tuple[int, ...] | None = None, prefer=_AUTO) -> Backend | None:
    """The backend that runs `plan` (on (B, H, N, D) inputs of `shape`) here, or None.
    `prefer`: a Backend to try first (default: VCBENCH_KERNEL's). A preferred backend that
    takes the plan but cannot run here says why once, and the order goes on."""
    wanted = preference() if prefer is _AUTO else prefer
    for b in _order(wanted):
        if b.supports(plan, shape) is not None:
            continue
        why = b.available()
        if why is None:
            return b
        if b is wanted:
            _fallback_note(b.name, why)
    return None


@lru_cache(maxsize=64)
def _fallback_note(name: str, reason: str) -> None:
    warnings.warn(f"{KERNEL_ENV}={name}: {reason}; running the next backend that takes the plan "
                  "(the Triton kernel for the 8-bit plans)", stacklevel=4)


def why_none(plan: Plan, shape: tuple[int, ...] | None = None,
             among: Plan | None = None) -> str:
    """One line: why no backend runs `plan` here; with `among` (the method's default plan),
    only the backends that compute that plan are named, the ones a user would expect."""
    named = [(b, why) for b, why in reasons(plan, shape) if why]
    if among is not None:
        named = [(b, why) for b, why in named if b.supports(among, None) is None] or named
    return "; ".join(f"{b.name}: {why}" for b, why in named)


def fidelity_label(implementation: str) -> str | None:
    """The label of the fidelity-only backend a run record's `implementation` names (a
    projection joins several with " + "), or None: its times are not its format's speed."""
    for b in BACKENDS.values():
        if b.fidelity_only and b.name in str(implementation):
            return b.label
    return None
