"""`vcbench.patch(pipe, method, **options)`: route a pipeline's attention through a method.

How the swap works, and why this way:

* diffusers' attention processors end in `dispatch_attention_fn`, whose `native` backend
  calls `torch.nn.functional.scaled_dot_product_attention` on post-RoPE (B, H, N, D) tensors.
  diffusers has no public way to register a backend of our own (the backend name must be a
  member of its enum), so instead of editing its registry the patch puts forward hooks on
  every attention module of the transformer(s). While one of those modules runs, a
  `TorchFunctionMode` catches its SDPA call and computes it with `vcbench.attention`.
  Nothing in diffusers is modified, and the same hook works for any model whose attention
  module ends in SDPA (packed text-video joint attention included: it is one SDPA call).
* A processor pinned to another backend (flash, sage...) would never reach SDPA, so for the
  duration of the patch such a module gets a copy of its processor pinned to `native`.
* Wan's self-attention hands RoPE to the method (`wan_rope.py`): for the duration of the
  patch a module whose processor is diffusers' `WanAttnProcessor` gets a processor that
  computes q, k, v as diffusers does up to RoPE and routes them before RoPE, with the RoPE
  tables, through the same op as the SDPA hook (`vcbench.attention(..., rope=...)`: the same
  result as rotating first; the 8-bit Triton quantizers rotate on load, as the paper's fused
  preprocessing does). Every other model's RoPE is applied by the pipeline before SDPA.
  `rope_paths(pipe)` says which transformer takes which path; a run records it.
* Attention modules outside diffusers are found by class (`SDPA_CORES`): their attention core,
  a method taking post-RoPE (B, H, N, D) q, k, v, calls flash-attn or xformers rather than SDPA,
  so for the duration of the patch the module gets an instance attribute of that name computing
  the same attention with SDPA, which the same hooks then route. LongCat-Video's
  `Attention._process_attn` is the one registered; its denoiser is the pipeline's `dit`.
* Self-attention goes through the method; cross-attention (different query/key lengths, a
  module flagged `is_cross_attention`, or, for a module without that flag such as LTX-Video's,
  a call given `encoder_hidden_states` that the module does not project itself) stays on plain
  SDPA unless `route_cross=True`. Shapes alone cannot tell: a text as long as the video would
  pass for self-attention.
* A boolean mask (HunyuanVideo-1.5 masks padded text tokens) is honoured by running the
  method on the valid tokens only; the padded rows, which the model discards, keep SDPA.
* The step index comes from the scheduler: every diffusers scheduler counts its own steps
  (`scheduler.step_index`, None before the first `step()`), and the pipeline calls the
  transformer for step i before stepping, so reading it at the first attention call of each
  transformer call (`vcbench::patch_begin`, below) gives the step of that call. The
  number of steps is `len(scheduler.timesteps)`. No pipeline callback is taken over, and a
  model with two experts (Wan2.2) shares the one scheduler.
* The latent grid (T, H, W) is the transformer input's (frames, height, width) divided by the
  transformer's patch size, read in a pre-hook on each transformer.
* An external kernel that asks for it (`KernelMethod.context`) gets each call's
  `AttentionContext`: the step and step count, the CFG pass, the grid, the module's name and
  the token segments (the grid's video tokens, and the rest of a joint sequence).
* Under torch.compile the hooks and the mode are traced; what depends on the run's progress
  is not. A transformer call's first attention call starts with one custom op
  (`vcbench::patch_begin`: it reads the scheduler when it runs) and each routed call is
  another (`vcbench::patched_attention`: the counters, the observer, the grouping schedule,
  k-means and the method, all when it runs; `vcbench::plain_attention` for the calls left on
  SDPA), each taking patch_begin's empty result so the order holds in any graph. So a compiled
  transformer is one graph for every step and every schedule action (regroup / reuse /
  plain), and the k-means of a regroup step runs outside the graph by design. Eager, the
  ops run the same code at once: outputs are the same bits.

`restore()` (or leaving the `with` block) removes every hook and puts back the original
processor objects, so the pipeline is exactly as it was.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from vcbench.errors import UserError
from vcbench.kernels import AttentionContext, KernelMethod, attention, get_method, group
from vcbench.kernels.spec.rope import Rope, apply_rope
from vcbench.kernels.spec.vsmooth import PLAIN_STEP_OPTIONS, Grouping, GroupingSchedule
from vcbench.pipelines.wan_rope import WanRopeProcessor, takes_over

# Attention modules outside diffusers, by (module, class): the method computing attention from
# post-RoPE (B, H, N, D) q, k, v (with the module's `scale`). Only self-attention is listed.
SDPA_CORES: dict[tuple[str, str], str] = {
    # LongCat-Video: `_process_attn(q, k, v, shape)` calls block-sparse attention, FlashAttention
    # 3/2 or xformers, inside a Ulysses wrapper that is the identity at context-parallel size 1
    # (the only size vcbench runs). Its cross-attention (packed variable-length text) is separate.
    ("longcat_video.modules.attention", "Attention"): "_process_attn",
}
# Options of the patch itself (the rest go to the method).
SCHEDULE_OPTIONS = {
    "schedule_placement": "placement",
    "schedule_fraction": "fraction",
    "schedule_refresh_every": "refresh_every",
    "schedule_after_window": "after_window",
}
_SDPA = F.scaled_dot_product_attention
# The ops name their patch by a number (a custom op's schema takes no Python objects).
_PATCHES: weakref.WeakValueDictionary[int, AttentionPatch] = weakref.WeakValueDictionary()
_NEXT_ID = itertools.count()
# A replayed CUDA graph would skip the ops' Python bodies (the scheduler read, the schedule,
# the counters), so Inductor's cudagraphs must not capture them.
_STATEFUL = tuple(t for t in (getattr(torch.Tag, "cudagraph_unsafe", None),) if t is not None)


@torch.library.custom_op("vcbench::patch_begin", mutates_args=(), tags=_STATEFUL)
def _patch_begin(x: torch.Tensor, patch: int, grid: list[int] | None) -> torch.Tensor:
    _PATCHES[patch]._begin(None if grid is None else tuple(grid))
    return x.new_empty(0)


@_patch_begin.register_fake
def _(x, patch, grid):
    return x.new_empty(0)


@torch.library.custom_op("vcbench::patched_attention", mutates_args=(), tags=_STATEFUL)
def _patched_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       attn_mask: torch.Tensor | None, begun: torch.Tensor, patch: int,
                       route: torch.Tensor, scale: float | None,
                       rope_cos: torch.Tensor | None = None,
                       rope_sin: torch.Tensor | None = None) -> torch.Tensor:
    # `begun` (patch_begin's result) is unused here: it orders this call after patch_begin.
    # rope_cos / rope_sin: q and k come before RoPE (a module whose RoPE the patch took over)
    return _PATCHES[patch]._routed_call(int(route), q, k, v, attn_mask, scale, rope_cos,
                                        rope_sin).contiguous()


@_patched_attention.register_fake
def _(q, k, v, attn_mask, begun, patch, route, scale, rope_cos=None, rope_sin=None):
    return q.new_empty(q.shape)


# A call left on SDPA (cross-attention) is an op too, only so that counting it happens when
# it runs: a counter bumped in traced code is a guard on its value, a recompile every call.
@torch.library.custom_op("vcbench::plain_attention", mutates_args=(), tags=_STATEFUL)
def _plain_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     attn_mask: torch.Tensor | None, begun: torch.Tensor, patch: int,
                     route: torch.Tensor, dropout_p: float, is_causal: bool, scale: float | None,
                     enable_gqa: bool) -> torch.Tensor:
    patched = _PATCHES[patch]
    patched.plain[patched._route_list[int(route)].name] += 1
    return _SDPA(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                 scale=scale, enable_gqa=enable_gqa)


@_plain_attention.register_fake
def _(q, k, v, attn_mask, begun, patch, route, dropout_p, is_causal, scale, enable_gqa):
    # SDPA's own meta function: the fake has the strides the real call returns
    return _SDPA(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                 scale=scale, enable_gqa=enable_gqa)


@dataclass
class _RunState:
    """What the pre-hook on the transformer learned about the current forward pass."""

    step: int = 0
    num_steps: int = 1
    pass_index: int = 0  # 0 = first transformer call of this step (cond), 1 = uncond, ...
    grid: tuple[int, int, int] | None = None
    started: bool = False


@dataclass
class _Route:
    """One attention module. `key` names it to the ops: a CPU int64 scalar, not the name as a
    string, because a traced string is a constant Dynamo guards on, and regional compilation
    (one compiled block serving every block, diffusers' `compile_repeated_blocks`) would then
    recompile once per block; a tensor is a graph input, guarded on its metadata only, and a
    CPU one is read without a device sync."""

    name: str
    cross: bool
    key: torch.Tensor


class _Intercept(TorchFunctionMode):
    """Active only while a hooked attention module runs: its SDPA call goes to the patch."""

    def __init__(self, patch: AttentionPatch, route: _Route, cross: bool) -> None:
        super().__init__()
        self.patch, self.route, self.cross = patch, route, cross

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is _SDPA:
            return self.patch._sdpa(self.route, self.cross, *args, **kwargs)
        if args and isinstance(args[0], torch.Tensor) and _is_python_tensor_method(func):
            # A Tensor method written in Python (torch/_tensor.py's unflatten, split, ...) called
            # as a function is inlined by Dynamo, and torch 2.11's cannot trace the
            # `super().name(...)` it ends in; called on the tensor it is a tensor method call,
            # which Dynamo knows. Eager it is the same call (the mode is off in its handler).
            return getattr(args[0], func.__name__)(*args[1:], **kwargs)
        return func(*args, **kwargs)


@dataclass
class AttentionPatch:
    pipe: Any
    method: str
    backend: str = "emulate"
    route_cross: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    fuse_rope: bool = True  # False: Wan's RoPE stays in the pipeline (the A/B of the fusion)
    schedule_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        m = get_method(self.method)
        m.resolve(self.options)  # unknown options and bad values fail now, not mid-run
        kernel = isinstance(m, KernelMethod)
        self.vsmooth = None if kernel else m.plan(self.options).vsmooth
        self.wants_context = kernel and m.context
        self.routed: Counter[str] = Counter()  # calls computed by the method, per module
        self.plain: Counter[str] = Counter()  # calls left on SDPA (cross-attention)
        self.rope_routed: Counter[str] = Counter()  # routed calls given q, k before RoPE
        self.rope_unfusable: Counter[str] = Counter()  # of those, with tables no kernel fuses
        self._rope_taken: set[str] = set()  # transformers whose RoPE this patch took over
        self.actions: dict[int, str] = {}  # step -> grouping action taken (V-Smooth methods)
        self.regroups: Counter[int] = Counter()  # step -> groupings computed (k-means runs)
        self.groupings: dict[tuple[str, int], Grouping] = {}
        self.state = _RunState()
        self._handles: list = []
        self._saved_processors: dict[torch.nn.Module, Any] = {}
        self._pinned_cores: list[tuple[torch.nn.Module, str]] = []
        self._modes: list[_Intercept] = []
        self._route_list: list[_Route] = []  # by key
        self._begun: torch.Tensor | None = None  # patch_begin's result for the current call
        self._grid: tuple[int, int, int] | None = None
        self._id = next(_NEXT_ID)
        _PATCHES[self._id] = self
        self._applied = False
        # Called as observe(name, step, pass_index, q, k, v, grid) before each routed call
        # (vcbench capture uses it to save the post-RoPE tensors).
        self.observe = None

    # -- install / remove ----------------------------------------------------------------

    def apply(self) -> AttentionPatch:
        if self._applied:
            return self
        transformers = denoisers(self.pipe)
        if not transformers:
            raise UserError(f"{type(self.pipe).__name__} has no transformer to patch")
        for tname, model in transformers.items():
            self._handles.append(model.register_forward_pre_hook(self._on_transformer,
                                                                 with_kwargs=True))
            # An attention module that raises skips its forward hook, leaving its mode on; this
            # one runs even then, before any code after the transformer can call SDPA. (The
            # attention modules' own hooks are not always_call: that is a guard on each hook's
            # id, so a compiled block would recompile for every other block.)
            self._handles.append(model.register_forward_hook(self._unwind, always_call=True))
            for mname, module in model.named_modules():
                core = _sdpa_core(module)
                if core is None and not _is_attention(module):
                    continue
                if core is not None and self.route_cross:
                    self.restore()
                    raise UserError(f"route_cross: {type(module).__name__} modules ({tname}.{mname}) are "
                                    "routed as self-attention only; this model's cross-attention cannot be")
                route = _Route(f"{tname}.{mname}", bool(getattr(module, "is_cross_attention", False)),
                               torch.tensor(len(self._route_list), device="cpu"))
                self._route_list.append(route)
                if core is not None:
                    self._pin_sdpa(module, core)
                else:
                    self._pin_native(module)
                    if self.fuse_rope and takes_over(module):
                        self._take_rope(module, route)
                        self._rope_taken.add(tname)
                self._handles.append(module.register_forward_pre_hook(
                    self._enter(route, _context_position(module)), with_kwargs=True))
                self._handles.append(module.register_forward_hook(self._leave))
        self._applied = True
        return self

    def restore(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for module, processor in self._saved_processors.items():  # the original objects
            module.processor = processor
        self._saved_processors.clear()
        for module, name in self._pinned_cores:  # the class's own method shows again
            module.__dict__.pop(name, None)
        self._pinned_cores.clear()
        self._unwind(None, None, None)  # a patch removed mid-call (an exception in a hook)
        self._route_list.clear()
        self._rope_taken.clear()
        self._begun = self._grid = None
        self._applied = False

    def rope_paths(self) -> dict[str, str]:
        """`rope_paths` of this patch as applied: "fused" where it took the RoPE over."""
        return {name: "fused" if name in self._rope_taken else "outside"
                for name in denoisers(self.pipe)}

    def __enter__(self) -> AttentionPatch:
        return self.apply()

    def __exit__(self, *exc) -> None:
        self.restore()

    def reset(self) -> None:
        """Forget cached groupings and counters (a new clip)."""
        self.groupings.clear()
        self.actions.clear()
        self.regroups.clear()
        self.routed.clear()
        self.plain.clear()
        self.rope_routed.clear()
        self.rope_unfusable.clear()
        self.state = _RunState()

    def _pin_native(self, module: torch.nn.Module) -> None:
        processor = getattr(module, "processor", None)
        backend = getattr(processor, "_attention_backend", None)
        if backend is None or str(getattr(backend, "value", backend)) == "native":
            return
        pinned = copy.copy(processor)
        pinned._attention_backend = "native"
        self._saved_processors[module] = processor
        module.processor = pinned

    def _take_rope(self, module: torch.nn.Module, route: _Route) -> None:
        """The module's processor hands q, k before RoPE and the tables to the routed call."""
        processor = module.processor
        self._saved_processors.setdefault(module, processor)

        def routed(q, k, v, mask, cos, sin):
            return self._sdpa(route, False, q, k, v, attn_mask=mask, rope=(cos, sin))
        module.processor = WanRopeProcessor(processor, routed)

    def _pin_sdpa(self, module: torch.nn.Module, name: str) -> None:
        def core(q, k, v, *args, **kwargs):
            return F.scaled_dot_product_attention(q, k, v, scale=getattr(module, "scale", None))
        module.__dict__[name] = core
        self._pinned_cores.append((module, name))

    # -- hooks ------------------------------------------------------------------------------

    def _on_transformer(self, model, args, kwargs):
        # Only Python here: torch.compile(transformer) runs hooks as a frame of their own, so a
        # tensor op here would be a second graph per call. The grid is static under a trace
        # (shapes and config); the scheduler is read by patch_begin when it runs, at the first
        # attention call (inside the transformer's graph).
        self._grid = latent_grid(model, args, kwargs)
        self._begun = None

    def _begin(self, grid: tuple[int, int, int] | None) -> None:
        """A transformer call starts: the step and CFG pass from the scheduler, the grid."""
        scheduler = getattr(self.pipe, "scheduler", None)
        step = getattr(scheduler, "step_index", None)
        step = 0 if step is None else int(step)
        timesteps = getattr(scheduler, "timesteps", None)
        num_steps = len(timesteps) if timesteps is not None else step + 1
        s = self.state
        if s.started and step < s.step:  # a new run of the pipeline with the same patch
            self.reset()
            s = self.state
        s.pass_index = s.pass_index + 1 if s.started and step == s.step else 0
        s.step, s.num_steps, s.started = step, max(num_steps, step + 1), True
        s.grid = grid

    def _enter(self, route: _Route, context_position: int | None):
        def hook(module, args, kwargs):
            cross = route.cross
            if not cross and context_position is not None:  # this call says (`_context_position`)
                context = kwargs.get("encoder_hidden_states")
                if context is None and 0 <= context_position < len(args):
                    context = args[context_position]
                cross = context is not None
            mode = _Intercept(self, route, cross)
            mode.__enter__()
            self._modes.append(mode)
        return hook

    def _leave(self, module, args, output):
        if self._modes:
            self._modes.pop().__exit__(None, None, None)

    def _unwind(self, model, args, output):
        while self._modes:  # only after an attention module raised
            self._modes.pop().__exit__(None, None, None)

    # -- the attention call -------------------------------------------------------------------

    def _sdpa(self, route: _Route, cross: bool, query, key, value, attn_mask=None, dropout_p=0.0,
              is_causal=False, scale=None, enable_gqa=False, rope=None):
        """One attention call of a hooked module; `rope` (cos, sin): query and key come before
        RoPE (`_take_rope`), which the method applies, or this, for a call left on SDPA."""
        same_shape = query.shape == key.shape == value.shape
        plain = (cross and not self.route_cross) or not same_shape or is_causal or dropout_p
        if plain:
            if cross and self.route_cross and not same_shape:
                raise UserError(f"route_cross: {route.name} attends {query.shape[-2]} queries to "
                                f"{key.shape[-2]} keys; the methods take self-attention only")
            if rope is not None:
                tables = Rope.from_tables(rope, tuple(query.shape), "HND")
                query, key, rope = apply_rope(query, tables), apply_rope(key, tables), None
        if self._begun is None:  # the first attention call of this transformer call
            grid = self._grid
            self._begun = torch.ops.vcbench.patch_begin(query, self._id,
                                                        None if grid is None else list(grid))
        if plain:
            return torch.ops.vcbench.plain_attention(
                query, key, value, attn_mask, self._begun, self._id, route.key, float(dropout_p),
                bool(is_causal), None if scale is None else float(scale), bool(enable_gqa))
        cos, sin = (None, None) if rope is None else rope
        return torch.ops.vcbench.patched_attention(query, key, value, attn_mask, self._begun,
                                                   self._id, route.key,
                                                   None if scale is None else float(scale),
                                                   cos, sin)

    def _routed_call(self, index: int, query, key, value, attn_mask, scale, cos=None, sin=None):
        """The body of `vcbench::patched_attention`: runs when the call runs, never traced."""
        route = self._route_list[index]
        self.routed[route.name] += 1
        rope = None
        if cos is not None:
            self.rope_routed[route.name] += 1
            rope = Rope.from_tables((cos, sin), tuple(query.shape), "HND")
            if not rope.fusable():  # not FP32: every implementation rotates first
                self.rope_unfusable[route.name] += 1
            if self.observe is not None or attn_mask is not None:
                # the observer saves post-RoPE tensors; a masked call slices them by token
                query, key, rope = apply_rope(query, rope), apply_rope(key, rope), None
        if self.observe is not None:
            s = self.state
            self.observe(route.name, s.step, s.pass_index, query, key, value, s.grid)
        if attn_mask is None:
            return self._method(route, query, key, value, scale, rope)
        return self._masked(route, query, key, value, attn_mask, scale)

    def _masked(self, route, query, key, value, attn_mask, scale):
        if attn_mask.dtype != torch.bool:
            raise UserError(f"{route.name}: only boolean attention masks can be routed")
        mask = attn_mask.expand(query.shape[0], -1, query.shape[-2], key.shape[-2])
        # Keys that any query may see; the model's masks are symmetric (valid_i & valid_j).
        valid = mask.any(dim=(1, 2))
        out = torch.empty_like(query)
        for b in range(query.shape[0]):
            idx = valid[b].nonzero().squeeze(1)
            sl = (slice(b, b + 1), slice(None), idx)
            out[sl] = self._method(route, query[sl], key[sl], value[sl], scale)
            pad = (~valid[b]).nonzero().squeeze(1)
            if len(pad):  # rows the model throws away: keep them as SDPA computes them
                rows = (slice(b, b + 1), slice(None), pad)
                out[rows] = _SDPA(query[rows], key[b:b + 1], value[b:b + 1],
                                  attn_mask=mask[b:b + 1, :, pad], scale=scale)
        return out

    def _method(self, route: _Route, q, k, v, scale, rope: Rope | None = None):
        opts = dict(self.options)
        if scale is not None:
            opts["sm_scale"] = float(scale)
        if self.vsmooth is not None:
            opts.update(self._grouping_options(route, v))
        if self.wants_context:
            opts["context"] = self.context(route.name, q.shape[-2])
        return attention(q, k, v, self.method, tensor_layout="HND", backend=self.backend,
                         rope=rope, **opts)

    def context(self, module: str, tokens: int) -> AttentionContext:
        """Where the current call sits: step, pass, grid, module and token segments."""
        s = self.state
        segments = {"all": tokens}
        if s.grid is not None:
            video = s.grid[0] * s.grid[1] * s.grid[2]
            if video <= tokens:
                segments = {"video": video, **({"other": tokens - video} if tokens > video else {})}
        return AttentionContext(step=s.step, num_steps=s.num_steps, pass_index=s.pass_index,
                                grid=s.grid, module=module, segments=segments)

    def _grouping_options(self, route: _Route, v: torch.Tensor) -> dict[str, Any]:
        s = self.state
        schedule = GroupingSchedule(s.num_steps, **self.schedule_options)
        action = schedule.action(s.step)
        self.actions[s.step] = action
        if action == "plain":
            return dict(PLAIN_STEP_OPTIONS)
        key = (route.name, s.pass_index)
        cached = self.groupings.get(key)
        fits = cached is not None and cached.permutation.shape == v.shape[:-1]
        if action == "reuse" and fits:
            return {"permutation": cached.permutation}
        init = cached.centroids if fits else None  # warm start from the last grouping
        grouping = group(v, self.vsmooth, grid=s.grid, init=init)
        self.regroups[s.step] += 1
        self.groupings[key] = grouping
        return {"permutation": grouping.permutation}


def patch(pipe: Any, method: str, backend: str = "emulate", route_cross: bool = False,
          fuse_rope: bool = True, **options: Any) -> AttentionPatch:
    """Route `pipe`'s attention through `method`; use as a context manager or call
    `.restore()`. Options named `schedule_*` set the grouping schedule (placement, fraction,
    refresh_every, after_window); the others are the method's own options. `fuse_rope`: hand
    Wan's RoPE to the method (the default; the same clip, RoPE inside the quantizers where
    the kernel fuses it) or leave it in the pipeline."""
    schedule = {SCHEDULE_OPTIONS[k]: options.pop(k) for k in list(options) if k in SCHEDULE_OPTIONS}
    try:
        GroupingSchedule(1, **schedule)
    except (TypeError, ValueError) as e:
        raise UserError(f"grouping schedule: {e}") from None
    return AttentionPatch(pipe, method, backend=backend, route_cross=route_cross,
                          options=options, schedule_options=schedule,
                          fuse_rope=fuse_rope).apply()


def rope_paths(pipe: Any) -> dict[str, str]:
    """Where each transformer's RoPE runs under a patch (read before it is applied): "fused"
    (the patch hands q and k before RoPE, with the tables, to the method: Wan's
    self-attention) or "outside" (the pipeline applies it before the attention call)."""
    return {name: "fused" if any(takes_over(m) for m in model.modules()) else "outside"
            for name, model in denoisers(pipe).items()}


def compile_denoisers(pipe: Any, **compile_options: Any):
    """`torch.compile` the pipeline's transformer(s) in place (after `patch`); returns the call
    that puts the uncompiled modules back. That call also resets Dynamo: compiled code does not
    guard on module hooks, so a later patch of the same modules must not reuse it."""
    originals = denoisers(pipe)
    if isinstance(pipe, torch.nn.Module):
        raise UserError("compile: give a pipeline; compile a bare transformer with torch.compile")
    for name, module in originals.items():
        setattr(pipe, name, torch.compile(module, **compile_options))

    def uncompile() -> None:
        for name, module in originals.items():
            setattr(pipe, name, module)
        torch._dynamo.reset()
    return uncompile


def compile_seconds() -> float:
    """Seconds Dynamo has spent compiling in this process (its own timer: tracing, the
    backend, guards), so a run can keep compile time out of its wall figures."""
    from torch._dynamo.utils import compilation_time_metrics

    return float(sum(compilation_time_metrics.get("_compile.compile_inner", ())))


def denoisers(pipe: Any) -> dict[str, torch.nn.Module]:
    """The transformer(s) of a pipeline: diffusers names them transformer, transformer_2;
    LongCat-Video's pipeline (a plain object, no `components`) holds its `dit`."""
    if isinstance(pipe, torch.nn.Module):
        return {"transformer": pipe}
    components = getattr(pipe, "components", None) or {
        name: getattr(pipe, name, None) for name in ("transformer", "transformer_2", "dit")}
    return {name: c for name, c in components.items()
            if name.startswith(("transformer", "dit")) and isinstance(c, torch.nn.Module)}


def _sdpa_core(module: torch.nn.Module) -> str | None:
    cls = type(module)
    return SDPA_CORES.get((cls.__module__, cls.__qualname__))


def _context_position(module: torch.nn.Module) -> int | None:
    """Where a module's forward takes `encoder_hidden_states` (-1: by keyword only), for a
    module whose calls are cross-attention exactly when they are given one: it has no
    `is_cross_attention` flag (which the route reads instead) and no projections of its own
    for context tokens (`add_k_proj`: joint attention over video and text at once). None: no
    call of it is told apart this way. Read once at `apply`, not per call under a trace."""
    if hasattr(module, "is_cross_attention") or getattr(module, "add_k_proj", None) is not None:
        return None
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return None
    for i, p in enumerate(params):
        if p.name == "encoder_hidden_states":
            return i if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) else -1
    return None


def _is_python_tensor_method(func) -> bool:
    # `Tensor.<name> is func`: the bound method by that name is this very function
    return (getattr(func, "__module__", None) == "torch._tensor"
            and getattr(torch.Tensor, getattr(func, "__name__", ""), None) is func)


def _is_attention(module: torch.nn.Module) -> bool:
    # diffusers' attention modules (Attention, WanAttention, ...) all carry a processor, and
    # have `set_processor` or, without it (MochiAttention), a callable processor.
    return hasattr(module, "processor") and (hasattr(module, "set_processor") or callable(module.processor))


def latent_grid(model: torch.nn.Module, args, kwargs) -> tuple[int, int, int] | None:
    """(T, H, W) in tokens: the 5-D latent input divided by the patch size. The input is
    (B, C, T, H, W), or (B, T, C, H, W) for a transformer that takes frames first (CogVideoX),
    told apart by where the config's `in_channels` sits; or tokens already packed (B, N, C)
    with the latent sizes as `num_frames`, `height`, `width` arguments (LTX-Video)."""
    x = kwargs.get("hidden_states", args[0] if args else None)
    sizes = [kwargs.get(k) for k in ("num_frames", "height", "width")]
    if isinstance(x, torch.Tensor) and x.dim() == 3 and all(isinstance(n, int) for n in sizes):
        frames, height, width = sizes
    elif isinstance(x, torch.Tensor) and x.dim() == 5:
        channels = getattr(model, "config", {}).get("in_channels")
        frames = x.shape[1] if channels is not None and x.shape[1] != channels == x.shape[2] else x.shape[2]
        height, width = x.shape[3], x.shape[4]
    else:
        return None
    config = getattr(model, "config", {})
    patch_size = config.get("patch_size", 1)
    if isinstance(patch_size, int):
        patch_size = (config.get("patch_size_t", 1) or 1, patch_size, patch_size)
    pt, ph, pw = patch_size
    return (frames // pt, height // ph, width // pw)
