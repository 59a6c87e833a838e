"""`vcbench generate`: one clip per (method, prompt, seed), resumable, shardable.

Run folder (what `vcbench score` reads):

    RUN/manifest.json                          config + one row per clip (`items`) + what
                                               each process made (`ranks`)
    RUN/ranks/rank<r>.json                     the clips process r made and skipped
    RUN/clips/<method>/<prompt_id>/s<seed>/
        frames/000000.png ...                  lossless frames (scored)
        frames.npy                             only a clip with NaN/inf: its float frames
                                               (row: nonfinite_frames, frames_npy; scored)
        preview.mp4                            H.264 preview (for people; not made
                                               without PyAV: row mp4 null)
        row.json                               this clip's manifest row

Each clip's `row.json` is the source of truth and is written atomically by the process that
made the clip; `manifest.json` is rebuilt from the rows of the requested clips. So a killed
run loses only the clip in flight (its row says `partial`), several torchrun processes never
write the same file, and a rerun skips every clip whose row matches the request and whose
frames still hash to the recorded sha256. Ctrl-C or SIGTERM marks the manifest `interrupted`
(vcbench.interrupts); the rerun says how many finished clips it kept.
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vcbench import interrupts
from vcbench.errors import UserError
from vcbench.kernels import check_runnable, describe_method, get_method
from vcbench.kernels.spec.vsmooth import GroupingSchedule
from vcbench.pipelines import distributed, registry
from vcbench.pipelines.loaded import ClipSettings, LoadedModel, nonfinite_frames, to_uint8
from vcbench.pipelines.patch import (
    SCHEDULE_OPTIONS,
    compile_denoisers,
    compile_seconds,
    patch,
    rope_paths,
)
from vcbench.pipelines.progress import ClipProgress
from vcbench.pipelines.prompts import Prompt
from vcbench.pipelines.video_io import (
    can_write_mp4,
    frames_sha256,
    write_frames,
    write_mp4,
    write_npy,
)
from vcbench.runs import (
    MANIFEST,
    RunFolder,
    remove_temporaries,
    remove_unused_folder,
    sole_writer,
    write_json,
)

ROW = "row.json"
RANKS = "ranks"


@dataclass
class GenerateRequest:
    model: str
    methods: list[str]
    prompts: list[Prompt]
    seeds: list[int]
    out: Path
    model_path: Path | None = None
    steps: int | None = None
    frames: int | None = None
    height: int | None = None
    width: int | None = None
    options: dict[str, dict[str, Any]] = field(default_factory=dict)  # method -> options
    schedule: dict[str, Any] = field(default_factory=dict)  # schedule_* options
    backend: str = "emulate"
    device: str | None = None
    lora_path: Path | None = None  # minimax-h3's distillation LoRA
    compile: bool = False  # torch.compile the transformer(s) after patching


@dataclass(frozen=True)
class Item:
    method: str
    prompt: Prompt
    seed: int

    @property
    def key(self) -> str:
        return f"{self.method}/{self.prompt.id}/s{self.seed}"


def check_options(methods: list[str], options: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per-method options (from --option METHOD.KEY=VALUE), checked before any model loads."""
    unknown = sorted(set(options) - set(methods))
    if unknown:
        raise UserError(f"--option {unknown[0]}.*: method {unknown[0]!r} is not in --methods")
    out = {m: dict(options.get(m, {})) for m in methods}
    for m, opts in out.items():
        get_method(m).resolve(opts)  # unknown keys and bad values are UserErrors
    return out


def resolve_settings(defaults: ClipSettings, req: GenerateRequest, model: str) -> ClipSettings:
    """The request's clip settings, each left out taken from the model's defaults (0 is a
    value, and refused, not a default; a default of 0 is a setting the model has none for)."""
    s = ClipSettings(**{k: getattr(defaults, k) if getattr(req, k) is None else getattr(req, k)
                        for k in ("steps", "frames", "height", "width")})
    for key in ("steps", "frames", "height", "width"):
        if getattr(req, key) is None and getattr(defaults, key) < 1:
            raise UserError(f"{model} has no default for --{key}: pass it")
    return s


def plan_items(req: GenerateRequest) -> list[Item]:
    if not req.methods:
        raise UserError("--methods is empty")
    if not req.seeds:
        raise UserError("--seeds is empty")
    for flag, values in (("--methods", req.methods), ("--seeds", req.seeds)):
        twice = next((v for i, v in enumerate(values) if v in values[:i]), None)
        if twice is not None:
            raise UserError(f"{flag} lists {twice!r} twice")
    # Method-major so one process patches the pipeline once per method.
    return [Item(m, p, s) for m in req.methods for p in req.prompts for s in req.seeds]


def check_request(req: GenerateRequest) -> tuple[list[Item], dict[str, dict[str, Any]], ClipSettings]:
    """Every part of the request a user can get wrong, checked before a model loads or a run
    folder is made: the methods and their options (and external kernels that cannot run on
    this device), the schedule, the plan, the model and its folder, the device, and the clip
    settings the model accepts."""
    registry.check_device(req.device)
    device_type = torch.device(req.device or ("cuda" if torch.cuda.is_available() else "cpu")).type
    for m in req.methods:
        check_runnable(m, device_type)
    method_options = check_options(req.methods, req.options)
    _schedule(req)
    items = plan_items(req)
    entry = registry.check_request(req.model, req.model_path, distributed.device(req.device),
                                   req.lora_path)
    if entry.defaults is None:  # the folder's pipeline says, once it loads (--model diffusers)
        registry.check_settings(entry, None, given=req)
        return items, method_options, None
    settings = resolve_settings(entry.defaults, req, entry.name)
    registry.check_settings(entry, settings)
    return items, method_options, settings


def run_generate(req: GenerateRequest, show_progress: bool = True) -> Path:
    items, method_options, settings = check_request(req)
    rank, world = distributed.setup()
    made_folder = not Path(req.out).exists()
    # One writer per run folder: rank 0 holds the lock for its whole job, and no rank writes
    # before it has it (a second `vcbench generate` on the folder stops here, untouched).
    try:
        with ExitStack() as held:
            refused = None
            if rank == 0:
                try:
                    held.enter_context(sole_writer(req.out, "vcbench generate"))
                except UserError as e:
                    refused = str(e)
            refused = distributed.from_rank0(refused)
            if refused:
                distributed.teardown()
                raise UserError(refused)
            return _generate(req, items, method_options, settings, rank, world, show_progress)
    except UserError:
        if rank == 0 and made_folder:  # a run that never started leaves no folder behind
            remove_unused_folder(req.out)
        raise


@dataclass(frozen=True)
class GenerateRun:
    """What every clip of one run shares, resolved once: the request, the loaded model, the
    clip settings and method options it resolved to, the run folder, and this process's place
    among the torchrun processes. It travels as one object so that a clip's signature, its
    implementation label and the manifest are all computed from the same values."""

    req: GenerateRequest
    model: LoadedModel
    settings: ClipSettings
    method_options: dict[str, dict[str, Any]]
    folder: RunFolder
    items: list[Item]  # the whole plan, in order: what the manifest lists
    rank: int = 0
    world: int = 1

    @property
    def root(self) -> Path:
        return self.folder.path

    @property
    def mine(self) -> list[Item]:
        return self.items[self.rank::self.world]

    @property
    def writes_manifest(self) -> bool:
        return self.rank == 0

    def signature(self, item: Item) -> dict[str, Any]:
        """The fields that define a clip: a finished row is reused only if these all match."""
        req = self.req
        return {"item": item.key, "method": item.method,
                "options": {**self.method_options[item.method], **_schedule(req)},
                "prompt_id": item.prompt.id, "prompt": item.prompt.text, "seed": item.seed,
                **asdict(self.settings), "model": self.model.name,
                "random_weights": self.model.random_weights, "backend": req.backend,
                **({"lora_path": str(req.lora_path)} if req.lora_path else {}),
                **({"compile": True} if req.compile else {})}

    def rope(self, item: Item, active) -> dict[str, str]:
        """Where each transformer's RoPE ran for this clip: "quantizers" or "eager" (the patch
        handed it to the method, whose implementation rotated q and k on load or first;
        `kernels.rope_placement`) or "outside" (the pipeline applied it)."""
        from vcbench.kernels import rope_placement

        placed = rope_placement(item.method, self.method_options[item.method], self.req.backend,
                                str(self.model.device).startswith("cuda"))
        if active.rope_unfusable:  # tables that are not FP32: rotated first everywhere
            placed = "eager"
        return {name: placed if path == "fused" else path
                for name, path in active.rope_paths().items()}

    def implementation(self, item: Item) -> str:
        """What computed this clip's attention: "emulate" or the GPU kernel's label."""
        from vcbench.kernels import implementation_label

        return implementation_label(item.method, self.method_options[item.method],
                                    self.req.backend, str(self.model.device).startswith("cuda"))


def _generate(req: GenerateRequest, items: list[Item], method_options: dict[str, dict[str, Any]],
              settings: ClipSettings | None, rank: int, world: int, show_progress: bool) -> Path:
    """Load the model, resolve the run once into a `GenerateRun`, and make this process's clips."""
    model = registry.load_model(req.model, req.model_path, distributed.device(req.device),
                                req.lora_path)
    if settings is None:  # a model whose defaults and checks come with what it loaded
        settings = resolve_settings(model.defaults, req, model.name)
    if model.check is not None:
        model.check(settings)
    config = _config(req, model, settings, method_options, world)
    run = GenerateRun(req, model, settings, method_options,
                      RunFolder(path=Path(req.out), command="generate", config=config), items,
                      rank, world)
    resuming = (run.root / MANIFEST).is_file()
    if run.writes_manifest:
        for folder in (run.root, run.root / RANKS):  # left by a run stopped at once mid-write
            remove_temporaries(folder)
    shard = _Shard(run.root, rank, world)
    finished = {it.key for it in run.mine if _finished(run.root, it, run.signature(it))}
    if resuming and run.writes_manifest:
        # Other processes' clips by their rows alone: each process hashes its own frames,
        # and may be replacing one while this one would read it.
        others = sum(_finished(run.root, it, run.signature(it), hash_frames=False)
                     for it in items if it not in run.mine)
        print(f"resuming: kept {len(finished) + others} of {len(items)} clips in {run.root}",
              file=sys.stderr, flush=True)
    status, interrupted = "failed", None
    if rank == 0 and not can_write_mp4():
        print("warning: PyAV (av) is not installed: clips get no preview.mp4 (scoring reads "
              "the PNG frames)", file=sys.stderr, flush=True)
    try:
        if run.writes_manifest:
            _write_manifest(run, "running")
        with ClipProgress(len(run.mine), settings.steps,
                          enabled=show_progress and rank == 0) as bar:
            _run_items(run, bar, shard, finished)
        status = "ok"
    except KeyboardInterrupt as e:
        status, interrupted = "interrupted", e
        raise
    finally:
        if status == "ok":
            distributed.barrier()
        if run.writes_manifest:
            rows = _write_manifest(run, status)
            if status == "ok" and any(r["status"] != "ok" for r in rows):
                _write_manifest(run, "failed")  # some clips errored: say so
            if interrupted is not None:
                done = sum(r["status"] == "ok" for r in rows)
                interrupts.describe(interrupted, f"{done} of {len(items)} clips finished "
                                    "(the one in flight is marked partial)", out=run.root)
        distributed.teardown()
    return run.root


@dataclass
class _Shard:
    """What one process made (a clip that failed counts: its row says so) and skipped as
    already finished, in RUN/ranks/rank<r>.json, rewritten after every clip. Each process
    writes only its own file and the manifest lists them all, so a run shows which process
    made which clip, and that none was made twice. A file left by an earlier run with more
    processes is removed by rank 0."""

    root: Path
    rank: int
    world: int
    made: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.rank == 0:
            for stale in (self.root / RANKS).glob("rank*.json"):
                if stale.stem[4:].isdigit() and int(stale.stem[4:]) >= self.world:
                    stale.unlink(missing_ok=True)
        self.write()

    def write(self) -> None:
        write_json(self.root / RANKS / f"rank{self.rank}.json",
                   {"rank": self.rank, "world_size": self.world, "made": self.made,
                    "skipped": self.skipped})


def _read_shards(root: Path, world: int) -> list[dict[str, Any]]:
    shards = []
    for r in range(world):
        try:
            shards.append(json.loads((root / RANKS / f"rank{r}.json").read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # not written yet
    return shards


def _run_items(run: GenerateRun, bar: ClipProgress, shard: _Shard, finished: set[str]) -> None:
    active = uncompile = None
    req = run.req

    def release() -> None:
        if uncompile is not None:
            uncompile()
        if active is not None:
            active.restore()

    try:
        for item in run.mine:
            bar.start_clip(item.key)
            if item.key in finished:
                shard.skipped.append(item.key)
                shard.write()
                bar.skip_clip()
                continue
            if active is None or active.method != item.method:
                release()
                uncompile = None
                active = patch(run.model.pipe, item.method, backend=req.backend,
                               **run.method_options[item.method], **_schedule(req))
                if req.compile:  # compiled per method: the graph holds the method's ops
                    uncompile = compile_denoisers(run.model.pipe)
            try:
                _make_clip(run, item, active, bar)
                shard.made.append(item.key)
                shard.write()
            finally:
                if run.writes_manifest:
                    _write_manifest(run, "running")
            bar.end_clip()
    finally:
        release()


def _make_clip(run: GenerateRun, item: Item, active, bar: ClipProgress) -> None:
    root, model, settings = run.root, run.model, run.settings
    clip = root / "clips" / item.key
    clip.mkdir(parents=True, exist_ok=True)
    for stale in clip.glob(".*.tmp-*"):  # left by a clip killed mid-write
        shutil.rmtree(stale, ignore_errors=True) if stale.is_dir() else stale.unlink()
    remove_temporaries(clip)
    row = run.signature(item)
    write_json(clip / ROW, {**row, "status": "partial"})
    active.reset()
    done = [0]  # steps finished, for the error line of a clip that fails part way

    def on_step(i: int) -> None:
        done[0] = i
        bar.step(i)

    try:
        _sync(model)
        compiling = compile_seconds()
        start = time.perf_counter()
        raw = model.generate_float(item.prompt.text, item.seed, settings, on_step)
        _sync(model)
        # Compilation runs inside the first calls; its time is recorded beside the wall
        # figure, not in it (0 for every clip after the first of a compiled method).
        compiled_s = compile_seconds() - compiling
        wall = time.perf_counter() - start - compiled_s
    except (KeyboardInterrupt, UserError):
        raise
    except Exception as e:  # a failing clip is recorded, the run goes on, a rerun retries it
        write_json(clip / ROW, {**row, "status": "error",
                                "error": clip_error(e, done[0], settings.steps)})
        _release_memory(model)
        return
    frames = to_uint8(raw)
    rel = clip.relative_to(root).as_posix()
    broken = nonfinite_frames(raw)
    extra = {}
    (clip / "frames.npy").unlink(missing_ok=True)  # an earlier try's, if it had NaN frames
    if broken:  # the PNGs cannot hold NaN: the float frames go beside them, and score reads those
        write_npy(clip / "frames.npy", (raw * 255.0).astype(np.float32))
        extra = {"nonfinite_frames": broken, "frames_npy": f"{rel}/frames.npy"}
    digest = write_frames(frames, clip / "frames")
    mp4 = None
    if can_write_mp4():
        write_mp4(frames, clip / "preview.mp4")
        mp4 = f"{rel}/preview.mp4"
    write_json(clip / ROW, {**row, "status": "ok", "wall_s": round(wall, 4),
                            **({"compile_s": round(compiled_s, 4)} if run.req.compile else {}),
                            "frames_dir": f"{rel}/frames", "mp4": mp4, **extra,
                            "sha256": digest, "num_frames_written": int(frames.shape[0]),
                            "implementation": run.implementation(item),
                            "rope": run.rope(item, active),
                            "grouping_actions": {str(k): v for k, v in sorted(active.actions.items())},
                            "attention_calls": sum(active.routed.values())})


def _finished(root: Path, item: Item, signature: dict[str, Any], hash_frames: bool = True) -> bool:
    clip = root / "clips" / item.key
    try:
        row = json.loads((clip / ROW).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if row.get("status") != "ok" or any(row.get(k) != v for k, v in _jsonable(signature).items()):
        return False
    frames = root / row["frames_dir"]
    if row.get("frames_npy") and not (root / row["frames_npy"]).is_file():
        return False
    if row.get("mp4") and not (root / row["mp4"]).is_file():
        return False
    return frames.is_dir() and (not hash_frames or frames_sha256(frames) == row.get("sha256"))


def clip_error(e: BaseException, steps_done: int, steps: int) -> str:
    """One line: what went wrong with a clip, and where."""
    where = (f"at step {steps_done + 1} of {steps}" if steps_done < steps
             else "after the last step (decoding)")
    text = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, torch.OutOfMemoryError):
        return f"out of GPU memory {where}: {text}"
    if "can't allocate memory" in text:  # torch's CPU allocator raises a plain RuntimeError
        return f"out of host memory {where}: {text}"
    return f"{type(e).__name__} {where}: {text}"


def _release_memory(model: LoadedModel) -> None:
    """What a failed clip held goes back before the next one starts."""
    gc.collect()
    if model.device.type == "cuda":
        torch.cuda.empty_cache()


def _write_manifest(run: GenerateRun, status: str) -> list[dict[str, Any]]:
    """The manifest's rows: the clips of this request, in plan order. A clip an earlier request
    left in the folder (another seed, prompt or method) stays on disk but is not listed: the
    manifest's items are what its config describes, and what `vcbench score` reads."""
    order = {it.key: i for i, it in enumerate(run.items)}
    rows = []
    for path in sorted((run.root / "clips").glob(f"**/{ROW}")):
        try:
            row = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # another process is replacing it; the next rebuild picks it up
        if row.get("item") in order:
            rows.append(row)
    rows.sort(key=lambda r: order[r["item"]])
    run.folder.items = rows
    run.folder.extra["ranks"] = _read_shards(run.root, run.world)
    run.folder.write_manifest(status)
    return rows


def _config(req, model, settings, method_options, world) -> dict[str, Any]:
    return {"model": model.name, "model_path": str(req.model_path) if req.model_path else None,
            "lora_path": str(req.lora_path) if req.lora_path else None,
            "random_weights": model.random_weights, "methods": req.methods,
            "method_options": method_options, "schedule": _schedule(req),
            "method_info": {m: describe_method(m) for m in req.methods},
            "rope": rope_paths(model.pipe),
            "prompts": [asdict(p) for p in req.prompts], "seeds": req.seeds, **asdict(settings),
            "backend": req.backend, "device": str(model.device), "dtype": str(model.dtype),
            "world_size": world, **({"compile": True} if req.compile else {})}


def _schedule(req: GenerateRequest) -> dict[str, Any]:
    unknown = set(req.schedule) - set(SCHEDULE_OPTIONS)
    if unknown:
        raise UserError(f"unknown schedule option {sorted(unknown)[0]!r}")
    try:
        GroupingSchedule(1, **{SCHEDULE_OPTIONS[k]: v for k, v in req.schedule.items()})
    except (TypeError, ValueError) as e:
        raise UserError(f"grouping schedule: {e}") from None
    return dict(req.schedule)


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj))


def _sync(model: LoadedModel) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)

