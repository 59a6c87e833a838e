"""What the end-to-end tests of `vcbench generate` share: the CLI in a subprocess of this tree,
a small clip size, and a prompts file."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--steps", "2", "--frames", "5", "--height", "128", "--width", "128"]


def run_vcbench(*args, **kw):
    return subprocess.run([sys.executable, "-m", "vcbench", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, **kw)


def prompts_file(tmp_path, prompts: dict[str, str]) -> Path:
    """A JSONL prompts file of {id: text}."""
    import json

    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": i, "prompt": t}) + "\n" for i, t in prompts.items()))
    return path
