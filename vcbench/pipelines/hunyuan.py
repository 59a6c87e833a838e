"""HunyuanVideo-1.5 T2V through diffusers' `HunyuanVideo15Pipeline`.

Its blocks attend jointly over [video tokens, text tokens] in one SDPA call with a boolean
mask over padded text; the patch routes that call (video tokens first, so the `cube` order
and the latent grid still line up with the start of the sequence).
"""

from __future__ import annotations

from pathlib import Path

import torch

from vcbench.pipelines.loaded import ClipSettings, LoadedModel, seeded_noise

# Appendix A: 121 frames at 720p, 50 steps.
HUNYUAN15_DEFAULTS = ClipSettings(steps=50, frames=121, height=720, width=1280)


def check_hunyuan15(s: ClipSettings) -> None:
    from vcbench.errors import UserError

    if s.frames % 4 != 1:
        raise UserError(f"HunyuanVideo-1.5 needs a frame count of 4k+1, got {s.frames}")


def call_hunyuan15(model: LoadedModel, prompt: str, generator: torch.Generator, s: ClipSettings, on_step):
    check_hunyuan15(s)
    pipe = model.pipe
    spatial = pipe.vae_scale_factor_spatial
    shape = (1, pipe.vae.config.latent_channels, (s.frames - 1) // pipe.vae_scale_factor_temporal + 1,
             s.height // spatial, s.width // spatial)
    latents = seeded_noise(generator, shape, model.device, torch.float32)
    # The pipeline takes no step callback: report progress from the scheduler's own counter.
    def report(module, args):
        on_step(pipe.scheduler.step_index or 0)
    handle = pipe.transformer.register_forward_pre_hook(report)
    try:
        out = pipe(prompt=prompt, height=s.height, width=s.width, num_frames=s.frames,
                   num_inference_steps=s.steps, generator=generator, latents=latents, output_type="np")
    finally:
        handle.remove()
    on_step(s.steps)
    return out.frames


def load_hunyuan15(path: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    from diffusers import HunyuanVideo15Pipeline

    pipe = HunyuanVideo15Pipeline.from_pretrained(path, torch_dtype=dtype, local_files_only=True)
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return LoadedModel("hunyuanvideo15", pipe, HUNYUAN15_DEFAULTS, call_hunyuan15, device, dtype)
