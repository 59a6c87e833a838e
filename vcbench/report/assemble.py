"""`vcbench report`: run folders in, one folder out with report.md, CSVs and PNG figures.

    OUT/report.md          provenance, fidelity per model, clip time (measured, or projected
                           by project-clip), attention speedup, frame strips, kernel
                           analyses: each table with its figure
    OUT/report.html        the same, after every clip to watch side by side with its
                           difference from bf16, all in sync (html.py); OUT/clips/ its videos
    OUT/*.csv              every table the report shows, in full precision
    OUT/*.png              the figures

Sections appear only for the runs given; nothing is computed that the runs do not hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from vcbench.errors import UserError
from vcbench.report import figures, html, tables
from vcbench.report.load import GenerateRun, Runs, load_runs
from vcbench.runs import atomic_write_bytes, atomic_write_text

STRIP_FRAMES = 5  # appendix E cuts five frames per row
PROJECTION_NOTE = (
    "**Projected, not measured.** `vcbench project-clip` builds Wan2.2-T2V-A14B's parts from "
    "their published configs with **random weights** (speed does not depend on weight values) "
    "and times them on the paper's clip: the UMT5-XXL text encoder (counted twice: prompt and "
    "negative prompt), one transformer expert per kind of denoising step with the attention "
    "swapped to each method (counted for both CFG calls of every step of that kind; V-Smooth's "
    "regroup, reuse and plain steps weighted by its grouping schedule), and the VAE decode. "
    "Clip = text + denoising + decode. A run whose attention was emulated on the CPU (the "
    "tests' tiny config) gets no speedup. "
    "Tokenizing, scheduler updates and the uint8 conversion are not counted. With the weights, "
    "`make fig6 MODEL_PATH=DIR` measures the clip instead.")


def _cards(runs: Runs) -> str:
    """The GPUs the runs' manifests name (CPU for runs that had none), in order met."""
    names = []
    for run in runs.all():
        device = run.manifest.get("device") or {}
        names.append(device.get("gpu") or "CPU")
    return " + ".join(dict.fromkeys(names)) or "?"


@dataclass
class Report:
    out: Path
    main: pd.DataFrame  # the table printed in the terminal
    main_title: str
    files: list[Path] = field(default_factory=list)  # report.md, report.html, tables, figures
    clips: list[Path] = field(default_factory=list)  # the videos report.html plays


def build_report(paths: list[Path], out: Path, title: str | None = None) -> Report:
    """`title` heads report.md; `{card}` in it becomes the device(s) the runs ran on, so a
    table reproduced here is never read as the paper's card's."""
    runs = load_runs(paths)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    heading = (title or "vcbench report").replace("{card}", _cards(runs))
    md: list[str] = [f"# {heading}", ""]
    files: list[Path] = []

    def csv(df: pd.DataFrame, name: str) -> None:
        path = out / f"{name}.csv"
        atomic_write_text(path, df.to_csv(index=False))
        files.append(path)

    def figure(path: Path | None, alt: str) -> None:
        if path is not None:
            files.append(path)
            md.extend([f"![{alt}]({path.name})", ""])

    prov = tables.provenance(runs)
    csv(prov, "provenance")
    md += ["## Provenance", ""]
    notes = tables.differences(prov)
    md += [f"- **{n}**" for n in notes] + ([""] if notes else [])
    if any(getattr(r, "config", {}).get("random_weights") for r in runs.generate):
        md += ["- **random-weight model**: clips come from a model with random weights; they "
               "exercise the pipeline and the methods, they are not the paper's videos.", ""]
    md += [tables.markdown(prov), ""]

    main, main_title = pd.DataFrame(), "no fidelity scores in these runs"
    long = tables.fidelity(runs)
    clip = tables.clip_time(runs)
    if len(long):
        csv(long, "fidelity")
        md += ["## Fidelity against bf16 (Tables 2 and 3)", "",
               "Mean over clips ± half width of the 95% Student-t interval; `clips` is the number "
               "of clips averaged. Bold: the best low-bit method of a column, only where its "
               "95% interval lies clear of every other low-bit method's.", ""]
        for model in dict.fromkeys(long.model):
            wide = tables.fidelity_wide(long, model)
            md += [f"### {model}{_random_tag(runs, model)}", "", tables.markdown(wide), ""]
            note = tables.no_best_note(long, model)
            md += [note, ""] if note else []
            if main.empty:
                main = tables.fidelity_wide(long, model, marked=False)
                main_title = f"fidelity vs bf16 (mean ± 95% CI), {model}{_random_tag(runs, model)}"
        for metric in ("psnr", "lpips"):
            figure(figures.metric_per_model(long, metric, out / f"{metric}_per_model.png",
                                            f"{metric} per method per model (error bar: 95% CI over clips)"),
                   f"{metric} per method per model")
    if len(clip):
        csv(clip, "clip_time")
        md += ["## Clip wall clock", "", _clip_note(clip), "",
               tables.markdown(clip.drop(columns=["run"])), ""]
    speed = tables.speedup(runs)
    if len(speed):
        csv(speed, "speedup")
        md += ["## Attention speedup over bf16 (Figure 6, top)", "",
               "CUPTI per-launch median of the attention kernel alone (vcbench timeit).", "",
               tables.markdown(speed.drop(columns=["run"])), ""]
    projected, parts = tables.clip_projection(runs)
    if len(projected):
        csv(projected, "clip_time_projected")
        csv(parts, "clip_parts_projected")
        md += ["## Clip wall clock, projected (Figure 6, bottom)", "", PROJECTION_NOTE, ""]
        for text in dict.fromkeys(projected.label):
            md += [f"**{text}.**", ""]
        md += [tables.markdown(projected.drop(columns=["run", "label"])), "",
               "The timed parts (seconds per call: median of `samples` calls; `calls_in_clip` "
               "counts both CFG passes of every step of that kind):", "",
               tables.markdown(parts.drop(columns=["run", "label"])), ""]
    if len(speed) or len(clip) or len(projected):
        note = _clip_note(clip) if len(clip) else ""
        if len(projected):
            note = (note + " " if note else "") + "Projected panels: parts timed with random " \
                "weights, summed per method; not a measured clip."
        drawn = figures.speedup_bars(speed, clip, out / "speedup.png", note, projected)
        figure(drawn, "speedup over bf16")
        if drawn is None:
            md += ["No speedup figure: the only times here are of emulated methods. Kernel "
                   "speedups need a GPU (`vcbench timeit`, `make fig6`).", ""]
    for model in dict.fromkeys(r.model for r in runs.generate):
        strip = _frame_strip([r for r in runs.generate if r.model == model], out)
        if strip is not None:
            md += [f"## Frame strip: {model} (appendix E)", "",
                   "The same frame indices in every row; PSNR of this clip alone against its bf16 render.", ""]
            figure(strip, f"frame strip {model}")
    for i, run in enumerate(runs.checks):
        _check_section(run, out, md, csv, figure, suffix="" if i == 0 else f"_{i + 1}")
    kinds: list[str] = []
    for run in runs.analyses:  # a second run of one analysis gets _2, _3 ... on its files
        kinds.append(run.kind)
        count = kinds.count(run.kind)
        _analysis_section(run, out, md, csv, figure, suffix="" if count == 1 else f"_{count}")
    atomic_write_text(out / "report.md", "\n".join(md))
    page, clips = html.write_html(runs, out, "\n".join(md), heading)
    files[:0] = [out / "report.md", page]
    if main.empty and len(speed):
        main, main_title = speed.drop(columns=["run"]), "attention speedup over bf16"
    elif main.empty and len(projected):
        main = projected.drop(columns=["run", "label"])
        main_title = "clip time per method (projected, not measured)"
    return Report(out, main, main_title, files, clips)


def _random_tag(runs: Runs, model: str) -> str:
    weights = [r.config.get("random_weights") for r in runs.generate if r.model == model]
    return " (random weights)" if any(weights) else ""


def _clip_note(clip: pd.DataFrame) -> str:
    if set(clip.backend) == {"emulate"} or set(clip.device) == {"cpu"}:
        return ("Wall clock of one clip with the methods **emulated in PyTorch** "
                f"({', '.join(sorted(set(clip.device)))}): this times the emulation, not a kernel; "
                "it says nothing about the speed of a method, so no speedup is derived from it.")
    return "Wall clock of one clip (CUDA-synchronized around the call, model loading excluded)."


def _frame_strip(runs: list[GenerateRun], out: Path) -> Path | None:
    """One clip (the prompt and seed most rows have) as each method and variant of one model
    rendered it, across that model's runs (their clip settings match, by the load checks)."""
    from vcbench.clips import read_clip

    by_key: dict[tuple, dict] = {}  # (prompt_id, seed) -> row label -> (run, clip row)
    for run in runs:
        psnr = {(r.get("method"), r.get("prompt_id"), r.get("seed")): tables.as_float(r.get("psnr"))
                for r in (run.score or {}).get("rows", [])}
        for c in run.clips():
            if c.get("status") != "ok" or not c.get("frames_dir"):
                continue
            name = tables.label(c["method"], tables.variant(run, c["method"]))
            by_key.setdefault((c["prompt_id"], c["seed"]), {}).setdefault(
                name, (run, c, psnr.get((c["method"], c["prompt_id"], c["seed"]))))
    if not by_key:
        return None
    key = max(by_key, key=lambda k: len(by_key[k]))  # first (prompt, seed) with the most rows
    rows = []
    for name, (run, c, psnr) in sorted(by_key[key].items(),
                                       key=lambda kv: (tables.method_order(kv[1][1]["method"]), kv[0])):
        if c["method"] == tables.REFERENCE:
            tag = "reference"
        elif psnr is None or math.isnan(psnr):
            tag = "PSNR n/a (not scored)"
        else:
            tag = f"PSNR {psnr:.2f} dB"
        rows.append((f"{name}\n{tag}", read_clip(run.path / c["frames_dir"]).frames))
    shapes = {f.shape for _, f in rows}
    if len(shapes) > 1:
        raise UserError(f"clips of {runs[0].model} {key[0]}/s{key[1]} differ in shape {sorted(shapes)}")
    t = rows[0][1].shape[0]
    indices = sorted({int(i) for i in np.linspace(0, t - 1, min(STRIP_FRAMES, t)).round()})
    prompt = next(iter(by_key[key].values()))[1].get("prompt", "")
    title = f"{runs[0].model}, prompt {key[0]} seed {key[1]}: {prompt[:90]}"
    return figures.frame_strip(rows, indices, out / f"frame_strip_{_slug(runs[0].model)}.png", title)


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in text)


def _check_section(run, out: Path, md: list[str], csv, figure, suffix: str) -> None:
    """`vcbench check-tiny`: does the model draw what its captions say (issue 8's check). The
    summary is the table's own: the fraction of rows that pass, and of each criterion."""
    from vcbench.pipelines.check_tiny import REQUIRED

    table = run.tables["check"]
    random = run.config.get("random_weights")
    score = table.passed.mean()
    verdict = "" if random else (" - passes" if score >= REQUIRED else " - **below the bar**")
    weights = "random init (baseline)" if random else run.config.get("weights")
    md += ["## Caption check: tiny-wan (held-out captions)", "",
           f"Weights: {weights} (run `{run.path}`). Passed {score:.2f} of {len(table)} captions "
           f"(named colour in the frame {table.colour_ok.mean():.2f}, moving the named way "
           f"{table.direction_ok.mean():.2f}); trained weights need {REQUIRED:.2f}{verdict}.", "",
           tables.markdown(table, digits=3), ""]
    csv(table, f"caption_check{suffix}")
    strip = run.path / "strip.png"
    if strip.is_file():
        copy = out / f"caption_check_strip{suffix}.png"
        atomic_write_bytes(copy, strip.read_bytes())
        figure(copy, "one clip per held-out caption, frames 0, 4, 8, 12, 16")


def _analysis_section(run, out: Path, md: list[str], csv, figure, suffix: str) -> None:
    inputs = run.config.get("tensors") or f"beta {run.config.get('beta')}"
    if run.kind == "fusion":  # timed on a card: the heading names it
        shape = "x".join(str(x) for x in run.config.get("shape", []))
        inputs = f"{run.config.get('method')} call, (B, H, N, D) {shape}, on {run.config.get('device')}"
    table = tables.analysis_table(run)
    titles = {"expcast": "ExpCast-FP8 vs exp-then-cast (Figure 5)",
              "kernel_error": "Output error split into probability and value terms (Figure 3a)",
              "token_order": "Token orders for the value quantizer (Table 1, Figure 4)",
              "fusion": "The preprocessing chain fused one stage at a time (Figure 7)"}
    md += [f"## {titles[run.kind]}", "", f"Inputs: {inputs} (run `{run.path}`).", "",
           tables.markdown(table, digits=6), ""]
    csv(table, f"{run.kind}{suffix}")
    note = f"{titles[run.kind]}; inputs: {inputs}"
    if run.kind == "expcast":
        figure(figures.expcast_figure(run.tables["byte_map"], out / f"fig5_expcast{suffix}.png", note),
               "ExpCast byte map and error")
    elif run.kind == "kernel_error":
        figure(figures.kernel_error_figure(table, out / f"fig3_kernel_error{suffix}.png", note),
               "probability vs value error")
    elif run.kind == "fusion":
        figure(figures.fusion_figure(table, out / f"fig7_fusion{suffix}.png", note),
               "preprocessing time per rung, cumulative factor over the eager chain")
    else:
        figure(figures.token_order_figure(table, out / f"fig4_token_order{suffix}.png", note),
               "token order energy share and value error")
