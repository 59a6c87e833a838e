"""MiniMax-H3 through diffusers' modular pipeline (`MiniMaxH3ModularPipeline`).

Appendix A runs it at 1344x768, 243 frames, 8 steps with the 8-step distillation LoRA,
Euler, no CFG. The LoRA is a user file (`--lora-path`); without it the base model's own
sampler runs with 8 steps. Video, audio and text tokens are packed into one sequence,
which the patch routes as one self-attention call.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vcbench.errors import UserError
from vcbench.pipelines.loaded import ClipSettings, LoadedModel

MINIMAX_DEFAULTS = ClipSettings(steps=8, frames=243, height=768, width=1344)


def call_minimax(model: LoadedModel, prompt: str, generator: torch.Generator, s: ClipSettings, on_step):
    out = model.pipe(prompt=prompt, height=s.height, width=s.width, num_frames=s.frames,
                     num_inference_steps=s.steps, guidance_scale=1.0, generator=generator,
                     output_type="np", output="videos")
    on_step(s.steps)
    return out


def load_minimax_h3(path: Path, device: torch.device, dtype: torch.dtype,
                    lora_path: Path | None = None) -> LoadedModel:
    try:
        from diffusers.modular_pipelines import MiniMaxH3ModularPipeline
    except ImportError:
        raise UserError("minimax-h3 needs diffusers' MiniMaxH3ModularPipeline (diffusers >= 0.42)") from None
    pipe = MiniMaxH3ModularPipeline.from_pretrained(str(path))
    pipe.load_components(torch_dtype=dtype, local_files_only=True)
    if lora_path is not None:
        pipe.load_lora_weights(str(lora_path))
    pipe.to(device)
    return LoadedModel("minimax-h3", pipe, MINIMAX_DEFAULTS, call_minimax, device, dtype)
