"""The method registry and `attention()`, the one entry point for every method and backend.

    vcbench.attention(q, k, v, "vc-8bit")                     # emulation, any device
    vcbench.attention(q, k, v, "sage2-8bit", tensor_layout="NHD", q_granularity="block")

Three layers, imported one way (spec <- reference <- backends), and this module, the only one
that sees all three:
    spec/       what a method is: formats, granularities, P encoders, the Plan, methods/
    reference/  how it is computed: the emulation engine and V-Smooth's algorithms
    backends/   where it runs on a GPU: Triton, the compiled sm90 kernel, external kernels
Method names are the contract shared by the emulation, the GPU kernels, the CLI and every
results table; nothing below this module dispatches on them.
"""

from __future__ import annotations

import warnings
from functools import lru_cache
from typing import Any

import torch

from vcbench.errors import UserError
from vcbench.kernels import backends
from vcbench.kernels.reference.engine import emulate
from vcbench.kernels.reference.vsmooth import group as reference_group
from vcbench.kernels.spec.method import Method
from vcbench.kernels.spec.methods import attnqat, bf16, fp8_fa4, sage2, sage3, vc
from vcbench.kernels.spec.vsmooth import Grouping, VSmoothConfig

METHODS: dict[str, Method] = {
    m.name: m
    for m in (bf16.METHOD, fp8_fa4.METHOD, sage2.METHOD, sage3.METHOD, attnqat.METHOD,
              vc.VC_8BIT, vc.VC_8BIT_VSMOOTH, vc.VC_4BIT, vc.VC_8BIT_FP8QK)
}
LAYOUTS = ("HND", "NHD")
BACKEND_CHOICES = ("emulate", "gpu", "auto")
# Options that are per-call data, not part of the method's plan.
CALL_OPTIONS = ("permutation", "grid", "centroids", "sm_scale")


def list_methods() -> list[str]:
    return list(METHODS)


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise UserError(f"unknown method {name!r} (known: {', '.join(METHODS)})") from None


def implementation(method: Method | str, options: dict | None = None) -> str | None:
    """The name of what runs `method` (with `options`) with backend='gpu' here, or None."""
    m = get_method(method) if isinstance(method, str) else method
    chosen = backends.select(m.plan(options or {}))
    return None if chosen is None else chosen.name


def implementation_label(method: Method | str, options: dict, backend: str, on_cuda: bool) -> str:
    """What computes `method` with `options` under `backend` ("emulate", "gpu", "auto") on
    this machine, for a run's records: "emulate", or the GPU backend's name (the NVFP4 kernel's
    results keep their label)."""
    if backend == "emulate" or not on_cuda:
        return "emulate"
    return implementation(method, options) or "emulate"


def available_backends(method: Method) -> list[str]:
    """Backends that can run `method` on this machine."""
    gpu = implementation(method)
    return ["emulate"] + ([f"gpu ({gpu})"] if gpu else [])


def gpu_kernels(plan) -> str:
    """The GPU backends that compute `plan`, in priority order, each with whether it runs
    here and, if not, why (one backend list decides this and `attention`'s choice)."""
    names = []
    for b in backends.BACKENDS:
        if b.supports(plan, None) is None:
            why = b.available()
            names.append(b.name + ("" if why is None else f" (not here: {why})"))
    return ", ".join(names) or "none"


def method_table() -> list[dict[str, Any]]:
    rows = []
    for m in METHODS.values():
        plan = m.plan()
        rows.append({"method": m.name, "QK bits": m.qk_bits, "PV bits": m.pv_bits,
                     "smoothing": m.smoothing, "P": plan.p.describe(),
                     "backends": ", ".join(available_backends(m)), "GPU kernels": gpu_kernels(plan)})
    return rows


def group(v: torch.Tensor, config: VSmoothConfig, grid=None, init=None) -> Grouping:
    """V-Smooth's token order for v (B, H, N, D), on the GPU's k-means where it takes the values
    (16-bit CUDA; the same Lloyd iterations from the same seeding), else torch's."""
    if v.is_cuda and backends.triton_ready():
        from vcbench.kernels.backends.triton.kmeans import grouping

        return grouping(v, config, grid=grid, init=init)
    return reference_group(v, config, grid=grid, init=init)


@lru_cache(maxsize=64)
def _fallback_note(method: str, reason: str) -> None:
    warnings.warn(f"{method}: no GPU kernel for these options or this shape ({reason}); "
                  "running the emulation", stacklevel=3)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, method: str,
              tensor_layout: str = "HND", backend: str = "emulate", **options: Any) -> torch.Tensor:
    """Non-causal self-attention computed as `method`'s kernel computes it.

    q, k, v: (B, H, N, D) for HND or (B, N, H, D) for NHD, one shape, head dim 64 or 128, any
    N (padded internally to the tiles; padding never changes the result). Returns attention in
    the input dtype and layout. Options are the method's (see `vcbench methods` and
    docs/methods.md); an unknown option is an error. backend: "emulate" (any device), "gpu"
    (the first GPU backend that takes the plan; an error if none does) or "auto" (that backend
    for CUDA inputs it takes, else the emulation).
    """
    m = get_method(method)
    if tensor_layout not in LAYOUTS:
        raise UserError(f"tensor_layout must be one of {', '.join(LAYOUTS)}, got {tensor_layout!r}")
    if backend not in BACKEND_CHOICES:
        raise UserError(f"backend must be one of {', '.join(BACKEND_CHOICES)}, got {backend!r}")
    opts = m.resolve(options)
    plan = m.build(opts)
    if tensor_layout == "NHD":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    call = {name: opts[name] for name in CALL_OPTIONS if name in opts}
    chosen = None
    if backend != "emulate" and q.is_cuda:
        chosen = backends.select(plan, tuple(q.shape))
        if chosen is None and backend == "auto" and backends.select(m.plan()) is not None:
            # the method has a kernel here, but not for these options or this shape: say so
            _fallback_note(m.name, backends.why_none(plan, tuple(q.shape), among=m.plan()))
    if backend == "gpu" and chosen is None:
        where = ("it needs CUDA tensors" if not q.is_cuda
                 else backends.why_none(plan, tuple(q.shape), among=m.plan()))
        raise UserError(f"no GPU kernel for {m.name!r} with these options here ({where})")
    if chosen is not None:
        if q.dtype not in (torch.bfloat16, torch.float16):
            raise UserError(f"the GPU kernels take bf16 or fp16 inputs, got {q.dtype}")
        out = chosen.run(q, k, v, plan, call)
    else:  # the emulation groups V itself (torch's k-means on the FP32 values) when asked to
        out = emulate(q, k, v, plan, **call)
    return out.transpose(1, 2) if tensor_layout == "NHD" else out
