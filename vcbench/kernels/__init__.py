"""The method registry and `attention()`, the one entry point for every method and backend.

    vcbench.attention(q, k, v, "vc-8bit")                     # emulation, any device
    vcbench.attention(q, k, v, "sage2-8bit", tensor_layout="NHD", q_granularity="block")

Method names are the contract shared by the emulation, the GPU kernels, the CLI and every
results table.
"""

from __future__ import annotations

from typing import Any

import torch

from vcbench.errors import UserError
from vcbench.kernels.method import Method
from vcbench.kernels.methods import attnqat, bf16, fp8_fa4, sage2, sage3, vc
from vcbench.kernels.online import emulate

METHODS: dict[str, Method] = {
    m.name: m
    for m in (bf16.METHOD, fp8_fa4.METHOD, sage2.METHOD, sage3.METHOD, attnqat.METHOD,
              vc.VC_8BIT, vc.VC_8BIT_VSMOOTH, vc.VC_4BIT)
}
LAYOUTS = ("HND", "NHD")
BACKENDS = ("emulate", "gpu", "auto")
# Options that are per-call data, not part of the method's plan.
CALL_OPTIONS = ("permutation", "grid", "centroids", "sm_scale")


def list_methods() -> list[str]:
    return list(METHODS)


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise UserError(f"unknown method {name!r} (known: {', '.join(METHODS)})") from None


def available_backends(method: Method) -> list[str]:
    """Backends that can run `method` on this machine."""
    from vcbench.kernels.gpu import implementation

    gpu = implementation(method)
    return ["emulate"] + ([f"gpu ({gpu})"] if gpu else [])


def method_table() -> list[dict[str, Any]]:
    rows = []
    for m in METHODS.values():
        plan = m.plan()
        rows.append({"method": m.name, "QK bits": m.qk_bits, "PV bits": m.pv_bits,
                     "smoothing": m.smoothing, "P": plan.p.describe(),
                     "backends": ", ".join(available_backends(m))})
    return rows


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, method: str,
              tensor_layout: str = "HND", backend: str = "emulate", **options: Any) -> torch.Tensor:
    """Non-causal self-attention computed as `method`'s kernel computes it.

    q, k, v: (B, H, N, D) for HND or (B, N, H, D) for NHD, one shape, head dim 64 or 128, any
    N (padded internally to the tiles; padding never changes the result). Returns attention in
    the input dtype and layout. Options are the method's (see `vcbench methods` and
    docs/methods.md); an unknown option is an error.
    """
    m = get_method(method)
    if tensor_layout not in LAYOUTS:
        raise UserError(f"tensor_layout must be one of {', '.join(LAYOUTS)}, got {tensor_layout!r}")
    if backend not in BACKENDS:
        raise UserError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    opts = m.resolve(options)
    from vcbench.kernels import gpu

    if tensor_layout == "NHD":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    if backend == "auto":  # the GPU when it has a kernel for these very options and shape
        has_kernel = q.is_cuda and gpu.implementation(m) is not None
        reason = None
        if has_kernel and m.name != "bf16":
            reason = gpu.kernel_unsupported_reason(m.build(opts), tuple(q.shape))
            if reason is not None:
                gpu.fallback_note(m.name, reason)
        backend = "gpu" if has_kernel and reason is None else "emulate"
    if backend == "gpu" and gpu.implementation(m) is None:
        raise UserError(f"no GPU kernel for {m.name!r} on this machine "
                        f"(backends here: {', '.join(available_backends(m))})")
    if backend == "gpu":
        out = gpu.gpu_attention(q, k, v, m, opts)
    else:
        call = {name: opts[name] for name in CALL_OPTIONS if name in opts}
        out = emulate(q, k, v, m.build(opts), **call)
    return out.transpose(1, 2) if tensor_layout == "NHD" else out
