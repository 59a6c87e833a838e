"""What a method is: a name, its quantizers, its options, and how they become a `Plan`.

A method module (methods/*.py) declares one `Method`. The emulation engine (reference/engine.py)
and the GPU backends (backends/) both read the `Plan` that `Method.plan(options)` builds, so they
quantize the same operands the same way.

A `KernelMethod` is the other kind: a callable a user brings (`fn(q, k, v, *, sm_scale,
tensor_layout) -> out`), with no plan and no emulation. It may name the plan it claims to compute
(`claims`), which `vcbench check-kernel` holds it against, and may ask for the call's
`AttentionContext` (the denoising step, the latent grid, the module, the token segments), which
a step-dependent or sparse kernel needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from vcbench.errors import UserError, did_you_mean
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
    """A plan method: quantizers, P encoder, smoothing, declared as data."""

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
                            f"({did_you_mean(unknown[0], sorted(declared))}options: "
                            f"{', '.join(sorted(declared))})")
        return {name: opt.check(self.name, name, given.get(name, opt.default))
                for name, opt in declared.items()}

    def plan(self, given: Mapping[str, Any] | None = None) -> Plan:
        return self.build(self.resolve(given or {}))

    kind = "plan"

    @property
    def uses_vsmooth(self) -> bool:
        """Whether the method groups V by default (the pipeline patch runs the schedule)."""
        return self.plan().vsmooth is not None


@dataclass(frozen=True)
class AttentionContext:
    """Where one attention call sits in a generation, for a kernel that asks for it.

    step / num_steps: the denoising step (0-based) and the run's step count, from the
    scheduler; pass_index: 0 for the first transformer call of a step (conditional), 1 for the
    next (unconditional), ...; grid: the latent (T, H, W) in tokens, or None; module: the
    attention module's name in the pipeline ("transformer.blocks.3.attn1"); segments: token
    counts, {"video": T*H*W} plus {"other": the rest} where the sequence is longer than the
    grid (joint text-video attention packs text tokens with the video's; which end they sit at
    is the model's), or {"all": N} where the grid is unknown."""

    step: int
    num_steps: int
    pass_index: int
    grid: tuple[int, int, int] | None
    module: str
    segments: Mapping[str, int]


@dataclass(frozen=True)
class KernelMethod:
    """An external kernel as a method: `fn(q, k, v, *, sm_scale, tensor_layout, **options
    [, context]) -> out` with the input's shape. No emulation: it runs on the devices it lists
    (`devices`, torch device types), and nowhere else. `claims` names the registered plan
    method (with `claims_options`) whose emulation it says it computes; `context=True` passes
    the call's `AttentionContext` as `context=` (None outside a pipeline). `options` are extra
    keyword arguments the kernel takes, declared as a plan method's are."""

    name: str
    fn: Callable[..., Any]
    summary: str = "external kernel"
    qk_bits: int | None = None
    pv_bits: int | None = None
    smoothing: str = "unknown"
    claims: str | None = None
    claims_options: Mapping[str, Any] = field(default_factory=dict)
    context: bool = False
    devices: tuple[str, ...] = ("cuda",)
    options: Mapping[str, Option] = field(default_factory=dict)
    label: str | None = None  # what runs it, in run records; default: the callable's path

    kind = "external kernel"
    uses_vsmooth = False

    def all_options(self) -> dict[str, Option]:
        return {"sm_scale": COMMON_OPTIONS["sm_scale"], **self.options}

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        return Method.resolve(self, given)  # the same checks, over this kernel's options

    def implementation(self) -> str:
        """`label`, else where the callable lives: module.function (file.py:function for a
        plugin loaded from a file, whose module name is made up)."""
        if self.label:
            return self.label
        fn, module = self.fn, getattr(self.fn, "__module__", None) or "?"
        name = getattr(fn, "__qualname__", type(fn).__name__)
        code = getattr(fn, "__code__", None)
        if module.startswith("vcbench_plugin_") and code is not None:
            return f"{code.co_filename.rsplit('/', 1)[-1]}:{name}"
        return f"{module}.{name}"
