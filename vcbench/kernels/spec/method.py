"""What a method is: a name, its quantizers, its options, and how they become a `Plan`.

A method module (methods/*.py) declares one `Method`. The emulation engine
(reference/engine.py) and the GPU backends (backends/) both read the `Plan` that
`Method.plan(options)` builds, so they quantize the same operands the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from vcbench.errors import UserError
from vcbench.kernels.spec.granularity import Quantizer
from vcbench.kernels.spec.probability import PEncoder
from vcbench.kernels.spec.vsmooth import VSmoothConfig

SUPPORTED_HEAD_DIMS = (64, 128)


@dataclass(frozen=True)
class Plan:
    """Everything the engine needs to emulate one method's kernel."""

    q: Quantizer
    k: Quantizer
    v: Quantizer
    p: PEncoder
    # Fold softmax_scale * log2(e) into Q before quantizing (SageAttention's convention: the
    # scores come out of the QK product in log2 units). BF16 FlashAttention scales S instead.
    fold_scale_into_q: bool = True
    smooth_k: bool = False  # subtract K's token mean per (batch, head)
    smooth_q: bool = False  # subtract each Q block's mean; add back (mean_q . K^T) to S in FP32
    hadamard_qk: bool = False
    vsmooth: VSmoothConfig | None = None
    accum: Literal["fp32", "fp22"] = "fp32"
    block_m: int = 128
    block_n: int = 128


@dataclass(frozen=True)
class Option:
    """A declared option: default, help, and what values it takes."""

    default: Any
    help: str
    choices: tuple | None = None
    types: tuple[type, ...] | None = None

    def check(self, method: str, name: str, value: Any) -> Any:
        if self.choices is not None and value not in self.choices:
            allowed = ", ".join(repr(c) for c in self.choices)
            raise UserError(f"method {method!r}: option {name}={value!r} is not one of {allowed}")
        if self.types is not None and value is not None and not isinstance(value, self.types):
            names = " or ".join(t.__name__ for t in self.types)
            raise UserError(f"method {method!r}: option {name} expects {names}, got {type(value).__name__}")
        return value


COMMON_OPTIONS: dict[str, Option] = {
    "block_m": Option(128, "query tile rows (the kernel's BLOCK_M)", choices=(64, 128)),
    "block_n": Option(128, "key/value tile rows (the kernel's BLOCK_N)", choices=(64, 128)),
    "sm_scale": Option(None, "softmax scale; default 1/sqrt(head_dim)", types=(int, float)),
}


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    qk_bits: int
    pv_bits: int
    smoothing: str
    build: Callable[[Mapping[str, Any]], Plan]
    options: Mapping[str, Option] = field(default_factory=dict)

    def all_options(self) -> dict[str, Option]:
        return {**COMMON_OPTIONS, **self.options}

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Defaults filled in; an unknown option or a bad value is a UserError."""
        declared = self.all_options()
        unknown = sorted(set(given) - set(declared))
        if unknown:
            raise UserError(f"method {self.name!r} has no option {unknown[0]!r} "
                            f"(options: {', '.join(sorted(declared))})")
        return {name: opt.check(self.name, name, given.get(name, opt.default))
                for name, opt in declared.items()}

    def plan(self, given: Mapping[str, Any] | None = None) -> Plan:
        return self.build(self.resolve(given or {}))
