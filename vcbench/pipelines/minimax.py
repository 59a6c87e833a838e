"""MiniMax-H3 through diffusers' modular pipeline (`MiniMaxH3ModularPipeline`, workflow `t2va`).

Appendix A runs it at 1344x768, 243 frames, 8 steps with the 8-step distillation LoRA,
Euler, no CFG. The checkpoint is guidance-distilled (no guider, no `guidance_scale`: one
transformer call per step), and its scheduler evaluates the transformer `steps - 1` times:
`num_inference_steps` counts sigma grid points with the terminal 0 included
(`MiniMaxH3Scheduler.set_timesteps`, `timesteps = 1 - sigmas[:-1]`). vcbench passes `--steps`
through as `num_inference_steps`, so the default 8 is 7 transformer calls; an "8-step" LoRA
used the way its ComfyUI users count steps (8 sampler steps, 9 sigmas) is `--steps 9`
(docs/pipelines.md). The LoRA is a user file (`--lora-path`); without it the base model's own
sampler runs with the same step count.

`pipe(prompt=...)` runs the whole t2va workflow: the Qwen3-VL text encoder (hidden state 50),
denoising, the video VAE decode and the audio VAE decode (the soundtrack is decoded, and timed
in the clip's wall time, but not saved). Frames must be 17n+5 within 5-15 s at 24 fps: the
shortest clip is 124 frames. Text, audio and video rows are packed
into one sequence (text first, video last) that every block attends over in one call, which
the patch routes as self-attention; the token refiner's text-only attention is routed too.
The transformer takes patchified rows, not a 5-D latent, so the patch has no latent grid:
the `cube` token order is unavailable here (k-means, the default, needs none).
"""

from __future__ import annotations

from pathlib import Path

import torch

from vcbench.errors import UserError
from vcbench.pipelines.loaded import ClipSettings, LoadedModel

MINIMAX_DEFAULTS = ClipSettings(steps=8, frames=243, height=768, width=1344)
FPS, MIN_S, MAX_S = 24, 5.0, 15.0  # the pipeline's fps and duration limits


def check_minimax(s: ClipSettings) -> None:
    if s.frames % 17 != 5 or not MIN_S * FPS <= s.frames <= MAX_S * FPS:
        raise UserError(f"MiniMax-H3 needs 17n+5 frames lasting 5-15 s at 24 fps (124 ... 345), got {s.frames}")
    if s.height % 32 or s.width % 32:
        raise UserError(f"MiniMax-H3 needs height and width divisible by 32, got {s.height}x{s.width}")
    if s.steps < 2:
        raise UserError(f"MiniMax-H3's scheduler needs at least 2 steps, got {s.steps}")


def call_minimax(model: LoadedModel, prompt: str, generator: torch.Generator, s: ClipSettings, on_step):
    check_minimax(s)
    pipe = model.pipe
    # The video noise, then the audio noise, come from `generator` (seeded on the CPU), so a
    # seed gives every method the same noise. No step callback: report from the scheduler.
    handle = pipe.transformer.register_forward_pre_hook(
        lambda module, args: on_step(pipe.scheduler.step_index or 0))
    try:
        videos = pipe(prompt=prompt, height=s.height, width=s.width, num_frames=s.frames,
                      num_inference_steps=s.steps, generator=generator, output_type="np",
                      output="videos")
    finally:
        handle.remove()
    on_step(s.steps)
    return videos


def load_minimax_h3(path: Path, device: torch.device, dtype: torch.dtype,
                    lora_path: Path | None = None) -> LoadedModel:
    try:
        from diffusers.modular_pipelines import MiniMaxH3ModularPipeline
    except ImportError:
        raise UserError("minimax-h3 needs diffusers' MiniMaxH3ModularPipeline (diffusers >= 0.42)") from None
    # `t2va` loads only the text-to-video+audio half (not the 61.7 GB `transformer_ref`).
    pipe = MiniMaxH3ModularPipeline.from_pretrained(str(path), workflow="t2va", local_files_only=True)
    pipe.load_components(dtype=dtype, local_files_only=True)
    if getattr(pipe, "transformer", None) is None:
        raise UserError(f"{path}: no MiniMax-H3 transformer/ (a diffusers modular folder with "
                        "modular_model_index.json is expected)")
    if lora_path is not None:
        pipe.load_lora_weights(str(lora_path))
    pipe.to(device)
    return LoadedModel("minimax-h3", pipe, MINIMAX_DEFAULTS, call_minimax, device, dtype)
