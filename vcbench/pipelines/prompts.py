"""Prompt files: plain text (one prompt a line) or JSONL with `id` and `prompt`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from vcbench.errors import UserError

DEMO_PROMPTS = "demo_prompts.txt"


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


def demo_prompts_path() -> Path:
    return Path(str(resources.files("vcbench.pipelines") / "data" / DEMO_PROMPTS))


def read_prompts(path: str | Path) -> list[Prompt]:
    path = Path(path)
    if not path.is_file():
        raise UserError(f"prompts file {path} does not exist")
    lines = [(n, line.strip()) for n, line in enumerate(path.read_text().splitlines(), 1)]
    lines = [(n, line) for n, line in lines if line and not line.startswith("#")]
    if not lines:
        raise UserError(f"prompts file {path} has no prompts")
    jsonl = path.suffix == ".jsonl" or lines[0][1].startswith("{")
    prompts = [_json_prompt(path, n, line) if jsonl else Prompt(f"p{i:03d}", line)
               for i, (n, line) in enumerate(lines)]
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise UserError(f"prompts file {path}: id {dup!r} appears twice")
    return prompts


def _json_prompt(path: Path, lineno: int, line: str) -> Prompt:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
    if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
        raise UserError(f"{path}:{lineno}: each JSONL line needs a string 'prompt'")
    pid = str(row.get("id", f"p{lineno - 1:03d}"))
    if not pid or "/" in pid or pid.startswith("."):
        raise UserError(f"{path}:{lineno}: id {pid!r} cannot name a folder")
    return Prompt(pid, row["prompt"])
