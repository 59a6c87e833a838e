"""The report's tables as DataFrames, and their Markdown.

Every mean comes with the number of values behind it and a 95% Student-t interval over them
(clips, for fidelity and clip time): mean +- t(0.975, n-1) * s / sqrt(n), s the sample
standard deviation. With one value there is no interval (NaN), never a zero-width one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from vcbench.kernels import REFERENCE_METHOD as REFERENCE
from vcbench.report.load import GenerateRun, Runs, TableRun


def higher_is_better(metric: str, score: dict | None = None) -> bool:
    """The metric registry's direction; for a plugin's metric this process lacks, the one its
    score.json recorded (`metric_info`)."""
    from vcbench.metrics import METRICS

    if metric in METRICS:
        return METRICS.get(metric).higher_is_better
    recorded = ((score or {}).get("metric_info") or {}).get(metric) or {}
    return bool(recorded.get("higher_is_better", True))


def mean_ci(values) -> tuple[float, float, int]:
    """(mean, half width of the 95% CI, n) over the values that are not NaN (a NaN is a clip
    that did not score). An infinite value (PSNR of identical clips) makes the mean infinite
    and the interval undefined: shown as such, never dropped."""
    from scipy import stats

    x = np.asarray([v for v in values if v is not None], dtype=np.float64)
    x = x[~np.isnan(x)]
    n = len(x)
    if n == 0:
        return math.nan, math.nan, 0
    if n == 1 or not np.all(np.isfinite(x)):
        return float(np.mean(x)), math.nan, n
    half = stats.t.ppf(0.975, n - 1) * np.std(x, ddof=1) / math.sqrt(n)
    return float(np.mean(x)), float(half), n


def method_order(name: str) -> tuple[int, str]:
    from vcbench.kernels import list_methods

    known = list_methods()
    return (known.index(name) if name in known else len(known), name)


def variant(run: GenerateRun, method: str) -> str:
    """What distinguishes this method's clips from the same method in another run: options the
    user gave, and the grouping schedule for the methods that group (V-Smooth)."""
    parts = dict(run.config.get("method_options", {}).get(method) or {})
    if run.method_info(method).get("vsmooth"):
        parts.update(run.config.get("schedule") or {})
    return ", ".join(f"{k}={v}" for k, v in sorted(parts.items()))


def label(method: str, var: str) -> str:
    return f"{method} [{var}]" if var else method


def fidelity(runs: Runs) -> pd.DataFrame:
    """Long table: one row per (model, method, variant, metric) with mean, CI and n clips."""
    rows, seen = [], {}
    for run in runs.generate:
        if run.score is None:
            continue
        metrics = list(run.score.get("metrics", []))
        clip_rows = run.score["rows"]
        for method in sorted({r["method"] for r in clip_rows}, key=method_order):
            key = (run.model, method, variant(run, method))
            if key in seen:
                from vcbench.errors import UserError

                raise UserError(f"{label(*key[1:])} of {run.model} is scored in both {seen[key]} "
                                f"and {run.path} with the same settings; give one of them")
            seen[key] = run.path
            mine = [r for r in clip_rows if r["method"] == method]
            for metric in metrics:
                ok = [r for r in mine if not r.get("error") and not r.get("nonfinite_frames")]
                mean, half, n = mean_ci(as_float(r.get(metric)) for r in ok)
                rows.append({"model": run.model, "method": method, "variant": key[2],
                             "metric": metric,
                             "higher_is_better": higher_is_better(metric, run.score),
                             "mean": mean, "ci95_half": half,
                             "ci95_low": mean - half, "ci95_high": mean + half, "n": n,
                             "n_failed": len(mine) - n, "run": str(run.path)})
        # One bf16 row per model, from the first scored run (its own bf16 clips, or the bf16
        # run it was scored against; by the load checks they share prompts, seeds, settings).
        if (run.model, REFERENCE, "") not in seen:
            seen[(run.model, REFERENCE, "")] = run.path
            rows += _reference_rows(run, metrics, clip_rows)
    return pd.DataFrame(rows)


def _reference_rows(run: GenerateRun, metrics: list[str], clip_rows: list[dict]) -> list[dict]:
    """The bf16 row: relative metrics are the reference itself (NaN here, 'reference' in the
    table); absolute (VBench) ones are the bf16 clip's own score, which every candidate row
    carries as `<metric>_ref`. n counts the reference clips the rows were scored against."""
    from vcbench.metrics import is_absolute

    scored = [r for r in clip_rows if r.get("ref")]
    out = []
    for metric in metrics:
        refs = {r["ref"]: as_float(r.get(f"{metric}_ref")) for r in scored}
        mean, half, n = math.nan, math.nan, len(refs)
        if is_absolute(metric) or ((run.score.get("metric_info") or {}).get(metric) or {}).get("absolute"):
            mean, half, n = mean_ci(refs.values())
        out.append({"model": run.model, "method": REFERENCE, "variant": "", "metric": metric,
                    "mean": mean, "ci95_half": half, "ci95_low": mean - half,
                    "ci95_high": mean + half, "n": n, "n_failed": 0, "run": str(run.path)})
    return out


def as_float(value: Any) -> float:
    # score.json writes non-finite floats as the strings "nan"/"inf" (standard JSON).
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def clip_time(runs: Runs) -> pd.DataFrame:
    """Wall clock of one clip per (model, method, variant), and its speedup over the model's
    bf16 clips (same settings, by the load checks)."""
    rows = []
    for run in runs.generate:
        clips = [c for c in run.clips() if c.get("status") == "ok"]
        for method in sorted({c["method"] for c in clips}, key=method_order):
            mean, half, n = mean_ci(c.get("wall_s") for c in clips if c["method"] == method)
            rows.append({"model": run.model, "method": method, "variant": variant(run, method),
                         "wall_s": mean, "ci95_half": half, "n": n,
                         "backend": run.config.get("backend"), "device": run.config.get("device"),
                         "implementation": ", ".join(sorted({str(c.get("implementation", "-"))
                                                             for c in clips
                                                             if c["method"] == method})),
                         "run": str(run.path)})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    # An emulated method's wall clock times PyTorch, not a kernel: no speedup is derived from it.
    base = table[(table.method == REFERENCE)].groupby("model").wall_s.first()
    table["speedup_vs_bf16"] = [math.nan if b == "emulate" else base.get(m, math.nan) / w
                                for m, w, b in zip(table.model, table.wall_s, table.backend, strict=True)]
    return table


def speedup(runs: Runs) -> pd.DataFrame:
    """timeit rows of every run, each with the GPU and shape it was measured on."""
    frames = []
    for run in runs.timeit:
        t = run.tables["timeit"].copy()
        t.insert(0, "gpu", (run.manifest.get("device") or {}).get("gpu", "?"))
        t.insert(1, "inputs", run.config.get("shape") or run.config.get("tensors"))
        t["run"] = str(run.path)
        frames.append(t)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def clip_projection(runs: Runs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """project-clip runs: (clip time per method, the timed parts behind it), each row with the
    GPU and the run's label ("projected from random-weight full-size transformer on ...")."""
    tables: dict[str, list[pd.DataFrame]] = {"projection": [], "parts": []}
    for run in runs.projections:
        gpu = (run.manifest.get("device") or {}).get("gpu", "cpu")
        for name, frames in tables.items():
            t = run.tables[name].copy()
            t.insert(0, "gpu", gpu)
            t.insert(1, "model", run.config.get("model"))
            t["label"] = run.config.get("label") or "projected"
            t["run"] = str(run.path)
            frames.append(t)
    return tuple(pd.concat(f, ignore_index=True) if f else pd.DataFrame()  # type: ignore[return-value]
                 for f in tables.values())


def provenance(runs: Runs) -> pd.DataFrame:
    rows = []
    for run in runs.all():
        c, m = run.config, run.manifest
        rows.append({
            "run": str(run.path), "command": run.command, "status": m.get("status"),
            "model / inputs": c.get("model") or c.get("tensors") or c.get("shape")
            or (f"beta {c['beta']}" if "beta" in c else "-"),
            "random_weights": c.get("random_weights", "-"),
            "steps": c.get("steps", "-"), "frames": c.get("frames", "-"),
            "size": f"{c['width']}x{c['height']}" if "width" in c else "-",
            "seeds": ",".join(map(str, c["seeds"])) if "seeds" in c else "-",
            "prompts": len(c["prompts"]) if "prompts" in c else "-",
            "backend": c.get("backend", "-"),
            "device": (m.get("device") or {}).get("gpu") or (m.get("device") or {}).get("cpu", "?"),
            "scored against": _scored_against(run),
            "vcbench": m.get("vcbench_version"), "git": (m.get("git_commit") or "?")[:12]
            + ("+dirty" if str(m.get("git_commit", "")).endswith("+dirty") else ""),
            "torch": (m.get("libraries") or {}).get("torch"),
        })
    return pd.DataFrame(rows)


def _scored_against(run) -> str:
    score = getattr(run, "score", None)
    if not score:
        return "-" if not isinstance(run, GenerateRun) else "not scored"
    return "own bf16" if not score.get("cand") else str(score.get("ref"))


def differences(prov: pd.DataFrame) -> list[str]:
    """What the runs differ in, said in words for the top of the report: clip settings among
    the generate runs, versions among all runs."""
    notes = []
    gen = prov[prov.command == "generate"]
    for frame, columns in ((gen, ("model / inputs", "steps", "frames", "size", "seeds")),
                           (prov, ("vcbench", "git", "torch", "device"))):
        for column in columns:
            values = sorted({str(v) for v in frame[column] if str(v) != "-"})
            if len(values) > 1:
                notes.append(f"runs differ in {column}: {', '.join(values)}")
    for run, status in zip(prov.run, prov.status, strict=True):
        if status != "ok":  # a failed or interrupted run may be missing clips or rows
            notes.append(f"run {run} ended with status {status!r}: its tables may be incomplete")
    return notes


# --- Markdown --------------------------------------------------------------------------------

def fmt(value: float, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "n/a" if value is None or math.isnan(value) else str(value)
    return f"{value:.{digits}g}"


def fmt_ci(mean: float, half: float) -> str:
    """'mean ± half' with both to the decimal of the half width's second significant digit,
    so an SSIM of 0.99996 ± 2e-06 does not print as '1 ± 2e-06'."""
    if not (math.isfinite(mean) and math.isfinite(half)) or half <= 0:
        return fmt(mean)
    decimals = max(0, 1 - math.floor(math.log10(half)))
    if 0 < abs(mean) < 1e-3:  # tiny numbers (LPIPS near 0) read better in exponent form
        return f"{mean:.3e} ± {half:.1e}"
    return f"{mean:.{decimals}f} ± {half:.{decimals}f}"


def fidelity_wide(long: pd.DataFrame, model: str, marked: bool = True) -> pd.DataFrame:
    """One row per method of `model`: 'mean ± half' per metric, plus n clips. With `marked`,
    a column's best low-bit method is bold (Markdown) where `best` finds one; bf16 is the
    reference and shows 'reference' for the metrics measured against it."""
    mine = long[long.model == model]
    keys = _keys(mine)
    table = pd.DataFrame({"method": [label(*k) for k in keys]})
    table["clips"] = [int(mine[(mine.method == k[0]) & (mine.variant == k[1])].n.max()) for k in keys]
    for metric in _metrics(mine):
        cells = []
        for k in keys:
            mean, half = _cell(mine, k, metric)
            if k[0] == REFERENCE and not math.isfinite(mean):
                cells.append("reference")
            else:
                cells.append(fmt_ci(mean, half))
        winner, _ = best(mine, metric)
        if marked and winner is not None:
            cells[keys.index(winner)] = f"**{cells[keys.index(winner)]}**"
        table[metric] = cells
    return table


def best(mine: pd.DataFrame, metric: str) -> tuple[tuple[str, str] | None, str]:
    """The low-bit (method, variant) whose 95% interval lies wholly on the better side of
    every other low-bit row's interval, or (None, why there is none). The best mean alone is
    not a winner: with a few clips its interval often overlaps the runner-up's."""
    rows = [(k, *_cell(mine, k, metric)) for k in _keys(mine) if k[0] != REFERENCE]
    rows = [r for r in rows if math.isfinite(r[1])]
    if len(rows) < 2:
        return None, "fewer than two low-bit methods scored"
    lower = not _higher(mine, metric)
    rows.sort(key=lambda r: r[1] if lower else -r[1])
    (key, mean, half), others = rows[0], rows[1:]
    if not math.isfinite(half):
        return None, f"{label(*key)} has no interval (one clip, or an infinite value)"
    for other, o_mean, o_half in others:
        if not math.isfinite(o_half):
            return None, f"{label(*other)} has no interval (one clip, or an infinite value)"
        clear = mean + half < o_mean - o_half if lower else mean - half > o_mean + o_half
        if not clear:
            return None, f"the 95% intervals of {label(*key)} and {label(*other)} overlap"
    return key, ""


def no_best_note(long: pd.DataFrame, model: str) -> str:
    """One line naming the columns of `model`'s table with no bold, and why."""
    mine = long[long.model == model]
    reasons = {m: best(mine, m)[1] for m in _metrics(mine)}
    by_reason: dict[str, list[str]] = {}
    for metric, why in reasons.items():
        if why:
            by_reason.setdefault(why, []).append(metric)
    if not by_reason:
        return ""
    return "No bold in " + "; in ".join(f"{', '.join(ms)}: {why}" for why, ms in by_reason.items()) + "."


def _keys(mine: pd.DataFrame) -> list[tuple[str, str]]:
    return sorted({(r.method, r.variant) for r in mine.itertuples()},
                  key=lambda k: (method_order(k[0]), k[1]))


def _higher(mine: pd.DataFrame, metric: str) -> bool:
    """The direction `fidelity` recorded beside the rows (a plugin's metric's, from its
    score.json), else the metric registry's."""
    recorded = mine[mine.metric == metric].get("higher_is_better")
    recorded = [] if recorded is None else list(recorded.dropna())
    return bool(all(recorded)) if recorded else higher_is_better(metric)


def _metrics(mine: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(mine.metric))


def _cell(mine: pd.DataFrame, key: tuple[str, str], metric: str) -> tuple[float, float]:
    r = mine[(mine.method == key[0]) & (mine.variant == key[1]) & (mine.metric == metric)]
    return (float(r["mean"].iloc[0]), float(r.ci95_half.iloc[0])) if len(r) else (math.nan, math.nan)


def markdown(df: pd.DataFrame, digits: int = 4) -> str:
    """A GitHub Markdown table; floats to `digits` significant digits."""
    def cell(v):
        if isinstance(v, (float, np.floating)):
            return fmt(float(v), digits)
        return str(v).replace("|", "\\|")

    head = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "|" + "|".join("---" for _ in df.columns) + "|"
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def analysis_table(run: TableRun) -> pd.DataFrame:
    if run.kind == "expcast":
        t = run.tables["expcast"]
        return pd.DataFrame({"quantity": t.columns, "value": t.iloc[0].values})
    return run.tables[run.kind]
