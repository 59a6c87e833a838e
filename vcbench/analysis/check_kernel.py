"""`vcbench check-kernel NAME`: does an external kernel compute the plan it claims?

A plugin's `KernelMethod` may name the plan method it says it computes (`claims`, with
`claims_options`). This runs both on the same synthetic video-like inputs (outliers in Q, K and
V, analysis/synthetic.py) and places the kernel in the first tier it meets:

    bit-exact               every output element equals the emulation's
    matches the plan        within the rule vcbench holds its own GPU kernels to: relative L2
                            to the emulation <= max(4e-3, e/2), and its own error against FP64
                            <= 1.25 e + 1e-3, e the emulation's error against FP64
    as accurate as the plan not the plan's arithmetic, but no less accurate than it
    less accurate           worse than the plan it claims
    non-finite              NaN or inf where the inputs are finite

The first two pass (exit 0); the others fail (exit 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
import torch

from vcbench.errors import UserError

TIERS = ("bit-exact", "matches the plan", "as accurate as the plan", "less accurate",
         "non-finite")
PASSING = TIERS[:2]


@dataclass
class KernelCheck:
    method: str
    claims: str
    label: str
    kernel_vs_emulation: float  # relative L2
    max_abs_vs_emulation: float
    kernel_vs_fp64: float
    emulation_vs_fp64: float
    verdict: str

    @property
    def passed(self) -> bool:
        return self.verdict in PASSING

    def table(self) -> pd.DataFrame:
        return pd.DataFrame([
            {"compared": f"{self.method} vs emulation of {self.claims}",
             "rel L2": self.kernel_vs_emulation, "max abs": self.max_abs_vs_emulation},
            {"compared": f"{self.method} vs FP64", "rel L2": self.kernel_vs_fp64,
             "max abs": math.nan},
            {"compared": f"emulation of {self.claims} vs FP64", "rel L2": self.emulation_vs_fp64,
             "max abs": math.nan},
        ])

    def to_json(self) -> dict:
        return {**self.__dict__, "passed": self.passed, "tiers": list(TIERS)}


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def tier(out: torch.Tensor, emulated: torch.Tensor, reference: torch.Tensor) -> str:
    if not torch.isfinite(out).all():
        return "non-finite"
    if torch.equal(out.float(), emulated.float()):
        return "bit-exact"
    e = rel_l2(emulated, reference)
    own = rel_l2(out, reference)
    accurate = own <= 1.25 * e + 1e-3
    if accurate and rel_l2(out, emulated) <= max(4e-3, 0.5 * e):
        return "matches the plan"
    return "as accurate as the plan" if accurate else "less accurate"


def check_kernel(name: str, heads: int = 2, grid: tuple[int, int, int] = (4, 16, 16),
                 seed: int = 0, device: str | None = None) -> KernelCheck:
    from vcbench.analysis.kernel_error import reference_attention
    from vcbench.analysis.synthetic import synthetic_qkv
    from vcbench.kernels import KernelMethod, attention, get_method

    m = get_method(name)
    if not isinstance(m, KernelMethod):
        raise UserError(f"{name!r} is a plan method, computed by vcbench itself; check-kernel "
                        "holds an external kernel against the plan it claims")
    if m.claims is None:
        raise UserError(f"kernel {name!r} claims no plan (KernelMethod.claims): nothing to "
                        "check it against")
    claimed = get_method(m.claims)
    claimed.resolve(dict(m.claims_options))  # a bad claim fails before any work
    device = device or m.devices[0]
    if device.split(":")[0] not in m.devices:
        raise UserError(f"kernel {name!r} runs on {', '.join(m.devices)}, not {device}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"kernel {name!r} runs on CUDA, and this machine has no CUDA GPU")
    if min(grid) < 1:
        raise UserError(f"--grid needs three positive sizes, got {grid}")
    x = synthetic_qkv(seed=seed, heads=heads, grid=grid)
    q, k, v = (t.to(device) for t in (x.q, x.k, x.v))
    out = attention(q, k, v, name)
    call = {"grid": grid} if "grid" in claimed.all_options() else {}  # V-Smooth's cube order
    emulated = attention(q, k, v, m.claims, backend="emulate", **call, **dict(m.claims_options))
    reference = reference_attention(q, k, v)
    b, h, n, d = q.shape
    return KernelCheck(
        method=name, claims=m.claims,
        label=f"synthetic video-like tensors (B{b} H{h} N{n} D{d}, grid {grid}, seed {seed}) "
              f"on {device}",
        kernel_vs_emulation=rel_l2(out, emulated),
        max_abs_vs_emulation=float((out.double() - emulated.double()).abs().max()),
        kernel_vs_fp64=rel_l2(out, reference), emulation_vs_fp64=rel_l2(emulated, reference),
        verdict=tier(out, emulated, reference))
