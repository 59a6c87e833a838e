"""Run folders: one per command run, with `manifest.json` and tables, all written atomically.

A run folder is the only thing stages hand each other: generate/timeit/analyze write one,
score/report read them. Nothing here knows what a command computes.

    results/<run>/
        manifest.json   resolved config, versions, git commit, device, times, per-item status
        <table>.csv     one file per table, plus <table>.parquet
        ...             whatever the command writes through `RunFolder.path`
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import json
import math
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from vcbench.errors import UserError

MANIFEST = "manifest.json"
SCORE_FILE = "score.json"  # `vcbench score` writes it into the run it scored; report reads it
_LIBRARIES = ("torch", "numpy", "pandas", "triton", "diffusers", "lpips", "scikit-image", "av")


def umask() -> int:
    """The process's umask, read without changing it (os.umask can only set it, and setting
    it back leaves a moment in which another thread's files get the wrong mode)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _temporary(folder: Path, prefix: str, suffix: str) -> tuple[int, str]:
    """mkstemp, with the mode a plain open() would give (0644 under the usual umask), not
    mkstemp's private 0600: results are for the user's other tools and other users."""
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=prefix, suffix=suffix)
    os.fchmod(fd, 0o666 & ~umask())
    return fd, tmp


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` so that a reader sees the old file or the new one, never half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temporary(path.parent, f".{path.name}.", ".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def remove_temporaries(folder: str | os.PathLike) -> None:
    """Delete the temporaries `atomic_write_bytes` left in `folder` when its process was
    stopped at once between writing one and renaming it (the file it was to replace is
    intact). Only for a folder this process holds (`sole_writer`): another writer's
    temporary would be in use."""
    for tmp in Path(folder).glob(".*.tmp"):
        tmp.unlink(missing_ok=True)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "tolist"):  # numpy / torch scalars and arrays
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "__dataclass_fields__"):
        return {k: getattr(obj, k) for k in obj.__dataclass_fields__}
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _json_safe(obj: Any) -> Any:
    """Map non-finite floats to the strings "inf", "-inf", "nan" so the JSON stays standard."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj


def dumps_json(obj: Any) -> str:
    return json.dumps(_json_safe(json.loads(json.dumps(obj, default=_json_default))), indent=2) + "\n"


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Atomic, standard JSON (non-finite floats written as strings "inf"/"nan")."""
    atomic_write_text(path, dumps_json(obj))


def write_table(df: pd.DataFrame, path_without_suffix: str | os.PathLike) -> list[Path]:
    """Save a DataFrame as CSV and Parquet side by side, each atomically."""
    base = Path(path_without_suffix)
    csv, parquet = base.with_suffix(".csv"), base.with_suffix(".parquet")
    atomic_write_text(csv, df.to_csv(index=False))
    fd, tmp = _temporary(base.parent, f".{base.name}.", ".parquet.tmp")
    os.close(fd)
    try:
        df.to_parquet(tmp, index=False)
        os.replace(tmp, parquet)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return [csv, parquet]


COMMIT_ENV = "VCBENCH_COMMIT"  # for a copy of the tree whose .git is absent or stale (a device)


def git_commit(cwd: str | os.PathLike | None = None) -> str | None:
    """The commit of the source tree vcbench runs from (with '+dirty' if modified), or None.
    $VCBENCH_COMMIT, when set, is taken as given: a copied tree's git may not be its own."""
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    cwd = cwd or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "")


def library_versions(names: Iterable[str] = _LIBRARIES) -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def device_description() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"platform": platform.platform(), "cpu": platform.processor() or platform.machine(),
                            "cpu_count": os.cpu_count(), "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        idx = torch.cuda.current_device()
        info["gpu"] = torch.cuda.get_device_name(idx)
        major, minor = torch.cuda.get_device_capability(idx)
        info["capability"] = f"sm_{major}{minor}"
        info["cuda_version"] = torch.version.cuda
    return info


def vcbench_version() -> str:
    try:
        return metadata.version("vcbench")
    except metadata.PackageNotFoundError:
        from vcbench.version import __version__

        return __version__


def default_run_dir(command: str, root: str | os.PathLike = "results") -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{command}-{stamp}"


@dataclass
class RunFolder:
    """A results folder and its manifest; `finish()` (or the context manager) writes it."""

    path: Path
    command: str
    config: dict[str, Any]
    items: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    # Top-level manifest fields a command adds (generate: what each torchrun rank made).
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def create(cls, path: str | os.PathLike, command: str, config: dict[str, Any]) -> RunFolder:
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise UserError(f"output path {path} exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path=path, command=command, config=config)
        run.write_manifest(status="running")
        return run

    def record(self, item: str, status: str, **details: Any) -> None:
        """Per-item status: 'ok', 'error', 'skipped'... with free-form details."""
        self.items = [i for i in self.items if i["item"] != item]
        self.items.append({"item": item, "status": status, **details})

    def table(self, name: str, df: pd.DataFrame) -> list[Path]:
        return write_table(df, self.path / name)

    def json(self, name: str, obj: Any) -> Path:
        out = self.path / name
        write_json(out, obj)
        return out

    def manifest(self, status: str) -> dict[str, Any]:
        now = time.time()
        return {
            "command": self.command,
            "status": status,
            "config": self.config,
            "vcbench_version": vcbench_version(),
            "git_commit": git_commit(),
            "libraries": library_versions(),
            "device": device_description(),
            "times": {
                "started": _dt.datetime.fromtimestamp(self.started, _dt.timezone.utc).isoformat(),
                "updated": _dt.datetime.fromtimestamp(now, _dt.timezone.utc).isoformat(),
                "elapsed_s": round(now - self.started, 3),
            },
            "items": self.items,
            **self.extra,
            **_plugins(),
        }

    def write_manifest(self, status: str) -> None:
        write_json(self.path / MANIFEST, self.manifest(status))

    def finish(self, status: str = "ok") -> None:
        self.write_manifest(status)

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finish("ok")
        else:
            self.finish("interrupted" if issubclass(exc_type, KeyboardInterrupt) else "failed")


def _plugins() -> dict[str, Any]:
    """The plugins this process loaded (module or file, version or sha256, what each
    registered), for every manifest: a run made with a plugin says so."""
    from vcbench.registry import loaded_plugins

    loaded = loaded_plugins()
    return {"plugins": loaded} if loaded else {}


WRITER_LOCK = ".writer.lock"


@contextmanager
def sole_writer(folder: str | os.PathLike, command: str) -> Iterator[None]:
    """Hold `folder` for this process alone while the block runs; a second writer gets a
    UserError naming the holder.

    The lock is an flock on FOLDER/.writer.lock, which the kernel releases when its process
    dies, however it dies: a lock left by a killed run is free, and its file still names the
    dead holder, so taking it over is said on stderr. The file is emptied on release, never
    deleted (a process could hold the deleted file's lock while another locks a new one).
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UserError(f"output path {folder} exists and is not a directory")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / WRITER_LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _lock_holder(fd)
        os.close(fd)
        raise UserError(f"run folder {folder} is being written by {holder}; wait for it to end "
                        "or choose another output folder") from None
    try:
        stale = _lock_holder(fd, wait=False)
        if stale:
            print(f"note: {folder}: taking over the writer lock of {stale}, which is no longer "
                  "running", file=sys.stderr)
        me = {"command": command, "pid": os.getpid(), "host": socket.gethostname(),
              "since": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(me) + "\n").encode(), 0)
        os.fsync(fd)
        yield
    finally:
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def remove_unused_folder(folder: str | os.PathLike) -> None:
    """Remove `folder` if it holds nothing but the writer lock: what a run that stopped
    before writing anything (a refused request) would otherwise leave behind."""
    folder = Path(folder)
    if folder.is_dir() and {p.name for p in folder.iterdir()} <= {WRITER_LOCK}:
        (folder / WRITER_LOCK).unlink(missing_ok=True)
        folder.rmdir()


def _lock_holder(fd: int, wait: bool = True) -> str | None:
    """Who the lock file names, in words; None when it names no one. A holder that has just
    taken the lock may not have written itself yet: `wait` gives it a second."""
    for _ in range(20 if wait else 1):
        raw = os.pread(fd, 4096, 0)
        try:
            h = json.loads(raw)
            return f"{h['command']} (pid {h['pid']} on {h['host']}, since {h['since']})"
        except (ValueError, KeyError, TypeError):
            if wait:
                time.sleep(0.05)
    return "another process (it has not said who)" if wait else None


def read_manifest(run_dir: str | os.PathLike) -> dict[str, Any]:
    path = Path(run_dir) / MANIFEST
    if not path.is_file():
        raise UserError(f"{run_dir} is not a run folder (no {MANIFEST})")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
