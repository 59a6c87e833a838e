"""V-Smooth's declarations (paper 3.2, appendix A): how a method groups and demeans value
tokens, what a grouping is, and the schedule of denoising steps that group. Data and one pure
rule (`GroupingSchedule.action`); the algorithms are in `reference/vsmooth.py`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

import torch

ORDERS = ("kmeans", "sequence", "cube", "balanced")
Order = Literal["kmeans", "sequence", "cube", "balanced"]


@dataclass(frozen=True)
class VSmoothConfig:
    """How V-Smooth groups and demeans. `block_rows` is the kernel's KV tile: one mean per
    tile, restored once per tile."""

    order: Order = "kmeans"
    clusters: int = 32
    iters: int = 10
    warm_iters: int = 5  # from the last grouping's centroids: "halves its cost" (paper 3.2)
    cube: tuple[int, int, int] = (2, 8, 8)
    hadamard_v: bool = False
    block_rows: int = 128


@dataclass(frozen=True)
class Grouping:
    """A token order per (batch, head) and, for k-means, the centroids for a warm start.
    `permutation`: int64 (B, H, N), new position i holds old token permutation[..., i]."""

    permutation: torch.Tensor
    centroids: torch.Tensor | None = None


Action = Literal["regroup", "reuse", "plain"]
# The method options of a plain step: the host kernel without V-Smooth (what the patch passes,
# and what every backend must take for a V-Smooth method's whole schedule to run on it).
PLAIN_STEP_OPTIONS = MappingProxyType({"vsmooth": False})  # read-only: shared by every caller


@dataclass(frozen=True)
class GroupingSchedule:
    """Which denoising steps group (appendix A).

    `leading` (the paper's operating point): the first ceil(n * fraction) steps group, and the
    permutation is recomputed on every `refresh_every`-th of them (steps 0, 4, 8 of a 40-step
    run) and reused in between. `uniform`: the same number of grouping steps spread evenly over
    the run (Table 3's ablation). `every`: all steps group. Outside the grouping steps the step
    runs the host method's plain kernel (`after_window="plain"`, the paper's reading), or keeps
    demeaning on the last permutation (`after_window="reuse"`).
    """

    num_steps: int
    placement: Literal["leading", "uniform", "every"] = "leading"
    fraction: float = 0.25
    refresh_every: int = 4
    after_window: Literal["plain", "reuse"] = "plain"

    def __post_init__(self) -> None:
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if not 0 < self.fraction <= 1:
            raise ValueError(f"fraction must be in (0, 1], got {self.fraction}")
        if self.refresh_every < 1:
            raise ValueError(f"refresh_every must be >= 1, got {self.refresh_every}")
        if self.placement not in ("leading", "uniform", "every"):
            raise ValueError(f"unknown placement {self.placement!r}")
        if self.after_window not in ("plain", "reuse"):
            raise ValueError(f"unknown after_window {self.after_window!r}")

    @property
    def window(self) -> int:
        """How many steps group: ceil(n * fraction), or n for `every`."""
        if self.placement == "every":
            return self.num_steps
        return math.ceil(self.num_steps * self.fraction - 1e-9)

    def grouping_steps(self) -> tuple[int, ...]:
        n, w = self.num_steps, self.window
        if self.placement == "uniform":
            return tuple(sorted({(i * n) // w for i in range(w)}))
        return tuple(range(w))

    def regroup_steps(self) -> tuple[int, ...]:
        return tuple(s for i, s in enumerate(self.grouping_steps()) if i % self.refresh_every == 0)

    def action(self, step: int) -> Action:
        if not 0 <= step < self.num_steps:
            raise ValueError(f"step {step} outside a {self.num_steps}-step schedule")
        steps = self.grouping_steps()
        if step in steps:
            return "regroup" if steps.index(step) % self.refresh_every == 0 else "reuse"
        if self.after_window == "reuse" and step > steps[0]:
            return "reuse"
        return "plain"
