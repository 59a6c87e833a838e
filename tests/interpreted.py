"""Re-running a test file under Triton's CPU interpreter, in a process of its own:
TRITON_INTERPRET must be set before Triton compiles anything, and other tests may import it
first. A file's driver test calls `rerun_interpreted(__file__, timeout)`; the file's checks
run only where `INTERPRETED` is true."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def rerun_interpreted(path: str, timeout: float) -> None:
    """Run `path`'s tests under the interpreter; every one must pass, none skip."""
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert " passed" in last and "skipped" not in last and "failed" not in last, last
