"""What every command shares: --version, help on every option, one spelling per concept, and
files written with the user's umask."""

import os
import stat
import subprocess
import sys

import pytest
import typer
from cli_runs import ROOT, run_vcbench

from vcbench import __version__
from vcbench.cli import app


def _commands(command, path=("vcbench",)):
    """(path, click command) for the app and every command and subcommand under it."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_every_option_of_every_command_has_help():
    root = typer.main.get_command(app)
    seen, missing = 0, []
    for path, command in _commands(root):
        for param in command.params:
            if param.param_type_name != "option" or param.hidden:
                continue
            seen += 1
            if not (param.help or "").strip():
                missing.append(f"{' '.join(path)} {param.opts[0]}")
    assert seen > 50  # the walk reached the commands' options, not only the root's
    assert missing == []


def test_capture_and_generate_spell_prompts_and_seeds_alike():
    root = typer.main.get_command(app)
    options = {name: {o for p in root.commands[name].params for o in p.opts}
               for name in ("generate", "capture")}
    for flag in ("--prompts", "--seeds"):
        assert flag in options["generate"] and flag in options["capture"]
    assert not {"--prompt", "--seed"} & options["capture"]


def test_version_names_the_package_and_the_commit():
    r = run_vcbench("--version")
    assert r.returncode == 0, r.stderr
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True)
    line = r.stdout.strip()
    assert line.startswith(f"vcbench {__version__}")
    if commit.returncode == 0:  # a git checkout: its commit is named
        assert f"(git {commit.stdout.strip()}" in line


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_run_files_follow_the_umask(tmp_path, mask, mode):
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "vcbench", "analyze", "expcast", "--out", str(out),
                    "--json", str(tmp_path / "e.json")], cwd=ROOT, check=True,
                   capture_output=True, preexec_fn=lambda: os.umask(mask))
    files = [out / "manifest.json", out / "expcast.csv", out / "expcast.parquet",
             tmp_path / "e.json"]
    assert {f.name: stat.S_IMODE(f.stat().st_mode) for f in files} == \
        {f.name: mode for f in files}
