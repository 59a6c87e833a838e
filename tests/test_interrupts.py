"""SIGINT and SIGTERM: one line, exit 130 / 143, the run marked interrupted, a rerun resumes
bit for bit and says what it kept; a second signal stops the process at once."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_runs import ROOT, SMALL, prompts_file, run_vcbench

from vcbench.pipelines.video_io import frames_sha256


def _args(tmp_path, out):
    prompts = prompts_file(tmp_path, {"fox": "a fox in snow", "sea": "waves", "owl": "an owl"})
    return ["generate", "--model", "tiny-wan-random", "--methods", "bf16", "--prompts", prompts,
            "--seeds", "0", *SMALL, "--out", out]


def _clips(run: Path) -> dict[str, str]:
    """Each clip's frames as hashed on disk now (not as its row says)."""
    rows = json.loads((run / "manifest.json").read_text())["items"]
    assert all(r["status"] == "ok" for r in rows)
    return {r["item"]: frames_sha256(run / r["frames_dir"]) for r in rows}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("full")
    done = run_vcbench(*_args(tmp, tmp / "run"))
    assert done.returncode == 0, done.stderr
    return _clips(tmp / "run")


def _interrupt_mid_clip(args, run: Path, signals):
    """Start generate, wait until its second clip has started, send `signals` back to back."""
    proc = subprocess.Popen([sys.executable, "-m", "vcbench", *map(str, args)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    second = run / "clips/bf16/sea/s0/row.json"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not second.exists():
        time.sleep(0.02)
    assert proc.poll() is None, proc.stderr.read()
    for s in signals:
        proc.send_signal(s)
    _, err = proc.communicate(timeout=300)
    return proc.returncode, err


@pytest.mark.parametrize("signals, status", [
    ([signal.SIGINT], 130),
    ([signal.SIGTERM], 143),
    ([signal.SIGINT, signal.SIGINT], 130),  # the second may stop the unwinding at once
])
def test_a_signal_mid_clip_is_one_line_and_a_rerun_resumes_bit_for_bit(tmp_path, uninterrupted,
                                                                      signals, status):
    run = tmp_path / "run"
    args = _args(tmp_path, run)
    code, err = _interrupt_mid_clip(args, run, signals)
    assert code == status, err
    assert "Traceback" not in err
    said = [line for line in err.splitlines() if "interrupted" in line]
    if len(signals) == 1:
        assert len(said) == 1, err
        name = signal.Signals(signals[0]).name
        assert said[0].startswith(f"interrupted ({name}); ")
        assert said[0].endswith(f"resume with: vcbench {' '.join(map(str, args))}")
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["status"] == "interrupted"
        rows = {r["item"]: r["status"] for r in manifest["items"]}
        kept = sum(s == "ok" for s in rows.values())
        assert rows["bf16/fox/s0"] == "ok" and "partial" in rows.values()
        assert f"{kept} of 3 clips finished" in said[0]
    else:  # however far the unwinding got, what is on disk is whole: the rerun takes it
        assert 1 <= len(said) <= 2, err
        kept = None

    resumed = run_vcbench(*args)
    assert resumed.returncode == 0, resumed.stderr
    if kept is not None:
        assert f"resuming: kept {kept} of 3 clips" in resumed.stderr
    assert json.loads((run / "manifest.json").read_text())["status"] == "ok"
    assert _clips(run) == uninterrupted
    assert not list(run.rglob(".*.tmp*")), "a temporary was left behind"


def test_a_second_signal_exits_at_once(tmp_path):
    """While the first interrupt unwinds (here: a cleanup that would sleep a minute), the
    second stops the process with that signal's status, skipping the rest."""
    script = (
        "import os, signal, time\n"
        "from vcbench import interrupts\n"
        "interrupts.install()\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(60)\n"
        "except KeyboardInterrupt as e:\n"
        "    print('unwinding', e.signum, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(60)\n"
        "    print('not reached', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=50)
    assert done.returncode == 130
    assert done.stdout == f"unwinding {int(signal.SIGTERM)}\n"
    assert done.stderr == "interrupted again (SIGINT): stopped at once\n"


def test_the_cli_in_process_gives_the_callers_handlers_back():
    from vcbench.cli import main

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with pytest.raises(SystemExit):
        main(["--version"])
    assert {s: signal.getsignal(s) for s in before} == before
