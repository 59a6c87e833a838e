"""`vcbench score` end to end: clips and run folders in, table and JSON/CSV out, errors as one line.

LPIPS here runs on a seeded random backbone placed in a temporary vcbench cache, so these tests
need no network; test_metrics_lpips.py holds the LPIPS numbers to an independent forward pass.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from score_fixtures import perturb, seed_lpips_cache, smooth_clip, write_frames, write_run

from vcbench.cli import main


@pytest.fixture(autouse=True)
def lpips_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VCBENCH_CACHE_DIR", str(tmp_path / "cache"))
    seed_lpips_cache(tmp_path / "cache")


def run_cli(args, capsys):
    """(exit code, stdout, stderr) of `vcbench ARGS` run in-process."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def pooled_psnr(a, b):
    return 10 * math.log10(255**2 / np.mean((a.astype(float) - b.astype(float)) ** 2))


def test_two_frame_directories(tmp_path, capsys):
    ref = smooth_clip(0, frames=3)
    cand = perturb(ref, 1, 5.0)
    write_frames(tmp_path / "ref", ref)
    write_frames(tmp_path / "cand", cand)
    code, out, err = run_cli(["score", tmp_path / "ref", tmp_path / "cand", "--json", tmp_path / "s.json",
                              "--csv", tmp_path / "s.csv"], capsys)
    assert code == 0, err
    assert "scores per clip" in out and "psnr" in out and "lpips" in out
    result = json.loads((tmp_path / "s.json").read_text())
    (row,) = result["rows"]
    assert row["frames"] == 3 and row["error"] is None and row["lossy"] is None
    assert math.isclose(row["psnr"], pooled_psnr(ref, cand), rel_tol=1e-12)
    assert 0 < row["ssim"] < 1 and row["lpips"] > 0
    assert result["mean"] == {"psnr": row["psnr"], "ssim": row["ssim"], "lpips": row["lpips"]}
    table = pd.read_csv(tmp_path / "s.csv")
    assert list(table["kind"]) == ["clip", "mean", "ci95_low", "ci95_high"]


def test_one_run_folder_scores_each_method_against_its_bf16(tmp_path, capsys):
    clips, expected = {}, {}
    for p in ("p000", "p001", "p002"):
        ref = smooth_clip(int(p[-1]), frames=2)
        clips[("bf16", p, 0)] = ref
        for method, sigma in (("sage2", 3.0), ("vc-8bit", 1.0)):
            clips[(method, p, 0)] = perturb(ref, hash((method, p)) % 1000, sigma)
            expected[(method, p)] = pooled_psnr(ref, clips[(method, p, 0)])
    run = write_run(tmp_path / "run", clips)
    code, out, err = run_cli(["score", run, "--metrics", "psnr,ssim", "--json", tmp_path / "s.json"], capsys)
    assert code == 0, err
    result = json.loads((tmp_path / "s.json").read_text())
    assert {(r["method"], r["prompt_id"]) for r in result["rows"]} == set(expected)
    for r in result["rows"]:
        assert math.isclose(r["psnr"], expected[(r["method"], r["prompt_id"])], rel_tol=1e-12)
    assert set(result["mean"]) == {"sage2", "vc-8bit"}  # keyed by method when there are several
    values = [expected[("sage2", p)] for p in ("p000", "p001", "p002")]
    assert math.isclose(result["mean"]["sage2"]["psnr"], np.mean(values), rel_tol=1e-12)
    half = 4.302652729911275 * np.std(values, ddof=1) / math.sqrt(3)  # t(0.975, 2 dof), from tables
    low, high = result["ci95"]["sage2"]["psnr"]
    assert math.isclose(low, np.mean(values) - half, rel_tol=1e-9)
    assert math.isclose(high, np.mean(values) + half, rel_tol=1e-9)
    assert result["mean"]["vc-8bit"]["psnr"] > result["mean"]["sage2"]["psnr"]


def test_a_broken_clip_in_a_run_folder_is_an_error_row_and_the_rest_scores(tmp_path, capsys):
    ref0, ref1, ref2 = (smooth_clip(s, frames=2) for s in range(3))
    clips = {("bf16", "p0", 0): ref0, ("bf16", "p1", 0): ref1, ("bf16", "p2", 0): ref2,
             ("sage2", "p0", 0): perturb(ref0, 9, 4.0),
             ("sage2", "p1", 0): smooth_clip(1, frames=3)}  # one frame too many
    run = write_run(tmp_path / "run", clips, failed=(("sage2", "p2", 0),))
    code, out, err = run_cli(["score", run, "--metrics", "psnr", "--json", tmp_path / "s.json"], capsys)
    assert code == 0, err
    rows = {r["prompt_id"]: r for r in json.loads((tmp_path / "s.json").read_text())["rows"]}
    assert rows["p0"]["error"] is None and math.isfinite(rows["p0"]["psnr"])
    assert "frame counts differ" in rows["p1"]["error"] and rows["p1"]["psnr"] == "nan"
    assert "candidate not generated (status: error)" in rows["p2"]["error"]
    summary = json.loads((tmp_path / "s.json").read_text())["summary"]
    assert summary[0]["n"] == 1 and summary[0]["n_errors"] == 2
    assert "not scored" in err


def test_two_run_folders_pair_by_method_where_both_hold_it(tmp_path, capsys):
    ref = smooth_clip(0, frames=2)
    cand = perturb(ref, 3, 4.0)
    first = write_run(tmp_path / "first", {("bf16", "p0", 0): ref}, video=True)
    second = write_run(tmp_path / "second", {("bf16", "p0", 0): ref, ("sage2", "p0", 0): cand}, video=True)
    code, out, err = run_cli(["score", first, second, "--metrics", "psnr", "--json", tmp_path / "s.json"], capsys)
    assert code == 0, err
    rows = {r["method"]: r for r in json.loads((tmp_path / "s.json").read_text())["rows"]}
    assert rows["bf16"]["psnr"] == "inf"  # a deterministic rerun: identical, reported as inf
    assert math.isclose(rows["sage2"]["psnr"], pooled_psnr(ref, cand), rel_tol=1e-12)


@pytest.mark.parametrize("pair_by", ["reference", "method"])
def test_across_runs_every_method_is_scored_against_the_reference_runs_bf16(tmp_path, capsys, pair_by):
    """REF holds bf16 and a different sage2 clip of the same prompt and seed: CAND's sage2 is
    scored against REF's bf16 clip, or with --pair-by method against REF's sage2 clip, where
    a method REF lacks has no partner."""
    bf16 = smooth_clip(0, frames=2)
    ref_sage2 = perturb(bf16, 5, 20.0)
    cand_sage2, cand_vc = perturb(ref_sage2, 6, 3.0), perturb(bf16, 7, 2.0)
    ref = write_run(tmp_path / "ref", {("bf16", "p0", 0): bf16, ("sage2", "p0", 0): ref_sage2})
    cand = write_run(tmp_path / "cand", {("sage2", "p0", 0): cand_sage2, ("vc-8bit", "p0", 0): cand_vc})
    code, out, err = run_cli(["score", ref, cand, "--metrics", "psnr", "--pair-by", pair_by,
                              "--json", tmp_path / "s.json"], capsys)
    assert code == 0, err
    rows = {r["method"]: r for r in json.loads((tmp_path / "s.json").read_text())["rows"]}
    if pair_by == "reference":
        assert math.isclose(rows["sage2"]["psnr"], pooled_psnr(bf16, cand_sage2), rel_tol=1e-12)
        assert math.isclose(rows["vc-8bit"]["psnr"], pooled_psnr(bf16, cand_vc), rel_tol=1e-12)
        assert (cand / "score.json").read_text() == (tmp_path / "s.json").read_text()
    else:
        assert math.isclose(rows["sage2"]["psnr"], pooled_psnr(ref_sage2, cand_sage2), rel_tol=1e-12)
        assert rows["vc-8bit"]["error"] == "no reference clip for this prompt and seed"
        assert not (cand / "score.json").exists()


def test_across_runs_a_reference_run_without_bf16_is_one_line(tmp_path, capsys):
    clip = smooth_clip(0, frames=2)
    ref = write_run(tmp_path / "ref", {("sage2", "p0", 0): clip})
    cand = write_run(tmp_path / "cand", {("vc-8bit", "p0", 0): clip})
    code, out, err = run_cli(["score", ref, cand, "--metrics", "psnr"], capsys)
    assert code == 2 and err.startswith("error: REF holds no bf16 clips") and "--pair-by method" in err


def test_nonfinite_candidate_frames_are_reported_not_averaged(tmp_path, capsys):
    ref = smooth_clip(0, frames=3)
    cand = perturb(ref, 1, 3.0).astype(np.float32)
    cand[2, 5, 5, 1] = np.inf
    write_frames(tmp_path / "ref", ref)
    np.save(tmp_path / "cand.npy", cand)
    code, out, err = run_cli(["score", tmp_path / "ref", tmp_path / "cand.npy", "--metrics", "psnr,ssim",
                              "--json", tmp_path / "s.json"], capsys)
    assert code == 0, err
    result = json.loads((tmp_path / "s.json").read_text())
    assert result["rows"][0]["nonfinite_frames"] == [2]
    assert result["rows"][0]["psnr"] == "nan" and result["mean"]["psnr"] == "nan"
    assert result["summary"][0]["n_nonfinite"] == 1 and result["summary"][0]["n"] == 0
    assert "non-finite candidate frames [2]" in err


def test_lossy_input_is_flagged(tmp_path, capsys):
    from PIL import Image

    ref = smooth_clip(0, frames=2)
    write_frames(tmp_path / "ref", ref)
    (tmp_path / "cand").mkdir()
    for i, frame in enumerate(ref):
        Image.fromarray(frame).save(tmp_path / "cand" / f"{i:06d}.jpg", quality=90)
    code, out, err = run_cli(["score", tmp_path / "ref", tmp_path / "cand", "--metrics", "psnr",
                              "--json", tmp_path / "s.json"], capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "s.json").read_text())["rows"][0]["lossy"] == "cand: frames stored as .jpg"
    assert "lossy input" in err


@pytest.mark.parametrize("cand_clip, message", [
    (smooth_clip(0, frames=4), "frame counts differ"),
    (smooth_clip(0, frames=3, width=60), "resolutions differ"),
    (smooth_clip(0, frames=3)[..., :1], "channel counts differ"),
])
def test_mismatched_clips_are_one_line_errors(tmp_path, capsys, cand_clip, message):
    write_frames(tmp_path / "ref", smooth_clip(0, frames=3))
    write_frames(tmp_path / "cand", cand_clip)
    code, out, err = run_cli(["score", tmp_path / "ref", tmp_path / "cand", "--json", tmp_path / "s.json"], capsys)
    assert code == 2
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "s.json").exists()


@pytest.mark.parametrize("args, message", [
    (["{ref}", "{missing}"], "does not exist"),
    (["{ref}"], "must be a run folder"),
    (["{ref}", "{run}"], "cannot compare run folder"),
    (["{ref}", "{ref}", "--metrics", "psnr,fid"], "unknown metric 'fid'"),
    (["{ref}", "{ref}", "--device", "cuda"], "no CUDA device"),
])
def test_usage_mistakes_are_one_line_errors(tmp_path, capsys, args, message):
    import torch

    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    paths = {"ref": write_frames(tmp_path / "ref", smooth_clip(0, frames=2)), "missing": tmp_path / "nope",
             "run": write_run(tmp_path / "run", {("bf16", "p0", 0): smooth_clip(0, frames=2)})}
    code, out, err = run_cli(["score", *(a.format(**paths) for a in args)], capsys)
    assert code == 2 and err.startswith("error: ") and message in err and err.count("\n") == 1


def metric_plugin_and_clips(tmp_path, registration: str):
    """A plugin file registering a metric (`registration`, after vcbench and MetricEntry are
    imported), and a reference and a candidate clip under tmp_path/ref and tmp_path/cand."""
    plugin = tmp_path / "metric_plugin.py"
    plugin.write_text("import vcbench\nfrom vcbench.metrics import MetricEntry\n" + registration)
    ref = smooth_clip(0, frames=3)
    write_frames(tmp_path / "ref", ref)
    write_frames(tmp_path / "cand", perturb(ref, 1, 5.0))
    return plugin


def test_a_metric_whose_package_is_missing_is_one_line_before_any_clip(tmp_path):
    """A metric's `requires` is checked when the metric is asked for, in a real subprocess with
    the metric from a real plugin file: exit 2, one line naming the package, nothing written.
    `python -m vcbench.metrics` (what the Makefile asks before generating) says the same."""
    import os
    import subprocess
    import sys

    from cli_runs import ROOT, run_vcbench

    plugin = metric_plugin_and_clips(
        tmp_path, "vcbench.register(MetricEntry('needs-absent', lambda s: lambda ref, cand: 0.0,\n"
                  "    True, requires=('vcbench_no_such_package',)))\n")
    line = ("error: metric needs-absent needs the Python package 'vcbench_no_such_package', "
            "which this environment lacks (pip install vcbench_no_such_package)")
    done = run_vcbench("--plugin", plugin, "score", tmp_path / "ref", tmp_path / "cand",
                       "--metrics", "psnr,needs-absent", "--json", tmp_path / "s.json")
    assert (done.returncode, done.stderr.strip()) == (2, line)
    assert not (tmp_path / "s.json").exists()

    env = {**os.environ, "VCBENCH_PLUGINS": str(plugin)}
    check = [sys.executable, "-m", "vcbench.metrics"]
    done = subprocess.run([*check, "psnr,needs-absent"], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    assert (done.returncode, done.stderr.strip()) == (2, line)
    done = subprocess.run([*check, "psnr,ssim"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (0, "")


def test_a_package_missing_anywhere_is_one_line_not_a_traceback(tmp_path):
    """A plugin's metric that imports a package this environment lacks, without declaring it:
    the import fails deep inside `score`, and the CLI still says so in one line, exit 2
    (--debug shows the traceback)."""
    from cli_runs import run_vcbench

    plugin = metric_plugin_and_clips(
        tmp_path, "def build(settings):\n"
                  "    import vcbench_no_such_package.sub  # noqa: F401\n"
                  "vcbench.register(MetricEntry('undeclared', build, True))\n")
    args = ["--plugin", plugin, "score", tmp_path / "ref", tmp_path / "cand", "--metrics",
            "undeclared"]
    done = run_vcbench(*args)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "error: this needs the Python package 'vcbench_no_such_package', which this environment "
        "lacks (pip install vcbench_no_such_package; --debug shows where it was imported)")
    debug = run_vcbench("--debug", *args)
    assert debug.returncode != 0 and "Traceback" in debug.stderr
