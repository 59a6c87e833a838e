"""Wan2.2-T2V-A14B through diffusers' `WanPipeline` (two experts), and the same call for tiny-wan."""

from __future__ import annotations

from pathlib import Path

import torch

from vcbench.errors import UserError
from vcbench.pipelines.loaded import ClipSettings, LoadedModel, seeded_noise, step_callback

# Appendix A: 81 frames at 720p, 40 steps. Guidance as Wan2.2's own T2V-A14B config.
WAN22_DEFAULTS = ClipSettings(steps=40, frames=81, height=720, width=1280)
GUIDANCE, GUIDANCE_LOW_NOISE = 4.0, 3.0


def check_wan(settings: ClipSettings) -> None:
    if settings.frames % 4 != 1:
        raise UserError(f"Wan needs a frame count of 4k+1 (e.g. 9, 17, 81), got {settings.frames}")
    if settings.height % 16 or settings.width % 16:
        raise UserError(f"Wan needs height and width divisible by 16, got {settings.height}x{settings.width}")


def call_wan(model: LoadedModel, prompt: str, generator: torch.Generator, s: ClipSettings, on_step):
    check_wan(s)
    pipe = model.pipe
    denoiser = pipe.transformer if pipe.transformer is not None else pipe.transformer_2
    spatial = pipe.vae_scale_factor_spatial
    shape = (1, denoiser.config.in_channels, (s.frames - 1) // pipe.vae_scale_factor_temporal + 1,
             s.height // spatial, s.width // spatial)
    latents = seeded_noise(generator, shape, model.device, torch.float32)
    encode = model.extra.get("conditioning")
    if encode is not None:  # random-weight model: no text encoder, embeddings from the bytes
        text = dict(prompt_embeds=encode(prompt).to(model.device, model.dtype),
                    negative_prompt_embeds=encode("").to(model.device, model.dtype))
    else:
        text = dict(prompt=prompt)
    guidance_2 = GUIDANCE_LOW_NOISE if pipe.config.boundary_ratio is not None else None
    out = pipe(**text, height=s.height, width=s.width, num_frames=s.frames,
               num_inference_steps=s.steps, guidance_scale=GUIDANCE, guidance_scale_2=guidance_2,
               generator=generator, latents=latents, output_type="np",
               callback_on_step_end=step_callback(on_step))
    return out.frames


def load_wan22(path: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    from diffusers import AutoencoderKLWan, WanPipeline

    # The VAE stays in float32, as Wan's reference code and diffusers' examples run it.
    vae = AutoencoderKLWan.from_pretrained(path, subfolder="vae", torch_dtype=torch.float32,
                                           local_files_only=True)
    pipe = WanPipeline.from_pretrained(path, vae=vae, torch_dtype=dtype, local_files_only=True)
    if pipe.transformer_2 is None:
        raise UserError(f"{path}: Wan2.2-T2V-A14B has two experts, but the folder has no transformer_2")
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return LoadedModel("wan22-t2v-a14b", pipe, WAN22_DEFAULTS, call_wan, device, dtype)
