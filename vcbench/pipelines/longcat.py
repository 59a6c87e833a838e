"""LongCat-Video through the user's install of its upstream package (`longcat_video`, from
github.com/meituan-longcat/LongCat-Video; not on PyPI, not in diffusers).

Loading mirrors upstream's `run_demo_text_to_video.py`: tokenizer, UMT5 text encoder, its Wan
VAE copy, its flow-matching Euler scheduler and `LongCatVideoTransformer3DModel` from the
checkpoint's subfolders (`tokenizer/ text_encoder/ vae/ scheduler/ dit/`), all with
`local_files_only`, bf16 on CUDA, context-parallel size 1 (`cp_split_hw=[1, 1]`; vcbench shards
whole clips across processes instead). A clip is `pipe.generate_t2v(...)` with upstream's own
defaults for what vcbench does not set: guidance 4.0 (CFG, cond and uncond in one batch of 2, so
one transformer call per step), an empty negative prompt, no distillation LoRA. The initial
noise is drawn on the CPU from the seed and passed as `latents` (upstream would draw it on the
pipeline's device), so every method starts from the same noise.

Attention: upstream's `Attention._process_attn` calls FlashAttention 3/2, xformers or
block-sparse attention, not SDPA; `vcbench.patch` finds those modules by class
(`patch.SDPA_CORES`) and routes their self-attention like diffusers' (docs/pipelines.md). The
step index is the scheduler's `step_index`, as for the diffusers models.
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import torch

from vcbench.errors import UserError
from vcbench.pipelines.loaded import ClipSettings, LoadedModel, seeded_noise

# Appendix A: 93 frames at 480x832, 50 steps.
LONGCAT_DEFAULTS = ClipSettings(steps=50, frames=93, height=480, width=832)
UPSTREAM = "longcat_video"
SUBFOLDERS = ("tokenizer", "text_encoder", "vae", "scheduler", "dit")
GUIDANCE_SCALE = 4.0  # generate_t2v's default
NEGATIVE_PROMPT = None  # generate_t2v's default: "" for the unconditional half


def check_longcat(s: ClipSettings, temporal: int = 4, spatial: int = 16) -> None:
    if s.frames < 1 or (s.frames - 1) % temporal:
        raise UserError(f"LongCat-Video needs {temporal}n+1 frames, got {s.frames}")
    if s.height % spatial or s.width % spatial:
        raise UserError(f"LongCat-Video needs height and width divisible by {spatial}, got {s.height}x{s.width}")
    if s.steps < 1:
        raise UserError(f"LongCat-Video needs at least 1 step, got {s.steps}")


def call_longcat(model: LoadedModel, prompt: str, generator: torch.Generator, s: ClipSettings, on_step):
    pipe = model.pipe
    temporal, spatial = pipe.vae_scale_factor_temporal, pipe.vae_scale_factor_spatial
    check_longcat(s, temporal, spatial * 2)  # generate_t2v checks VAE factor x patch 2
    shape = (1, pipe.dit.config.in_channels, (s.frames - 1) // temporal + 1, s.height // spatial, s.width // spatial)
    latents = seeded_noise(generator, shape, model.device, torch.float32)
    handle = pipe.dit.register_forward_pre_hook(lambda module, args: on_step(pipe.scheduler.step_index or 0))
    try:
        videos = pipe.generate_t2v(prompt=prompt, negative_prompt=NEGATIVE_PROMPT, height=s.height, width=s.width,
                                   num_frames=s.frames, num_inference_steps=s.steps,
                                   guidance_scale=GUIDANCE_SCALE, latents=latents, output_type="np")
    finally:
        handle.remove()
    on_step(s.steps)
    return videos


def check_folder(path: Path) -> None:
    """What loading needs, found before it starts: the upstream package (first: without it no
    folder helps), then the checkpoint's subfolders."""
    _require_upstream()
    missing = [name for name in SUBFOLDERS if not (path / name).is_dir()]
    if missing:
        raise UserError(f"{path}: not a LongCat-Video checkpoint folder (missing {', '.join(m + '/' for m in missing)})")


def _require_upstream() -> None:
    if importlib.util.find_spec(UPSTREAM) is None:
        raise UserError("longcat-video needs the upstream LongCat-Video package (module "
                        f"'{UPSTREAM}'), which is not importable here; install it from its "
                        "repository, then pass its checkpoint folder as --model-path")


def _upstream():
    """The upstream classes, or one error line naming what is missing."""
    _require_upstream()
    names = {"LongCatVideoPipeline": "pipeline_longcat_video",
             "LongCatVideoTransformer3DModel": "modules.longcat_video_dit",
             "AutoencoderKLWan": "modules.autoencoder_kl_wan",
             "FlowMatchEulerDiscreteScheduler": "modules.scheduling_flow_match_euler_discrete"}
    found = {}
    for name, module in names.items():
        try:
            found[name] = getattr(importlib.import_module(f"{UPSTREAM}.{module}"), name)
        except ImportError as e:  # e.g. its xformers / flash-attn / loguru requirements
            raise UserError(f"the upstream LongCat-Video package is installed but {UPSTREAM}.{module} "
                            f"does not import: {e}") from None
    return found


def load_longcat(path: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    check_folder(path)
    up = _upstream()
    from transformers import AutoTokenizer, UMT5EncoderModel

    local = {"local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(path, subfolder="tokenizer", **local)
    text_encoder = UMT5EncoderModel.from_pretrained(path, subfolder="text_encoder", torch_dtype=dtype, **local)
    vae = up["AutoencoderKLWan"].from_pretrained(path, subfolder="vae", torch_dtype=dtype, **local)
    scheduler = up["FlowMatchEulerDiscreteScheduler"].from_pretrained(path, subfolder="scheduler", **local)
    dit = up["LongCatVideoTransformer3DModel"].from_pretrained(path, subfolder="dit", cp_split_hw=[1, 1],
                                                               torch_dtype=dtype, **local)
    pipe = up["LongCatVideoPipeline"](tokenizer=tokenizer, text_encoder=text_encoder, vae=vae,
                                      scheduler=scheduler, dit=dit)
    pipe.to(device)  # also sets pipe.device, which upstream fixes to "cuda" at construction
    for module in (text_encoder, vae, dit):
        module.eval()
    return LoadedModel("longcat-video", pipe, LONGCAT_DEFAULTS, call_longcat, device, dtype)
