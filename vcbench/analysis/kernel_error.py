"""`vcbench analyze kernel-error`: each method's output error against an FP64 reference, and
its split by Equation 2 into the probability term and the value term.

    O - O_q = (P - P_q) V + P_q (V - V_q)

The engine runs a second accumulator beside the real one, P_q times the exact V, so
O_mixed = P_q V: the probability term is O_mixed - O, the value term O_q - O_mixed. Both
are normalised by the same row sums the kernel uses. Sizes are relative L2 against ||O||.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch

from vcbench.analysis.variants import parse_variant
from vcbench.kernels import CALL_OPTIONS, get_method
from vcbench.kernels.reference.engine import finish, prepare, run


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d)) V in float64, HND."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(s, dim=-1) @ v


def error_metrics(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    out, ref = out.double(), ref.double()
    diff = out - ref
    return {
        "rel_l2": (diff.norm() / ref.norm()).item(),
        "cosine": torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0).item(),
        "rel_l1": (diff.abs().sum() / ref.abs().sum()).item(),
        "rmse": diff.pow(2).mean().sqrt().item(),
    }


def method_error(q, k, v, method: str, grid=None, **options) -> dict[str, float]:
    m = get_method(method)
    if m.kind != "plan":  # an external kernel: its output only, no plan to split the error by
        from vcbench.kernels import attention

        out = attention(q, k, v, method, **options)
        return {"method": method, **error_metrics(out, reference_attention(q, k, v)),
                "prob_term": math.nan, "value_term": math.nan, "value_share": math.nan}
    opts = m.resolve(options)
    plan = m.build(opts)
    call = {key: opts[key] for key in CALL_OPTIONS if key in opts}
    if plan.vsmooth is not None and not call.get("grid"):
        call["grid"] = grid
    ops = prepare(q, k, v, plan, keep_exact_v=True, **call)
    out, mixed = run(ops, plan)
    n = q.shape[-2]
    out, mixed = finish(out, n, plan), finish(mixed, n, plan)
    ref = reference_attention(q, k, v)
    row = {"method": method, **error_metrics(out, ref)}
    ref_norm = ref.norm()
    row["prob_term"] = ((mixed.double() - ref).norm() / ref_norm).item()
    row["value_term"] = ((out.double() - mixed.double()).norm() / ref_norm).item()
    total = row["prob_term"] + row["value_term"]
    row["value_share"] = row["value_term"] / total if total > 0 else 0.0
    return row


def kernel_error_table(q, k, v, methods: Sequence[str], grid=None,
                       options: dict[str, dict] | None = None, progress=None) -> pd.DataFrame:
    options = options or {}
    rows = []
    for method in methods:
        # A variant ('fp8-fa4+hadamard_qk') runs its base method with its flags on; the row
        # keeps the variant's name.
        base, flags = parse_variant(method)
        row = method_error(q, k, v, base, grid=grid, **flags, **options.get(method, {}))
        rows.append({**row, "method": method})
        if progress is not None:
            progress()
    return pd.DataFrame(rows)
