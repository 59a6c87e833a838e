"""The projection's arithmetic: a clip's seconds per method, added up from its timed parts.

    clip = text_calls x text call + sum over the steps of cfg_passes x transformer call
           + VAE decode

A part is one row (`part_row`): the median of its samples, seconds per call, times its calls
per clip. The transformer's calls differ by what the attention does on a step: a method that
groups (V-Smooth) regroups on some steps of its schedule, reuses the permutation on others
and runs the host kernel alone on the rest (`GroupingSchedule`), so each kind of step is timed
on its own (`step_kinds`) and weighted by how many steps of that kind the clip has, and by its
CFG passes (cond and uncond run the same shapes through the same kernels: one call timed,
counted twice). Pure functions over rows: no model, no GPU (`clip_parts` times the rows).
"""

from __future__ import annotations

import math
import statistics
from typing import Any

import pandas as pd

from vcbench.kernels import REFERENCE_METHOD, get_method
from vcbench.kernels.spec.vsmooth import GroupingSchedule


def step_kinds(method: str, steps: int, schedule: dict | None = None) -> dict[str, list[int]]:
    """The steps of a `steps`-step clip by what the attention does on them, in order of first
    occurrence: 'all' for a method that does not group; V-Smooth's 'regroup', 'reuse', 'plain'
    (the host kernel alone) from its grouping schedule."""
    if not get_method(method).uses_vsmooth:
        return {"all": list(range(steps))}
    schedule = GroupingSchedule(steps, **(schedule or {}))
    kinds: dict[str, list[int]] = {}
    for step in range(steps):
        kinds.setdefault(schedule.action(step), []).append(step)
    return kinds


def part_row(part: str, method: str, kind: str, samples: list[float], calls: int,
             implementation: str = "-", steps: int | None = None) -> dict[str, Any]:
    """One timed part: the median of its samples (seconds per call) times its calls per clip."""
    call_s = statistics.median(samples)
    return {"part": part, "method": method, "kind": kind, "implementation": implementation,
            "steps": steps, "calls_in_clip": calls, "call_s": call_s, "samples": len(samples),
            "sample_min_s": min(samples), "sample_max_s": max(samples), "total_s": calls * call_s}


def joined(implementations) -> str:
    """One label for what ran a method's steps: each name once, in order of first use."""
    return " + ".join(dict.fromkeys(implementations))


def transformer_rows(method: str, implementations: dict[str, str], kinds: dict[str, list[int]],
                     samples: dict[str, list[float]], cfg_passes: int,
                     compile_s: dict[str, float] | None = None,
                     rope: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The rows of one method's timed calls, each with what ran its kind of step
    (`clip_parts.kind_implementations`); `compile_s` (seconds per kind, spent in that kind's
    warm-up call and so in none of its samples) marks them as a compiled transformer's;
    `rope` (per kind, `clip_parts.kind_rope`) says where RoPE ran inside those calls."""
    rows = [part_row("transformer", method, kind, samples[kind], len(steps) * cfg_passes,
                     implementations[kind], steps=len(steps)) for kind, steps in kinds.items()]
    for r in rows if rope is not None else ():
        r["rope"] = rope[r["kind"]]
    for r in rows if compile_s is not None else ():
        r.update(compiled=True, compile_s=compile_s[r["kind"]])
    return rows


def projection_table(parts: pd.DataFrame, speedups: bool = True) -> pd.DataFrame:
    """One row per method: text encode + denoising (its transformer rows) + VAE decode, and the
    speedups over bf16 of the clip and of the denoising alone (NaN without `speedups`: times
    of emulated attention say nothing about a kernel's speed). Parts with compiled transformer
    rows add the same figures compiled, `compiled_*`, their speedups over the compiled bf16,
    and `compile_s`, the method's compile seconds (in none of the figures)."""
    if "compiled" not in parts:
        return _projection(parts, speedups)
    compiled = parts.compiled.eq(True)  # text and VAE rows (NaN) are shared by both
    table = _projection(parts[~compiled], speedups)
    mine = _projection(parts[compiled | (parts.part != "transformer")], speedups).set_index("method")
    table["compile_s"] = (table.method.map(parts[compiled].groupby("method").compile_s.sum())
                          if compiled.any() else math.nan)
    for column in ("denoise_s", "clip_s", "clip_speedup_vs_bf16", "denoise_speedup_vs_bf16"):
        table[f"compiled_{column}"] = table.method.map(mine[column])
    return table


def _projection(parts: pd.DataFrame, speedups: bool) -> pd.DataFrame:
    shared = parts[parts.part != "transformer"].groupby("part").total_s.sum()
    text, vae = float(shared.get("text_encode", math.nan)), float(shared.get("vae_decode", math.nan))
    rows = []
    for method, mine in parts[parts.part == "transformer"].groupby("method", sort=False):
        denoise = float(mine.total_s.sum())
        rows.append({"method": method, "implementation": joined(mine.implementation),
                     **({"rope": joined(mine.rope.dropna())} if "rope" in mine else {}),
                     "text_encode_s": text, "denoise_s": denoise, "vae_decode_s": vae,
                     "clip_s": text + denoise + vae,
                     "transformer_calls": int(mine.calls_in_clip.sum())})
    # the columns named even without rows: every compiled call may have failed
    rope = ["rope"] if "rope" in parts else []  # where RoPE ran (parts timed before it: none)
    table = pd.DataFrame(rows, columns=["method", "implementation", *rope, "text_encode_s",
                                        "denoise_s", "vae_decode_s", "clip_s",
                                        "transformer_calls"])
    if table.empty or REFERENCE_METHOD not in set(table.method) or not speedups:
        table["clip_speedup_vs_bf16"] = math.nan
        table["denoise_speedup_vs_bf16"] = math.nan
        return table
    base = table.set_index("method").loc[REFERENCE_METHOD]
    table["clip_speedup_vs_bf16"] = base.clip_s / table.clip_s
    table["denoise_speedup_vs_bf16"] = base.denoise_s / table.denoise_s
    return table
