"""What every GPU backend is: a name, where it can run, which plans it computes, and the call.

A backend reads the method's `Plan` and nothing else about it (no method names): it declares
the plans it computes exactly, `supports(plan, shape)`, and `vcbench.kernels.backends` tries
the backends in priority order (their registry's order), with one preference read in one place
(`vcbench.kernels.backends.select`). The vcbench kernels split a call into the fused
preprocessing (`prepare`, timed apart as the paper times it) and the attention kernel
(`run_prepared`); an external kernel does both in `run`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch

from vcbench.kernels.spec.method import Plan

TILE = 128  # the vcbench kernels' query and key tile, the K scale block, V-Smooth's block
MAX_GRID_Y = 65535  # CUDA's limit on a grid's second axis, where 2-D grids put batch x heads


@dataclass(frozen=True)
class Backend:
    """One GPU implementation. `available()` and `supports(plan, shape)` return None when it
    can run (here; this plan on (B, H, N, D) inputs), else one line saying why not. `run(q, k,
    v, plan, call)` computes HND attention into a new tensor; `call` holds the per-call options
    (permutation, grid, centroids, sm_scale). `prepare` and `run_prepared`, where the backend
    has them, are its two halves. `label` says in a few words what computes the plan;
    `aliases` are the short names a preference may use (VCBENCH_KERNEL=triton); a
    `fidelity_only` backend computes a plan's bits but not at its format's speed (NVFP4 on
    16-bit tensor cores), so every time it gives is shown with its label. A `fused_rope`
    backend's preprocessing takes q and k before RoPE and a per-call `rope` (spec.rope.Rope)
    and rotates them in its quantizers; any other gets q and k rotated first. `cost`, where
    given, says in a few words what the backend's calls cost where they were measured."""

    name: str
    available: Callable[[], str | None]
    supports: Callable[[Plan, tuple[int, ...]], str | None]
    run: Callable[..., torch.Tensor]
    prepare: Callable[..., Any] | None = None
    run_prepared: Callable[..., torch.Tensor] | None = None
    label: str = ""
    aliases: tuple[str, ...] = ()
    fidelity_only: bool = False
    fused_rope: bool = False
    cost: str = ""  # what a call costs where it was measured, for `vcbench methods NAME`


@lru_cache(maxsize=1)
def triton_ready() -> bool:
    """CUDA, a Hopper-or-newer GPU (FP8 tensor cores), and Triton importable."""
    return triton_reason() is None


def triton_reason() -> str | None:
    """Why the Triton kernels cannot run here, or None."""
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed"
    if torch.cuda.get_device_capability() < (9, 0):
        return "needs a Hopper-or-newer GPU (FP8 tensor cores)"
    return None


def split_prepared(prepare, run_prepared):
    """`run` for a backend made of a preprocessing and a kernel."""
    def run(q, k, v, plan: Plan, call: dict) -> torch.Tensor:
        ops = prepare(q, k, v, plan, **call)
        return run_prepared(ops, plan, torch.empty_like(q))
    return run
