"""Reading run folders for the report, and refusing to join what cannot be joined.

Each RUN argument is a run folder (manifest.json). What the report takes from it depends on
the manifest's `command`:

    generate               clip rows (`items`: wall_s, frames_dir), and `score.json` beside
                           them, which `vcbench score RUN` (or `score REF RUN`) writes; a
                           run without one gets a warning line and no fidelity rows
    timeit                 result.json rows (attention_ms, speedup_vs_bf16) and the GPU
    project-clip           projection.csv (clip time per method, projected from parts timed
                           with random weights) and parts.csv
    analyze expcast        expcast.csv, byte_map.csv
    analyze kernel-error   kernel_error.csv
    analyze token-order    token_order.csv
    analyze fusion         fusion.csv (Figure 7's rungs, timed on the GPU the config names)
    check-tiny             check.csv (one row per held-out caption; the score is its share of
                           passing rows), strip.png

A fidelity row is identified by (model, method, variant): the variant names the method
options and grouping schedule a run used, so the schedule ablation's three vc-8bit runs are
three rows. Generate runs of one model must share their clip settings (steps, frames, size,
seeds, prompts), or a row would compare unlike clips: that is refused. Differing vcbench
versions or commits are not refused; the provenance table shows them.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from vcbench.errors import UserError
from vcbench.kernels import REFERENCE_METHOD
from vcbench.runs import SCORE_FILE, read_manifest

ANALYSES = {"analyze expcast": "expcast", "analyze kernel-error": "kernel_error",
            "analyze token-order": "token_order", "analyze fusion": "fusion"}
PROJECTION = "project-clip"
CHECK = "check-tiny"
# Settings that make two generate runs of one model comparable clip for clip.
CLIP_SETTINGS = ("steps", "frames", "height", "width", "seeds", "prompts", "random_weights",
                 "model_path")


@dataclass
class Run:
    path: Path
    manifest: dict[str, Any]

    @property
    def command(self) -> str:
        return str(self.manifest.get("command"))

    @property
    def config(self) -> dict[str, Any]:
        return self.manifest.get("config") or {}


@dataclass
class GenerateRun(Run):
    score: dict[str, Any] | None = None  # score.json, checked against the run's clips

    @property
    def model(self) -> str:
        return str(self.config.get("model"))

    def clips(self) -> list[dict[str, Any]]:
        return [r for r in self.manifest.get("items", []) if isinstance(r, dict) and "method" in r]

    def method_info(self, method: str) -> dict[str, Any]:
        """What the run recorded of `method` (kind, bits, formats, whether it groups V, where
        it came from); for a run older than those records, the registry's, where it knows the
        method. A plugin's method renders from the record on a machine that lacks the plugin."""
        recorded = (self.config.get("method_info") or {}).get(method)
        if recorded:
            return recorded
        from vcbench.kernels import METHODS, describe_method

        return describe_method(method) if method in METHODS else {"method": method}


@dataclass
class TableRun(Run):
    """timeit and analyze runs: named tables (CSV) plus result.json."""

    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return {"timeit": "timeit", PROJECTION: "projection", CHECK: "check"}.get(self.command) \
            or ANALYSES[self.command]


@dataclass
class Runs:
    generate: list[GenerateRun] = field(default_factory=list)
    timeit: list[TableRun] = field(default_factory=list)
    projections: list[TableRun] = field(default_factory=list)
    analyses: list[TableRun] = field(default_factory=list)
    checks: list[TableRun] = field(default_factory=list)

    def all(self) -> list[Run]:
        return [*self.generate, *self.timeit, *self.projections, *self.analyses, *self.checks]


def load_runs(paths: list[Path]) -> Runs:
    if not paths:
        raise UserError("report needs at least one run folder")
    runs = Runs()
    seen: set[Path] = set()
    for path in paths:
        path = Path(path)
        if not path.is_dir():
            raise UserError(f"{path} is not a directory (report takes run folders)")
        if path.resolve() in seen:
            raise UserError(f"{path} is given twice")
        seen.add(path.resolve())
        manifest = read_manifest(path)
        command = manifest.get("command")
        if command == "generate":
            runs.generate.append(_generate_run(path, manifest))
        elif command == "timeit":
            runs.timeit.append(_table_run(path, manifest, ["timeit"]))
        elif command == PROJECTION:
            runs.projections.append(_table_run(path, manifest, ["projection", "parts"]))
        elif command in ANALYSES:
            names = ["expcast", "byte_map"] if command == "analyze expcast" else [ANALYSES[command]]
            runs.analyses.append(_table_run(path, manifest, names))
        elif command == CHECK:
            runs.checks.append(_table_run(path, manifest, ["check"]))
        else:
            raise UserError(f"{path}: report does not know runs of command {command!r} "
                            f"(generate, timeit, {PROJECTION}, {', '.join(ANALYSES)}, {CHECK})")
    check_comparable(runs.generate)
    return runs


def _generate_run(path: Path, manifest: dict[str, Any]) -> GenerateRun:
    run = GenerateRun(path, manifest)
    score_path = path / SCORE_FILE
    if score_path.is_file():
        try:
            run.score = json.loads(score_path.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{score_path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        _check_score(run, score_path)
    elif any(c["method"] != REFERENCE_METHOD for c in run.clips()):
        # a run of bf16 clips alone is a reference: there is nothing in it to score
        print(f"warning: {path} has no {SCORE_FILE}: the report leaves its clips unscored; "
              f"score them first with: vcbench score {path}", file=sys.stderr)
    return run


def _check_score(run: GenerateRun, score_path: Path) -> None:
    """A score file must score this run's clips: a copied or stale one would mislabel rows."""
    rows = run.score.get("rows") if isinstance(run.score, dict) else None
    if not isinstance(rows, list):
        raise UserError(f"{score_path}: no 'rows' (write it with vcbench score RUN --json)")
    clips = {(c["method"], c.get("prompt_id"), c.get("seed")) for c in run.clips()}
    for row in rows:
        key = (row.get("method"), row.get("prompt_id"), row.get("seed"))
        if key not in clips:
            raise UserError(f"{score_path}: scores clip {'/'.join(map(str, key))}, which {run.path} "
                            "did not generate")
    _check_reference(run, score_path, rows)


def _check_reference(run: GenerateRun, score_path: Path, rows: list[dict]) -> None:
    """Every row must be scored against a bf16 clip. `vcbench score REF RUN --pair-by method`
    pairs a method with REF's clips of the same method, which is a rerun check, not fidelity
    against bf16: such a score (written with --json) would land in the wrong table."""
    ref_dir = run.score.get("ref") if run.score.get("cand") else None
    if not ref_dir or not (Path(ref_dir) / "manifest.json").is_file():
        return  # scored within the run (always against bf16), or REF moved: nothing to check
    ref_items = read_manifest(ref_dir).get("items", [])
    method_of = {str(Path(ref_dir) / i["frames_dir"]): i.get("method")
                 for i in ref_items if isinstance(i, dict) and i.get("frames_dir")}
    for row in rows:
        method = method_of.get(str(row.get("ref")))
        if method is not None and method != REFERENCE_METHOD:
            raise UserError(f"{score_path}: {row.get('method')} is scored against {ref_dir}'s "
                            f"{method} clips, not bf16; score it with the default --pair-by reference")


def _table_run(path: Path, manifest: dict[str, Any], names: list[str]) -> TableRun:
    run = TableRun(path, manifest)
    for name in names:
        csv = path / f"{name}.csv"
        if not csv.is_file():
            raise UserError(f"{path}: {manifest.get('command')} run has no {csv.name} "
                            f"(status {manifest.get('status')!r})")
        run.tables[name] = pd.read_csv(csv)
    result = path / "result.json"
    if result.is_file():
        run.result = json.loads(result.read_text())
    return run


def check_comparable(generate: list[GenerateRun]) -> None:
    """Runs of one model land in one table: refuse if their clips are not alike."""
    by_model: dict[str, GenerateRun] = {}
    for run in generate:
        first = by_model.setdefault(run.model, run)
        for key in CLIP_SETTINGS:
            a, b = first.config.get(key), run.config.get(key)
            if a != b:
                shown = (_short(a), _short(b)) if key != "prompts" else ("one prompt set", "another")
                raise UserError(f"{first.path} and {run.path} are both {run.model} but differ in "
                                f"{key} ({shown[0]} vs {shown[1]}): one table would compare unlike "
                                "clips; report them separately")


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."
