"""What `project-clip` times: the parts of Wan2.2-T2V-A14B built from their published configs
with random weights, directly on the device, and one timed call of each kind of step.

Speed does not depend on weight values, so no checkpoint is needed:

    text encoder   UMT5-XXL encoder, bf16, 512 tokens: one call timed; the pipeline makes two
                   (prompt and negative prompt)
    transformer    one Wan2.2-A14B expert, bf16 (diffusers' fp32 modules kept fp32, as
                   `from_pretrained` keeps them), on the 21x90x160 latent = 75600 video tokens
                   and 512 text tokens, with the attention patched to each method
                   (`vcbench.patch(..., backend="gpu")`). The two experts share one
                   architecture, so one expert in memory times every step.
    VAE decode     AutoencoderKLWan (the Wan2.1 VAE the A14B pipeline uses), fp32 as
                   `vcbench generate` loads it, decoding the 21x90x160 latent once

RoPE is in every transformer call's time. The patch hands Wan's self-attention RoPE to the
method (pipelines/wan_rope.py), so each transformer row says where it ran (`rope`):
"quantizers" (inside the preprocessing: the backend's Q and K quantizers rotate on load) or
"eager" (PyTorch rotates q and k before the method's kernel, as diffusers would: the
emulation, BF16's FA4 or cuDNN, any backend without the fusion), comparable with `vcbench
timeit`'s preprocessing, which prices RoPE the same way.

Wan2.2's guidance (4.0 high-noise, 3.0 low-noise) is above 1 on every step, so every step
makes two transformer calls (cond and uncond); one is timed per sample (`clip_arithmetic`
counts it twice). A method that groups (V-Smooth) has a call timed per kind of step of its
schedule (regroup, reuse, plain), in schedule order, each checked to have done what it is
counted as.

With `compile`, each method's transformer is also timed under torch.compile (after the
patch, as `generate --compile` runs it): one full call per kind of step absorbs compilation
(its Dynamo seconds are `compile_s`, reported beside), then the same timed calls, each checked
to have compiled nothing.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from vcbench.kernels.spec.vsmooth import PLAIN_STEP_OPTIONS
from vcbench.pipelines.wan import GUIDANCE, GUIDANCE_LOW_NOISE, WAN22_DEFAULTS
from vcbench.timing.clip_arithmetic import part_row, step_kinds, transformer_rows

# Wan2.2-T2V-A14B, per expert (transformer/ and transformer_2/ of Wan-AI/Wan2.2-T2V-A14B-Diffusers;
# the same values as Wan's own t2v_A14B config: dim 5120 = 40 x 128, ffn 13824, 40 layers).
WAN22_A14B_TRANSFORMER = dict(
    patch_size=(1, 2, 2), num_attention_heads=40, attention_head_dim=128, in_channels=16,
    out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=13824, num_layers=40,
    cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None,
    added_kv_proj_dim=None, rope_max_seq_len=1024, pos_embed_seq_len=None)
# google/umt5-xxl's encoder, which Wan's text_encoder/ is.
UMT5_XXL = dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                relative_attention_num_buckets=32, relative_attention_max_distance=128,
                feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, tie_word_embeddings=False)
# The Wan2.1 VAE (z 16, 4x temporal and 8x spatial compression) that Wan2.2-T2V-A14B decodes with.
WAN21_VAE = dict(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
                 temperal_downsample=[False, True, True], dropout=0.0)
VAE_TEMPORAL, VAE_SPATIAL = 4, 8


@dataclass(frozen=True)
class ClipSpec:
    """What is built and what clip it is timed on."""

    name: str  # "full-size": what the label says was timed
    source: str  # where the configs come from
    transformer: dict
    text_encoder: dict
    vae: dict
    frames: int
    height: int
    width: int
    text_tokens: int = 512  # WanPipeline's max_sequence_length
    steps: int = 40
    cfg_passes: int = 2  # transformer calls per step: cond + uncond (guidance > 1)
    text_calls: int = 2  # text-encoder calls per clip: prompt + negative prompt

    def latent_shape(self) -> tuple[int, int, int, int, int]:
        return (1, self.transformer["in_channels"], (self.frames - 1) // VAE_TEMPORAL + 1,
                self.height // VAE_SPATIAL, self.width // VAE_SPATIAL)

    def video_tokens(self) -> int:
        _, _, t, h, w = self.latent_shape()
        pt, ph, pw = self.transformer["patch_size"]
        return (t // pt) * (h // ph) * (w // pw)


# The paper's Wan clip. Both guidance scales are above 1: CFG on every step.
WAN22_720P = ClipSpec(
    "full-size", "Wan2.2-T2V-A14B config", WAN22_A14B_TRANSFORMER, UMT5_XXL, WAN21_VAE, frames=WAN22_DEFAULTS.frames,
    height=WAN22_DEFAULTS.height, width=WAN22_DEFAULTS.width, steps=WAN22_DEFAULTS.steps,
    cfg_passes=2 if min(GUIDANCE, GUIDANCE_LOW_NOISE) > 1 else 1)


def tiny_spec() -> ClipSpec:
    """The same code path at a size a CPU runs in seconds (tests): tiny-wan-random's configs."""
    from vcbench.pipelines.tiny import wan_transformer_config, wan_vae_config

    text = dict(UMT5_XXL, vocab_size=128, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_heads=4)
    return ClipSpec("tiny", "tiny-wan-random config", dict(wan_transformer_config(layers=2), text_dim=32), text,
                    wan_vae_config(), frames=5, height=64, width=64, text_tokens=8, steps=8)


# --- building the parts --------------------------------------------------------------------------

def cast_like_pretrained(model: torch.nn.Module, dtype: torch.dtype,
                         keep_fp32: list[str] | None) -> torch.nn.Module:
    """Parameters to `dtype`, except those under a module named in `keep_fp32`, as diffusers'
    `from_pretrained(torch_dtype=...)` leaves them; buffers as built (RoPE tables stay fp32).
    One parameter at a time, so the peak is the fp32 model plus one tensor."""
    keep = set(keep_fp32 or [])
    for name, param in model.named_parameters():
        if param.is_floating_point() and not keep.intersection(name.split(".")):
            param.data = param.data.to(dtype)
    return model


def build_transformer(config: dict, device: torch.device, dtype: torch.dtype, seed: int = 0):
    from diffusers import WanTransformer3DModel

    torch.manual_seed(seed)
    with torch.device(device):  # built and initialised where it runs: no CPU init of 14B
        model = WanTransformer3DModel(**config)
    cast_like_pretrained(model, dtype, WanTransformer3DModel._keep_in_fp32_modules)
    return model.eval().requires_grad_(False)


def build_text_encoder(config: dict, device: torch.device, dtype: torch.dtype, seed: int = 0):
    from transformers import UMT5Config, UMT5EncoderModel

    torch.manual_seed(seed)
    with torch.device(device):
        model = UMT5EncoderModel(UMT5Config(**config))
    return model.to(dtype).eval().requires_grad_(False)  # transformers keeps no fp32 part in bf16


def build_vae(config: dict, device: torch.device, seed: int = 0):
    from diffusers import AutoencoderKLWan

    torch.manual_seed(seed)
    with torch.device(device):
        vae = AutoencoderKLWan(**config)
    return vae.eval().requires_grad_(False)  # float32, as vcbench generate loads Wan's VAE


def free_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of one call, synchronised with the device on both sides."""
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


# --- timing each part ----------------------------------------------------------------------------

def kind_implementations(method: str, kinds, backend: str) -> dict[str, str]:
    """What runs each kind of step's attention: a plain step is the method without V-Smooth,
    a plan a backend may not take (it would run on the next backend that does). An external
    kernel runs its callable whatever the backend."""
    from vcbench.kernels import KernelMethod, get_method, implementation

    m = get_method(method)
    if isinstance(m, KernelMethod):
        return {kind: m.implementation() for kind in kinds}
    if backend != "gpu":
        return {kind: backend for kind in kinds}

    return {kind: implementation(method, PLAIN_STEP_OPTIONS if kind == "plain" else None) or "?"
            for kind in kinds}


class _Holder:
    """What `vcbench.patch` reads from a pipeline: the transformer, and a scheduler whose
    `step_index` says which of `num_steps` steps the next call belongs to."""

    def __init__(self, transformer: torch.nn.Module, num_steps: int) -> None:
        self.transformer = transformer
        self.scheduler = SimpleNamespace(step_index=None, timesteps=range(num_steps))

    @property
    def components(self) -> dict[str, torch.nn.Module]:
        # read from the attribute, as diffusers' pipelines do, so compile_denoisers' swap shows
        return {"transformer": self.transformer}


@contextmanager
def first_blocks(model: torch.nn.Module, n: int):
    """Run only the first `n` transformer blocks (a cheap warm-up: every block has the same
    shapes, so one block compiles and caches every kernel the full model launches)."""
    blocks = model.blocks
    model.blocks = blocks[:n]
    try:
        yield
    finally:
        model.blocks = blocks


def time_text_encoder(spec: ClipSpec, device, dtype, repeats: int, seed: int = 0) -> dict:
    model = build_text_encoder(spec.text_encoder, device, dtype, seed)
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.randint(0, spec.text_encoder["vocab_size"], (1, spec.text_tokens), generator=g)
    ids, mask = ids.to(device), torch.ones_like(ids, device=device)
    call = lambda: model(input_ids=ids, attention_mask=mask).last_hidden_state  # noqa: E731
    with torch.no_grad():
        call()  # warm-up
        samples = [timed(call, device) for _ in range(repeats)]
    return part_row("text_encode", "-", "all", samples, spec.text_calls, "-")


def time_vae_decode(spec: ClipSpec, device, repeats: int, tiling: bool, seed: int = 0) -> dict:
    vae = build_vae(spec.vae, device, seed)
    g = torch.Generator(device="cpu").manual_seed(seed)
    z = torch.randn(spec.latent_shape(), generator=g).to(device)
    mean = torch.tensor(vae.config.latents_mean, device=device).view(1, -1, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(vae.config.latents_std, device=device).view(1, -1, 1, 1, 1)

    def decode(latents):  # what WanPipeline does after the last step
        return vae.decode(latents / inv_std + mean, return_dict=False)[0]

    mode = "tiled" if tiling else "untiled"
    if tiling:
        vae.enable_tiling()
    with torch.no_grad():
        decode(z[:, :, :2])  # warm-up: Wan's VAE decodes frame by frame, so 2 latent frames
        samples = None
        try:  # launch every kernel the full decode does
            samples = [timed(lambda: decode(z), device) for _ in range(repeats)]
        except torch.cuda.OutOfMemoryError:
            if tiling:
                raise
        if samples is None:  # outside the handler, so the failed call's tensors can go
            free_memory(device)
            vae.enable_tiling()
            mode = "tiled (untiled ran out of memory)"
            decode(z[:, :, :2])
            samples = [timed(lambda: decode(z), device) for _ in range(repeats)]
    return part_row("vae_decode", "-", mode, samples, 1, "-")


def kind_rope(method: str, kinds, backend: str) -> dict[str, str]:
    """Where each kind of step's RoPE runs (`kernels.rope_placement`): the Wan transformer's
    self-attention hands it to the method, so "quantizers" or "eager"."""
    from vcbench.kernels import rope_placement

    return {kind: rope_placement(method, PLAIN_STEP_OPTIONS if kind == "plain" else {}, backend,
                                 torch.cuda.is_available()) for kind in kinds}


def time_transformer_method(model, spec: ClipSpec, method: str, repeats: int, backend: str,
                            device, dtype, seed: int = 0, compile: bool = False) -> list[dict]:
    """Per kind of step, `repeats` timed calls of the whole transformer with the attention
    patched to `method` (after a one-block warm-up through every kind), in schedule order so
    a reuse step finds the grouping its regroup step cached. With `compile`, the same calls
    compiled (`compile_denoisers`) after a full warm-up call per kind instead (a one-block
    model would be another graph); the model is uncompiled and unpatched on return."""
    import vcbench
    from vcbench.pipelines.patch import compile_denoisers, compile_seconds

    kinds = step_kinds(method, spec.steps)
    implementations = kind_implementations(method, kinds, backend)
    rope = kind_rope(method, kinds, backend)
    g = torch.Generator(device="cpu").manual_seed(seed)
    latent = torch.randn(spec.latent_shape(), generator=g).to(device, dtype)
    text = torch.randn(1, spec.text_tokens, spec.transformer["text_dim"], generator=g).to(device, dtype)
    holder = _Holder(model, spec.steps)
    layers = len(model.blocks)

    def call(step: int):
        holder.scheduler.step_index = step
        t = torch.tensor([1000.0 * (1 - step / spec.steps)], device=device)
        return holder.transformer(hidden_states=latent, timestep=t, encoder_hidden_states=text,
                                  return_dict=False)

    def timed_kinds(p) -> dict[str, list[float]]:
        samples: dict[str, list[float]] = {kind: [] for kind in kinds}
        for _ in range(repeats):
            p.reset()  # a fresh clip: groupings recomputed on the regroup step
            for kind, steps in kinds.items():
                routed, compiling = sum(p.routed.values()), compile_seconds()
                samples[kind].append(timed(lambda s=steps[0]: call(s), device))
                _check_call(p, method, kind, steps[0], sum(p.routed.values()) - routed, layers,
                            compile_seconds() - compiling)
        return samples

    with torch.no_grad(), vcbench.patch(holder, method, backend=backend) as p:
        if not compile:
            with first_blocks(model, 1):
                for steps in kinds.values():
                    call(steps[0])
            return transformer_rows(method, implementations, kinds, timed_kinds(p),
                                    spec.cfg_passes, rope=rope)
        uncompile = compile_denoisers(holder)
        # Past Dynamo's recompile limit the transformer would run eager, unsaid: an error instead.
        try:
            with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
                compile_s = {}
                for kind, steps in kinds.items():
                    compiling = compile_seconds()
                    call(steps[0])
                    compile_s[kind] = compile_seconds() - compiling
                return transformer_rows(method, implementations, kinds, timed_kinds(p),
                                        spec.cfg_passes, compile_s, rope=rope)
        finally:
            uncompile()  # before the patch is restored, as generate does


def _check_call(p, method: str, kind: str, step: int, routed: int, layers: int,
                compiled_s: float = 0.0) -> None:
    """The call did what it is counted as: every block's self-attention through the method,
    (V-Smooth) the schedule's action on that step, and no compilation in its time."""
    if compiled_s > 0:
        raise RuntimeError(f"{method}: the timed {kind} call compiled for {compiled_s:.2f} s "
                           "(a recompile the warm-up did not absorb)")
    if routed != layers:
        raise RuntimeError(f"{method}: {routed} self-attention calls went through the method, "
                           f"expected {layers} (one per block)")
    if kind != "all" and (p.actions.get(step) != kind or (kind == "reuse" and p.regroups[step])):
        raise RuntimeError(f"{method}: step {step} ran {p.actions.get(step)!r} "
                           f"({p.regroups[step]} regroupings), expected {kind!r}")
