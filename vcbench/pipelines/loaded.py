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
    # Refuses settings the model cannot make (UserError), called once before the first clip.
    check: Callable[[ClipSettings], None] | None = None

    def generate(self, prompt: str, seed: int, settings: ClipSettings,
                 on_step: Callable[[int], None] | None = None) -> np.ndarray:
        """The clip as uint8 (F, H, W, 3)."""
        return to_uint8(self.generate_float(prompt, seed, settings, on_step))

    def generate_float(self, prompt: str, seed: int, settings: ClipSettings,
                       on_step: Callable[[int], None] | None = None) -> np.ndarray:
        """The clip as the pipeline made it: float (F, H, W, 3) in [0, 1], NaN and inf kept."""
        generator = torch.Generator("cpu").manual_seed(seed)
        return to_frames(self.call(self, prompt, generator, settings, on_step or (lambda i: None)))


def to_frames(frames: Any) -> np.ndarray:
    """Pipeline output (float in [0, 1], optionally with a batch axis) -> float (F, H, W, C)."""
    if isinstance(frames, torch.Tensor):
        frames = frames.float().cpu().numpy()
    frames = np.asarray(frames)
    if frames.ndim == 5:
        frames = frames[0]
    if frames.shape[-1] not in (1, 3) and frames.shape[1] in (1, 3):  # (F, C, H, W)
        frames = frames.transpose(0, 2, 3, 1)
    return frames


def to_uint8(frames: Any) -> np.ndarray:
    """Pipeline output -> uint8 (F, H, W, 3). A non-finite pixel becomes 0 here; callers that
    must not lose it (generate) check `nonfinite_frames` first."""
    frames = np.nan_to_num(to_frames(frames).astype(np.float64), nan=0.0, posinf=1.0, neginf=0.0)
    return np.clip(np.round(frames * 255.0), 0, 255).astype(np.uint8)


def nonfinite_frames(frames: np.ndarray) -> list[int]:
    """Indices of the frames (F, ...) that hold a NaN or an infinity."""
    finite = np.isfinite(frames).reshape(frames.shape[0], -1).all(axis=1)
    return [int(i) for i in np.flatnonzero(~finite)]


def seeded_noise(generator: torch.Generator, shape: tuple[int, ...], device, dtype) -> torch.Tensor:
    """Initial latents drawn on the CPU so the same seed gives the same noise everywhere."""
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(device=device, dtype=dtype)


def step_callback(on_step: Callable[[int], None]):
    """A diffusers `callback_on_step_end` that reports the finished step and changes nothing."""
    def callback(pipe, i, t, kwargs):
        on_step(i + 1)
        return {}
    return callback
