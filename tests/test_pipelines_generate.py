"""`vcbench generate` end to end on tiny-wan: run folder, resume after a kill, sharding, errors."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cli_runs import ROOT, SMALL, prompts_file, run_vcbench

from vcbench.pipelines.video_io import read_frames


def _prompts(tmp_path):
    return prompts_file(tmp_path, {"fox": "a fox in snow", "sea": "waves"})


_vcbench = run_vcbench


def _files(run: Path) -> dict[str, bytes]:
    # Lossless frames and rows, minus wall time (the one field that may differ).
    out = {}
    for p in sorted((run / "clips").rglob("*")):
        if p.suffix == ".png":
            out[str(p.relative_to(run))] = p.read_bytes()
        elif p.name == "row.json":
            row = json.loads(p.read_text())
            row.pop("wall_s")
            out[str(p.relative_to(run))] = json.dumps(row, sort_keys=True).encode()
    return out


def test_generate_writes_run_folder_and_resumes_after_kill(tmp_path):
    prompts = _prompts(tmp_path)
    common = ["generate", "--model", "tiny-wan-random", "--methods", "bf16,vc-8bit", "--prompts", prompts,
              "--seeds", "0", *SMALL]
    full = tmp_path / "full"
    done = _vcbench(*common, "--out", full)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((full / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["config"]["random_weights"] is True
    rows = manifest["items"]
    assert [r["item"] for r in rows] == ["bf16/fox/s0", "bf16/sea/s0", "vc-8bit/fox/s0", "vc-8bit/sea/s0"]
    for r in rows:
        assert r["status"] == "ok" and r["random_weights"] is True and r["steps"] == 2
        assert r["implementation"] == "emulate"  # what computed its attention, on record
        frames = read_frames(full / r["frames_dir"])
        assert frames.shape == (5, 128, 128, 3) and frames.dtype == np.uint8
        assert (full / r["mp4"]).stat().st_size > 0
    assert rows[2]["grouping_actions"] == {"0": "regroup", "1": "plain"}

    # Kill a second run once its first clip is finished, then resume it.
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "vcbench", *map(str, common), "--out", killed],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = killed / "clips/bf16/fox/s0/row.json"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if first.exists() and json.loads(first.read_text()).get("status") == "ok":
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    first_png = killed / "clips/bf16/fox/s0/frames/000000.png"
    mtime = first_png.stat().st_mtime_ns
    resumed = _vcbench(*common, "--out", killed)
    assert resumed.returncode == 0, resumed.stderr
    assert first_png.stat().st_mtime_ns == mtime  # the finished clip was not redone
    # Same files as the uninterrupted run: BF16 (and every method) is bit-identical run to run.
    assert _files(killed) == _files(full)
    assert json.loads((killed / "manifest.json").read_text())["status"] == "ok"


def test_resume_redoes_a_clip_whose_frames_changed(tmp_path):
    out = tmp_path / "run"
    args = ["generate", "--methods", "bf16", "--prompts", _prompts(tmp_path), "--seeds", "0",
            *SMALL, "--out", out]
    assert _vcbench(*args).returncode == 0
    png = out / "clips/bf16/sea/s0/frames/000002.png"
    good = png.read_bytes()
    png.write_bytes(b"corrupt")
    assert _vcbench(*args).returncode == 0
    assert png.read_bytes() == good


def _generate_in_process(*args):
    from vcbench.cli import main

    try:
        main(["generate", *map(str, args)])
    except SystemExit as e:
        assert e.code in (0, None), e.code


def _identity(run: Path) -> dict[str, tuple]:
    """Per clip: (inode, mtime) of its row and first frame; a redone clip gets new files."""
    out = {}
    for row in (run / "clips").glob("*/*/*/row.json"):
        frame = row.parent / "frames" / "000000.png"
        out[row.parent.relative_to(run / "clips").as_posix()] = tuple(
            (f.stat().st_ino, f.stat().st_mtime_ns) for f in (row, frame))
    return out


def test_a_changed_request_redoes_exactly_the_changed_clips(tmp_path):
    """Reruns into one folder, each changing one part of the request: the clips it changes
    are made again (and their rows say so), every other clip is skipped untouched, and the
    manifest lists the clips of the request as it now stands."""
    prompts = _prompts(tmp_path)
    out = tmp_path / "run"
    base = ["--model", "tiny-wan-random", "--methods", "bf16,fp8-fa4", "--prompts", prompts,
            "--seeds", "0", *SMALL, "--out", out]
    all4 = ["bf16/fox/s0", "bf16/sea/s0", "fp8-fa4/fox/s0", "fp8-fa4/sea/s0"]

    def rerun(*args, made):
        before = _identity(out)
        _generate_in_process(*args)
        manifest = json.loads((out / "manifest.json").read_text())
        (rank,) = manifest["ranks"]
        assert sorted(rank["made"]) == sorted(made)
        after = _identity(out)
        for key in before:
            assert (after[key] == before[key]) == (key not in made), key
        assert manifest["status"] == "ok"
        return {r["item"]: r for r in manifest["items"]}

    rows = rerun(*base, made=all4)
    rows = rerun(*base, made=[])  # the same request: nothing to do
    rows = rerun(*base, "--option", "fp8-fa4.hadamard_qk=true", made=["fp8-fa4/fox/s0", "fp8-fa4/sea/s0"])
    assert rows["fp8-fa4/sea/s0"]["options"] == {"hadamard_qk": True}
    assert rows["bf16/sea/s0"]["options"] == {}
    opts = ["--option", "fp8-fa4.hadamard_qk=true"]
    steps3 = [a if a != "2" else "3" for a in base]  # --steps 2 -> 3
    rows = rerun(*steps3, *opts, made=all4)
    assert {r["steps"] for r in rows.values()} == {3}
    (tmp_path / "prompts.jsonl").write_text('{"id": "fox", "prompt": "a fox in snow"}\n'
                                            '{"id": "sea", "prompt": "waves at night"}\n')
    rows = rerun(*steps3, *opts, made=["bf16/sea/s0", "fp8-fa4/sea/s0"])
    assert rows["bf16/sea/s0"]["prompt"] == "waves at night"
    seeds = [a if a != "0" else "0,1" for a in steps3]
    rows = rerun(*seeds, *opts, made=[i.replace("s0", "s1") for i in all4])
    assert sorted(rows) == sorted(all4 + [i.replace("s0", "s1") for i in all4])
    only1 = [a if a != "0,1" else "1" for a in seeds]
    rows = rerun(*only1, *opts, made=[])
    assert sorted(rows) == sorted(i.replace("s0", "s1") for i in all4)  # s0 is not asked for


@pytest.mark.parametrize("args, message", [
    (["--methods", "bf16,int3"], "unknown method 'int3'"),
    (["--prompts", "/nonexistent.txt"], "does not exist"),
    (["--option", "vc-8bit.no_such=1", "--methods", "vc-8bit"], "no option 'no_such'"),
    (["--seeds", "a,b"], "--seeds expects"),
    (["--model", "wan22-t2v-a14b"], "--model-path"),
    (["--frames", "6"], "4k+1"),
    (["--schedule-fraction", "0"], "grouping schedule"),
])
def test_bad_input_is_one_error_line(tmp_path, capsys, args, message):
    from vcbench.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--out", str(tmp_path / "r"), *SMALL, *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.strip().startswith("error: ") and message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_torchrun_shards_items_over_two_gloo_processes(tmp_path):
    out = tmp_path / "dist"
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    r = subprocess.run([str(torchrun), "--nproc_per_node=2", "-m", "vcbench", "generate",
                        "--methods", "bf16,fp8-fa4", "--prompts", str(_prompts(tmp_path)),
                        "--seeds", "0", *SMALL, "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["world_size"] == 2 and manifest["status"] == "ok"
    planned = ["bf16/fox/s0", "bf16/sea/s0", "fp8-fa4/fox/s0", "fp8-fa4/sea/s0"]
    assert sorted(i["item"] for i in manifest["items"]) == planned
    assert all(i["status"] == "ok" for i in manifest["items"])
    # Each process recorded what it made: rank r the items r, r + 2, ... of the plan, the two
    # sets disjoint, together every item exactly once, nothing skipped in a fresh folder.
    ranks = {r["rank"]: r for r in manifest["ranks"]}
    assert sorted(ranks) == [0, 1] and all(r["world_size"] == 2 for r in ranks.values())
    assert ranks[0]["made"] == planned[0::2] and ranks[1]["made"] == planned[1::2]
    assert not set(ranks[0]["made"]) & set(ranks[1]["made"])
    assert sorted(ranks[0]["made"] + ranks[1]["made"]) == planned
    assert ranks[0]["skipped"] == ranks[1]["skipped"] == []


def test_generate_without_pyav_makes_clips_without_previews(tmp_path):
    # Some GPU images lack PyAV: the clip (its PNG frames, what is scored) is still made, the
    # row says it has no preview, one warning line says why, and a rerun finds it finished.
    hide_av = ("import runpy, sys; sys.modules['av'] = None; sys.argv[0] = 'vcbench'; "
               "runpy.run_module('vcbench', run_name='__main__')")
    out = tmp_path / "run"
    args = ["generate", "--model", "tiny-wan-random", "--methods", "bf16", "--prompts",
            _prompts(tmp_path), "--seeds", "0", *SMALL, "--out", out]
    run = lambda: subprocess.run([sys.executable, "-c", hide_av, *map(str, args)], cwd=ROOT,  # noqa: E731
                                 capture_output=True, text=True)
    done = run()
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stderr.splitlines() if "PyAV" in line] == [
        "warning: PyAV (av) is not installed: clips get no preview.mp4 (scoring reads the PNG frames)"]
    rows = json.loads((out / "manifest.json").read_text())["items"]
    assert [r["status"] for r in rows] == ["ok", "ok"] and all(r["mp4"] is None for r in rows)
    assert not list(out.rglob("*.mp4"))
    assert read_frames(out / rows[0]["frames_dir"]).shape == (5, 128, 128, 3)
    again = run()
    assert again.returncode == 0, again.stderr
    rank0 = json.loads((out / "ranks/rank0.json").read_text())
    assert sorted(rank0["skipped"]) == ["bf16/fox/s0", "bf16/sea/s0"]
