"""The method registry and `attention()`, the one entry point for every method and backend.

    vcbench.attention(q, k, v, "vc-8bit")                     # emulation, any device
    vcbench.attention(q, k, v, "sage2-8bit", tensor_layout="NHD", q_granularity="block")
    vcbench.attention(q, k, v, "vc-8bit", rope=(cos, sin))    # q, k before Wan's RoPE

Three layers, imported one way (spec <- reference <- backends), and this module, the only one
that sees all three:
    spec/       what a method is: formats, granularities, P encoders, the Plan, methods/
    reference/  how it is computed: the emulation engine and V-Smooth's algorithms
    backends/   where it runs on a GPU: Triton, the compiled sm90 kernel, external kernels
A method is a plan method (`Method`: its plan runs on the emulation and on every backend that
takes it) or an external kernel (`KernelMethod`: a user's callable, run as it is). Both live in
`METHODS`, the built-ins registered here as a plugin's are (vcbench/registry.py). Method names
are the contract shared by the emulation, the GPU kernels, the CLI and every results table;
nothing below this module dispatches on them, and outside it only `REFERENCE_METHOD` is named.
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
from vcbench.kernels.spec.method import AttentionContext, KernelMethod, Method, Plan
from vcbench.kernels.spec.methods import attnqat, bf16, fp8_fa4, sage2, sage3, vc
from vcbench.kernels.spec.rope import Rope, apply_rope
from vcbench.kernels.spec.vsmooth import Grouping, VSmoothConfig
from vcbench.registry import Registry

METHODS: Registry[Method | KernelMethod] = Registry("method", "vcbench.methods")
METHODS.register_builtins((bf16.METHOD, fp8_fa4.METHOD, sage2.METHOD, sage3.METHOD,
                          attnqat.METHOD, vc.VC_8BIT, vc.VC_8BIT_VSMOOTH, vc.VC_4BIT,
                          vc.VC_8BIT_FP8QK))
# Every fidelity score is against this method's clips and every speedup against its time.
REFERENCE_METHOD = bf16.METHOD.name
LAYOUTS = ("HND", "NHD")
BACKEND_CHOICES = ("emulate", "gpu", "auto")
# Options that are per-call data, not part of the method's plan.
CALL_OPTIONS = ("permutation", "grid", "centroids", "sm_scale")
__all__ = ["METHODS", "REFERENCE_METHOD", "AttentionContext", "KernelMethod", "Method", "Plan",
           "Rope", "attention", "chosen", "describe_method", "get_method", "group", "implementation",
           "implementation_label", "list_methods", "method_table", "register_kernel"]


def list_methods() -> list[str]:
    return METHODS.names()


def get_method(name: str) -> Method | KernelMethod:
    return METHODS.get(name)


def register_kernel(name: str, fn, **fields: Any) -> KernelMethod:
    """Register `fn(q, k, v, *, sm_scale, tensor_layout) -> out` as the method `name` (see
    `KernelMethod` for the fields: claims, context, devices, options, summary, bits)."""
    return METHODS.register(KernelMethod(name=name, fn=fn, **fields))


def implementation(method: Method | KernelMethod | str, options: dict | None = None) -> str | None:
    """The name of what runs `method` (with `options`) with backend='gpu' here, or None."""
    m = get_method(method) if isinstance(method, str) else method
    if isinstance(m, KernelMethod):
        return m.implementation() if _kernel_reason(m, "cuda") is None else None
    chosen = backends.select(m.plan(options or {}))
    return None if chosen is None else chosen.name


def implementation_label(method: Method | str, options: dict, backend: str, on_cuda: bool) -> str:
    """What computes `method` with `options` under `backend` ("emulate", "gpu", "auto") on
    this machine, for a run's records: "emulate", or the GPU backend's name (the NVFP4 kernel's
    results keep their label)."""
    m = get_method(method) if isinstance(method, str) else method
    if isinstance(m, KernelMethod):
        return m.implementation()  # it runs its callable whatever the backend choice
    if backend == "emulate" or not on_cuda:
        return "emulate"
    return implementation(m, options) or "emulate"


def rope_placement(method: Method | KernelMethod | str, options: dict, backend: str,
                   on_cuda: bool) -> str:
    """Where RoPE handed to `method` (`attention(..., rope=...)`) runs here under `backend`:
    "quantizers" (the GPU backend that runs the plan rotates q and k on load) or "eager" (they
    are rotated first: the emulation, a backend without the fusion, an external kernel)."""
    m = get_method(method) if isinstance(method, str) else method
    if isinstance(m, KernelMethod) or backend == "emulate" or not on_cuda:
        return "eager"
    return "quantizers" if fuses_rope(backends.select(m.plan(options or {}))) else "eager"


def gpu_kernels(plan: Plan) -> list[tuple[str, str | None]]:
    """The GPU backends that compute `plan`, in priority order, each with None (it runs here)
    or why not (one backend list decides this and `attention`'s choice)."""
    return [(b.name, b.available()) for b in backends.BACKENDS.values()
            if b.supports(plan, None) is None]


def operand_formats(plan: Plan) -> tuple[str, str]:
    """(QK, PV) as "format/granularity" pairs, e.g. ("int8/warp16", "e4m3/channel")."""
    def one(x) -> str:
        g = type(x.granularity).__name__
        short = {"Unscaled": "", "PerTensor": "tensor", "PerChannel": "channel",
                 "Microscale16": "mx16"}.get(g)
        if short is None:  # PerBlock / PerWarp
            short = ("warp" if g == "PerWarp" else "block") + str(x.granularity.rows)
        return x.fmt.name + (f"/{short}" if short else "")
    qk = one(plan.q) if plan.q == plan.k else f"{one(plan.q)}, {one(plan.k)}"
    return (qk + (" +H" if plan.hadamard_qk else ""), f"{one(plan.v)}; P {plan.p.describe()}")


def describe_method(name: str) -> dict[str, Any]:
    """What a run records of a method, so a report can render its rows where the method (a
    plugin's) cannot be imported: kind, bits, formats, smoothing, where it came from."""
    m = get_method(name)
    out: dict[str, Any] = {"method": m.name, "kind": m.kind, "summary": m.summary,
                           "qk_bits": m.qk_bits, "pv_bits": m.pv_bits, "smoothing": m.smoothing,
                           "vsmooth": m.uses_vsmooth, "origin": METHODS.origin(name).describe()}
    if isinstance(m, KernelMethod):
        out.update(implementation=m.implementation(), claims=m.claims, devices=list(m.devices))
    else:
        out["qk"], out["pv"] = operand_formats(m.plan())
    return out


def method_table() -> list[dict[str, Any]]:
    """One row per method, narrow enough for a 100-column terminal (`vcbench methods NAME`
    gives the rest): QK and PV formats (format, scale granularity; +H: Hadamard-rotated),
    P's encoding, the smoothing, what runs it here and where it came from."""
    rows = []
    for name, m in METHODS.items():
        origin = METHODS.origin(name)
        where = "built-in" if origin.builtin else origin.source.split(" ")[0].rsplit("/", 1)[-1]
        if isinstance(m, KernelMethod):
            here = [d for d in m.devices if _kernel_reason(m, d) is None]
            rows.append({"method": name, "kind": "kernel",
                         "QK": f"{m.qk_bits}-bit" if m.qk_bits else "?",
                         "PV": f"{m.pv_bits}-bit" if m.pv_bits else "?", "P": "?",
                         "smoothing": "?", "runs here": ",".join(here) or "no", "from": where})
            continue
        plan = m.plan()
        gpu = backends.select(plan)
        rows.append({"method": name, "kind": "plan", "QK": _short_qk(plan),
                     "PV": _short_format(plan.v), "P": _short_p(plan.p),
                     "smoothing": _short_smoothing(plan),
                     "runs here": "emulate" if gpu is None else (gpu.aliases or (gpu.name,))[0],
                     "from": where})
    return rows


def _short_format(x) -> str:
    g = x.granularity
    short = {"Unscaled": "", "PerTensor": "tensor", "PerChannel": "ch", "PerWarp": f"w{getattr(g, 'rows', '')}",
             "PerBlock": f"b{getattr(g, 'rows', '')}", "Microscale16": "mx16"}[type(g).__name__]
    return f"{x.fmt.name} {short}".strip()


def _short_qk(plan: Plan) -> str:
    q, k = _short_format(plan.q), _short_format(plan.k)
    fmt = q if q == k else q + "/" + k.split(" ", 1)[-1]
    return fmt + (" +H" if plan.hadamard_qk else "")


def _short_p(p) -> str:
    name = type(p).__name__
    if name == "ExpCast":
        return "expcast"
    if name == "NVFP4Probability":
        return "nvfp4 2-lvl" if p.two_level else "nvfp4"
    return f"exp2>{p.fmt.name}"


def _short_smoothing(plan: Plan) -> str:
    parts = [n for n, on in (("K", plan.smooth_k), ("Q", plan.smooth_q),
                             ("V-Smooth", plan.vsmooth is not None)) if on]
    return "+".join(parts) or "none"


def method_details(name: str) -> dict[str, Any]:
    """Everything `vcbench methods NAME` shows: the record, the options with their defaults
    and help, and each GPU kernel that computes the plan with why it does or does not run."""
    m = get_method(name)
    d = describe_method(name)
    d["options"] = [{"option": o, "default": _plain(opt.default), "help": opt.help,
                     **({"choices": list(opt.choices)} if opt.choices else {})}
                    for o, opt in m.all_options().items()]
    if isinstance(m, KernelMethod):
        d["runs"] = {dev: _kernel_reason(m, dev) for dev in m.devices}
    else:
        costs = {b.name: b.cost for b in backends.BACKENDS.values()}
        d["gpu_kernels"] = [{"backend": b, "runs_here": why is None, "why_not": why,
                             "cost": costs.get(b) or None}
                            for b, why in gpu_kernels(m.plan())]
    return d


def _plain(x: Any) -> Any:
    return list(x) if isinstance(x, tuple) else x


class Chosen:
    """What runs one plan method's calls (or an external kernel) on inputs of one shape here,
    split as the paper times it: `prepare` (the fused preprocessing; None for a kernel that
    does everything in one call) and `kernel` (the attention on prepared operands), or `run`,
    the whole call. `vcbench timeit` times these halves."""

    def __init__(self, method: Method | KernelMethod, options: dict | None, shape: tuple[int, ...]):
        self.method, self.options = method, dict(options or {})
        if isinstance(method, KernelMethod):
            self.plan, self.backend = None, None
            self.implementation = method.implementation()
            why = _kernel_reason(method, "cuda")
        else:
            self.plan = method.plan(self.options)
            self.backend = backends.select(self.plan, shape)
            self.implementation = None if self.backend is None else self.backend.name
            why = None if self.backend else backends.why_none(self.plan, shape, among=method.plan())
        if why is not None:
            raise UserError(f"no GPU kernel for {method.name!r} on this machine ({why})")
        # whether `prepare` takes q, k before RoPE with a `rope=` (else rotate them first)
        self.fuses_rope = fuses_rope(self.backend)
        self.prepare = (None if self.backend is None or self.backend.prepare is None else
                        lambda q, k, v, **call: self.backend.prepare(q, k, v, self.plan, **call))
        self.kernel = (None if self.prepare is None else
                       lambda ops, out: self.backend.run_prepared(ops, self.plan, out))

    def run(self, q, k, v, **call) -> torch.Tensor:
        if self.backend is None:
            return _run_kernel(self.method, q, k, v, "HND", {**self.options, **call})
        return self.backend.run(q, k, v, self.plan, call)


def chosen(method: str, options: dict | None, shape: tuple[int, ...]) -> Chosen:
    """The implementation `attention(..., backend="gpu")` would run for (B, H, N, D) `shape`
    inputs here; no GPU kernel is a UserError saying why."""
    return Chosen(get_method(method), options, shape)


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
              tensor_layout: str = "HND", backend: str = "emulate", rope=None,
              **options: Any) -> torch.Tensor:
    """Non-causal self-attention computed as `method`'s kernel computes it.

    q, k, v: (B, H, N, D) for HND or (B, N, H, D) for NHD, one shape, head dim 64 or 128, any
    N (padded internally to the tiles; padding never changes the result). Returns attention in
    the input dtype and layout. Options are the method's (see `vcbench methods` and
    docs/methods.md); an unknown option is an error. backend: "emulate" (any device), "gpu"
    (the first GPU backend that takes the plan; an error if none does) or "auto" (that backend
    for CUDA inputs it takes, else the emulation).

    rope: (cos, sin), Wan's RoPE tables ((N, D), or 4-D broadcast over batch and heads in q's
    layout; `spec.rope`): q and k are given before RoPE, and the result is exactly that of
    rotating them as diffusers does, then calling the method. The 8-bit Triton quantizers apply
    the rotation on load (`fuses_rope`); every other implementation, and an external kernel,
    gets q and k rotated first.
    """
    m = get_method(method)
    if tensor_layout not in LAYOUTS:
        raise UserError(f"tensor_layout must be one of {', '.join(LAYOUTS)}, got {tensor_layout!r}")
    if backend not in BACKEND_CHOICES:
        raise UserError(f"backend must be one of {', '.join(BACKEND_CHOICES)}, got {backend!r}")
    check_inputs(q, k, v)
    rotary = None if rope is None else Rope.from_tables(rope, tuple(q.shape), tensor_layout)
    if isinstance(m, KernelMethod):  # the user's callable, whatever the backend choice
        if rotary is not None:
            q, k = _rotated(q, k, rotary, tensor_layout)
        return _run_kernel(m, q, k, v, tensor_layout, options)
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
        if rotary is not None and not fuses_rope(chosen, rotary):
            q, k, rotary = apply_rope(q, rotary), apply_rope(k, rotary), None
        out = chosen.run(q, k, v, plan, call if rotary is None else {**call, "rope": rotary})
    else:  # the emulation groups V itself (torch's k-means on the FP32 values) when asked to
        out = emulate(q, k, v, plan, rope=rotary, **call)
    return out.transpose(1, 2) if tensor_layout == "NHD" else out


def fuses_rope(backend: backends.Backend | None, rope: Rope | None = None) -> bool:
    """Whether `backend` applies RoPE inside its Q and K quantizers (with these tables); the
    emulation (None) applies it eagerly first, as a pipeline does: the oracle of the fusion."""
    return (backend is not None and backend.fused_rope
            and (rope is None or rope.fusable()))


def _rotated(q, k, rope: Rope, layout: str):
    """q and k rotated by `rope` eagerly, in their layout."""
    if layout == "NHD":
        return (apply_rope(x.transpose(1, 2), rope).transpose(1, 2) for x in (q, k))
    return apply_rope(q, rope), apply_rope(k, rope)


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """One dtype and one device for q, k and v: a mix is a caller's mistake that a kernel would
    otherwise cast or reject in its own words (no silent promotion: bf16 q with fp32 k would
    run the emulation at fp32 and a GPU kernel at bf16)."""
    if not (q.dtype == k.dtype == v.dtype):
        raise UserError(f"q, k and v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise UserError(f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}")
    if not (q.dim() == k.dim() == v.dim() == 4):
        raise UserError(f"q, k and v must be 4-D, got {q.dim()}-D, {k.dim()}-D, {v.dim()}-D")


def check_runnable(method: str, device_type: str) -> None:
    """A UserError, before any work, where `method` cannot run on `device_type` here: an
    external kernel for other devices (a plan method runs everywhere: the emulation)."""
    m = get_method(method)
    if isinstance(m, KernelMethod):
        why = _kernel_reason(m, device_type)
        if why is not None:
            raise UserError(f"method {method!r} is an external kernel that cannot run on "
                            f"{device_type} here ({why})")


def _kernel_reason(m: KernelMethod, device_type: str) -> str | None:
    """Why external kernel `m` cannot run on `device_type` here, or None."""
    if device_type not in m.devices:
        return f"it runs on {', '.join(m.devices)} only"
    if device_type == "cuda" and not torch.cuda.is_available():
        return "no CUDA GPU"
    return None


def _run_kernel(m: KernelMethod, q, k, v, tensor_layout: str, options: dict) -> torch.Tensor:
    context = options.get("context")
    opts = m.resolve({n: x for n, x in options.items() if n != "context"})
    why = _kernel_reason(m, q.device.type)
    if why is not None:
        raise UserError(f"method {m.name!r} is an external kernel that cannot run on "
                        f"{q.device.type} tensors here ({why})")
    scale = opts.pop("sm_scale")
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    extra = {"context": context} if m.context else {}
    out = m.fn(q, k, v, sm_scale=scale, tensor_layout=tensor_layout, **opts, **extra)
    if not isinstance(out, torch.Tensor) or out.shape != q.shape:
        got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise UserError(f"kernel {m.name!r} returned {got}, not a tensor of q's shape "
                        f"{tuple(q.shape)}")
    return out.to(q.dtype)
