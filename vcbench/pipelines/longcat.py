"""LongCat-Video: not in diffusers, so it runs only through the user's install of its upstream
package. Without it the error says what is missing instead of failing somewhere later."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from vcbench.errors import UserError
from vcbench.pipelines.loaded import ClipSettings

# Appendix A: 93 frames at 480x832, 50 steps.
LONGCAT_DEFAULTS = ClipSettings(steps=50, frames=93, height=480, width=832)
UPSTREAM = "longcat_video"


def load_longcat(path: Path, device: torch.device, dtype: torch.dtype):
    if importlib.util.find_spec(UPSTREAM) is None:
        raise UserError("longcat-video needs the upstream LongCat-Video package (module "
                        f"'{UPSTREAM}'), which is not importable here; install it from its "
                        "repository, then pass its checkpoint folder as --model-path")
    raise UserError(f"'{UPSTREAM}' is importable, but vcbench has no adapter for its pipeline "
                    "yet (its attention does not go through diffusers' processors)")
