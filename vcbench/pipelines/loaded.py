"""A loaded model: the pipeline, how to call it for one clip, and what the clip defaults are.

Every family module (wan, hunyuan, minimax, longcat, tiny) returns a `LoadedModel`. The
generate loop only sees this interface, so a clip is made the same way for every model:
initial noise from the seed on the CPU (identical for every method and device), one pipeline
call, frames back as uint8 (F, H, W, 3).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class ClipSettings:
    steps: int
    frames: int
    height: int
    width: int


@dataclass
class LoadedModel:
    name: str
    pipe: Any
    defaults: ClipSettings
    # (pipe, prompt, noise generator, settings, on_step) -> frames float in [0, 1], (F, H, W, 3)
    call: Callable[..., np.ndarray]
    device: torch.device = torch.device("cpu")
    dtype: torch.dtype = torch.float32
    random_weights: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def generate(self, prompt: str, seed: int, settings: ClipSettings,
                 on_step: Callable[[int], None] | None = None) -> np.ndarray:
        generator = torch.Generator("cpu").manual_seed(seed)
        frames = self.call(self, prompt, generator, settings, on_step or (lambda i: None))
        return to_uint8(frames)


def to_uint8(frames: Any) -> np.ndarray:
    """Pipeline output (float in [0, 1], optionally with a batch axis) -> uint8 (F, H, W, 3)."""
    if isinstance(frames, torch.Tensor):
        frames = frames.float().cpu().numpy()
    frames = np.asarray(frames)
    if frames.ndim == 5:
        frames = frames[0]
    if frames.shape[-1] not in (1, 3) and frames.shape[1] in (1, 3):  # (F, C, H, W)
        frames = frames.transpose(0, 2, 3, 1)
    return np.clip(np.round(frames.astype(np.float64) * 255.0), 0, 255).astype(np.uint8)


def seeded_noise(generator: torch.Generator, shape: tuple[int, ...], device, dtype) -> torch.Tensor:
    """Initial latents drawn on the CPU so the same seed gives the same noise everywhere."""
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(device=device, dtype=dtype)


def step_callback(on_step: Callable[[int], None]):
    """A diffusers `callback_on_step_end` that reports the finished step and changes nothing."""
    def callback(pipe, i, t, kwargs):
        on_step(i + 1)
        return {}
    return callback
