"""What to compare with what: REF/CAND paths -> the clip pairs to score.

Each argument is one clip (a video file, a frame directory, a .npy) or a run folder written by
`vcbench generate` (a directory with manifest.json). Its `items` rows name a clip by `method`,
`prompt_id` and `seed` and locate it by `frames_dir` (PNG frames, preferred: lossless) or
`video` (an FFV1 .mkv), relative to the run folder. Only items with status "ok" are clips.

- one run folder: every non-bf16 clip against the same run's bf16 clip of that prompt and seed;
- two run folders: pairs by prompt id and seed; every method of CAND against REF's bf16
  clips (`pair_by="reference"`, fidelity against the reference run), or against REF's clips
  of the same method (`pair_by="method"`: a rerun checked against the first run);
- two clips: one pair.
In run folders, a clip with no partner, or an item that did not generate, becomes an error row
and the rest still scores.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from vcbench.errors import UserError
from vcbench.kernels import REFERENCE_METHOD
from vcbench.runs import MANIFEST, read_manifest

PAIR_BY = ("reference", "method")  # across two run folders: see the module docstring


@dataclass(frozen=True)
class Pair:
    method: str | None
    prompt_id: str | None
    seed: int | None
    ref: Path | None  # None (with `error` set) when there is nothing to score
    cand: Path | None
    error: str | None = None


@dataclass(frozen=True)
class RunClip:
    method: str
    prompt_id: str
    seed: int
    path: Path | None
    status: str


def is_run_folder(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST).is_file()


def make_pairs(ref: Path, cand: Path | None, pair_by: str = "reference") -> list[Pair]:
    if pair_by not in PAIR_BY:
        raise UserError(f"--pair-by {pair_by!r}: expected {' or '.join(PAIR_BY)}")
    if cand is None:
        if not is_run_folder(ref):
            raise UserError(f"with one argument, {ref} must be a run folder (a directory with {MANIFEST})")
        return _pairs_within_run(read_run_clips(ref))
    for path in (ref, cand):
        if not path.exists():
            raise UserError(f"{path} does not exist")
    ref_is_run, cand_is_run = is_run_folder(ref), is_run_folder(cand)
    if ref_is_run != cand_is_run:
        run, clip = (ref, cand) if ref_is_run else (cand, ref)
        raise UserError(f"cannot compare run folder {run} with single clip {clip}; give two clips or two run folders")
    if not ref_is_run:
        return [Pair(None, None, None, ref, cand)]
    return _pairs_across_runs(read_run_clips(ref), read_run_clips(cand), pair_by)


def read_run_clips(run_dir: Path) -> list[RunClip]:
    manifest = read_manifest(run_dir)
    items = manifest.get("items")
    if not isinstance(items, list):
        raise UserError(f"{run_dir / MANIFEST} has no items list")
    clips = []
    for row in items:
        if not isinstance(row, dict) or not {"method", "prompt_id", "seed"} <= row.keys():
            continue  # items of other kinds (e.g. a model load) are not clips
        status = str(row.get("status", "missing"))
        # frames_npy: a clip with NaN/inf frames, which its PNGs cannot hold
        location = row.get("frames_npy") or row.get("frames_dir") or row.get("video")
        path = run_dir / location if status == "ok" and location else None
        if status == "ok" and path is None:
            status = "ok but neither frames_dir nor video recorded"
        clips.append(RunClip(str(row["method"]), str(row["prompt_id"]), int(row["seed"]), path, status))
    if not clips:
        raise UserError(f"{run_dir / MANIFEST} lists no clips (items with method, prompt_id, seed)")
    return clips


def _pairs_within_run(clips: list[RunClip]) -> list[Pair]:
    refs = [c for c in clips if c.method == REFERENCE_METHOD]
    cands = [c for c in clips if c.method != REFERENCE_METHOD]
    if not refs:
        raise UserError(f"the run folder holds no {REFERENCE_METHOD} clips to score against")
    if not cands:
        raise UserError(f"the run folder holds only {REFERENCE_METHOD} clips; nothing to score")
    return _match(refs, cands)


def _pairs_across_runs(ref_clips: list[RunClip], cand_clips: list[RunClip],
                       pair_by: str) -> list[Pair]:
    if pair_by == "reference":
        refs = [c for c in ref_clips if c.method == REFERENCE_METHOD]
        if not refs:
            raise UserError(f"REF holds no {REFERENCE_METHOD} clips to score against (--pair-by "
                            "method pairs each method with REF's clips of that method)")
        return _match(refs, cand_clips)
    pairs = []
    for method in sorted({c.method for c in cand_clips}):
        # a method REF lacks: every clip of it becomes an error row ("no reference clip")
        pairs += _match([c for c in ref_clips if c.method == method],
                        [c for c in cand_clips if c.method == method])
    return pairs


def _match(refs: list[RunClip], cands: list[RunClip]) -> list[Pair]:
    """Pairs per candidate method, with an error row for every clip that lacks its partner."""
    ref_by_key = {(c.prompt_id, c.seed): c for c in refs}
    cands_by_method: dict[str, dict] = defaultdict(dict)
    for c in cands:
        cands_by_method[c.method][(c.prompt_id, c.seed)] = c
    pairs = []
    for method, by_key in sorted(cands_by_method.items()):
        for key in sorted(set(ref_by_key) | set(by_key), key=lambda k: (k[0], k[1])):
            ref, cand = ref_by_key.get(key), by_key.get(key)
            error = None
            if cand is None:
                error = "no candidate clip for this reference"
            elif ref is None:
                error = "no reference clip for this prompt and seed"
            elif ref.path is None:
                error = f"reference not generated (status: {ref.status})"
            elif cand.path is None:
                error = f"candidate not generated (status: {cand.status})"
            pairs.append(Pair(method, key[0], key[1], ref.path if ref and not error else None,
                              cand.path if cand and not error else None, error))
    return pairs
