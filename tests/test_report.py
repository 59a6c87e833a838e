"""vcbench report: run folders built on disk as generate/score/analyze write them, then the
report's tables, refusals and figures checked against numbers computed here independently."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from score_fixtures import perturb, smooth_clip, write_frames

from vcbench.cli import main
from vcbench.errors import UserError
from vcbench.report import build_report
from vcbench.report.tables import mean_ci
from vcbench.scoring import ScoreOptions, score, write_outputs

# Student-t 0.975 quantiles from a printed table (not scipy), for the independent check.
T975 = {1: 12.706204736174705, 3: 3.182446305284263, 4: 2.7764451051977987}
PROMPTS = [{"id": "p000", "text": "a fox"}, {"id": "p001", "text": "a wave"}]
SEEDS = [0, 1]
# Noise per method: a larger sigma must give a lower PSNR row.
SIGMA = {"fp8-fa4": 6.0, "vc-8bit": 2.0}


def make_generate_run(root: Path, methods=("bf16", "fp8-fa4", "vc-8bit"), model="tiny-wan",
                      steps=8, schedule=None, sigma=None, with_score=True) -> Path:
    """A generate run folder (manifest config + items, PNG frames), scored by the real scorer."""
    sigma = sigma or SIGMA
    items = []
    for method in methods:
        for p_i, prompt in enumerate(PROMPTS):
            for seed in SEEDS:
                clip = smooth_clip(10 * p_i + seed, frames=4, height=32, width=32)
                if method != "bf16":
                    clip = perturb(clip, 100 * p_i + seed, sigma[method] * (1 + 0.3 * seed))
                item = f"{method}/{prompt['id']}/s{seed}"
                write_frames(root / "clips" / item / "frames", clip)
                items.append({"item": item, "method": method, "prompt_id": prompt["id"],
                              "prompt": prompt["text"], "seed": seed, "status": "ok",
                              "wall_s": 1.0 + len(method) * 0.1 + 0.05 * seed,
                              "frames_dir": f"clips/{item}/frames"})
    config = {"model": model, "model_path": None, "random_weights": True, "methods": list(methods),
              "method_options": {m: {} for m in methods}, "schedule": schedule or {},
              "prompts": PROMPTS, "seeds": SEEDS, "steps": steps, "frames": 4, "height": 32,
              "width": 32, "backend": "emulate", "device": "cpu"}
    manifest = {"command": "generate", "status": "ok", "config": config, "vcbench_version": "0.1.0",
                "git_commit": "abc", "libraries": {"torch": "x"}, "device": {"cpu": "x86_64"},
                "items": items}
    (root / "manifest.json").write_text(json.dumps(manifest))
    if with_score and "bf16" in methods:
        write_outputs(score(root, None, ScoreOptions(["psnr", "ssim"])), root / "score.json", None)
    return root


def psnr_by_hand(ref: np.ndarray, cand: np.ndarray) -> float:
    mse = np.mean((ref.astype(np.float64) - cand.astype(np.float64)) ** 2)
    return 10 * math.log10(255.0**2 / mse)


def read_png(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


def test_mean_ci_against_independent_formula():
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    mean, half, n = mean_ci(values)
    assert n == 5 and mean == pytest.approx(4.0)
    assert half == pytest.approx(T975[4] * statistics.stdev(values) / math.sqrt(5), rel=1e-12)
    # Non-finite values are left out and counted out; one value has no interval.
    assert mean_ci([3.0, float("nan"), None])[2] == 1
    inf = mean_ci([30.0, float("inf")])  # identical clips: PSNR inf shows, not dropped
    assert inf[0] == float("inf") and inf[2] == 2 and math.isnan(inf[1])
    assert math.isnan(mean_ci([3.0])[1])
    assert mean_ci([])[2] == 0 and math.isnan(mean_ci([])[0])


def test_report_rows_and_cis_of_two_runs(tmp_path):
    from vcbench.analysis.commands import analyze_expcast_command

    gen = make_generate_run(tmp_path / "gen")
    analyze_expcast_command(-0.35, out=tmp_path / "expcast")
    report = build_report([gen, tmp_path / "expcast"], tmp_path / "out")

    fid = pd.read_csv(tmp_path / "out" / "fidelity.csv")
    psnr = fid[fid.metric == "psnr"].set_index("method")
    for method in ("fp8-fa4", "vc-8bit"):
        by_hand = []
        for p_i in range(len(PROMPTS)):
            for seed in SEEDS:
                ref = smooth_clip(10 * p_i + seed, frames=4, height=32, width=32)
                cand = perturb(ref, 100 * p_i + seed, SIGMA[method] * (1 + 0.3 * seed))
                by_hand.append(psnr_by_hand(ref, cand))
        row = psnr.loc[method]
        assert row.n == 4
        assert row["mean"] == pytest.approx(np.mean(by_hand), abs=1e-6)
        assert row.ci95_half == pytest.approx(T975[3] * statistics.stdev(by_hand) / 2, rel=1e-6)
    assert psnr.loc["vc-8bit", "mean"] > psnr.loc["fp8-fa4", "mean"]

    md = (tmp_path / "out" / "report.md").read_text()
    # One row per method, bf16 as the reference, the best low-bit PSNR in bold.
    assert "| bf16 | 4 | reference | reference |" in md
    cell = re.search(r"\| vc-8bit \| 4 \| \*\*([\d.]+) ± ([\d.]+)\*\* \|", md)
    assert cell, md
    assert float(cell[1]) == pytest.approx(psnr.loc["vc-8bit", "mean"], abs=0.051)
    assert float(cell[2]) == pytest.approx(psnr.loc["vc-8bit", "ci95_half"], abs=0.051)
    # Bold because the intervals, computed here by hand above, are clear of each other.
    low = psnr.loc["vc-8bit", "mean"] - psnr.loc["vc-8bit", "ci95_half"]
    assert low > psnr.loc["fp8-fa4", "mean"] + psnr.loc["fp8-fa4", "ci95_half"]
    assert "<u>" not in md
    assert "## ExpCast-FP8 vs exp-then-cast (Figure 5)" in md
    assert list(report.main.method) == ["bf16", "fp8-fa4", "vc-8bit"]
    clip = pd.read_csv(tmp_path / "out" / "clip_time.csv").set_index("method")
    assert clip.loc["bf16", "wall_s"] == pytest.approx(np.mean([1.4, 1.4, 1.45, 1.45]))
    # A CPU emulation's wall clock is not sold as speed: no speedup, no speedup figure.
    assert "emulated in PyTorch" in md and clip.speedup_vs_bf16.isna().all()
    assert not (tmp_path / "out" / "speedup.png").exists()


def long_table(rows: dict[str, tuple[float, float]], metric: str) -> pd.DataFrame:
    """A fidelity long table of one model: method -> (mean, CI half width), 4 clips each."""
    return pd.DataFrame([{"model": "m", "method": k, "variant": "", "metric": metric, "mean": m,
                          "ci95_half": h, "n": 4} for k, (m, h) in rows.items()])


def test_best_is_bold_only_where_its_interval_is_clear_of_every_other():
    from vcbench.report.tables import best, fidelity_wide, no_best_note

    ref = {"bf16": (math.nan, math.nan)}
    # Clear of the runner-up (30 - 1 > 27 + 1) and of the third.
    clear = long_table({**ref, "fp8-fa4": (27.0, 1.0), "vc-8bit": (30.0, 1.0),
                        "vc-4bit": (20.0, 5.0)}, "psnr")
    assert best(clear, "psnr") == (("vc-8bit", ""), "")
    assert fidelity_wide(clear, "m").set_index("method").loc["vc-8bit", "psnr"] == "**30.0 ± 1.0**"
    assert no_best_note(clear, "m") == ""
    # Runner-up clear, but the third's wide interval reaches the best's: no winner.
    third = long_table({**ref, "fp8-fa4": (27.0, 1.0), "vc-8bit": (30.0, 1.0),
                        "vc-4bit": (20.0, 9.5)}, "psnr")
    assert best(third, "psnr")[0] is None
    # LPIPS: lower is better, so the smallest mean is the candidate.
    lpips = long_table({**ref, "fp8-fa4": (0.20, 0.01), "vc-8bit": (0.05, 0.01)}, "lpips")
    assert best(lpips, "lpips")[0] == ("vc-8bit", "")
    touching = long_table({**ref, "fp8-fa4": (0.20, 0.08), "vc-8bit": (0.05, 0.08)}, "lpips")
    table = fidelity_wide(touching, "m")
    assert not table.lpips.str.contains(r"\*\*").any()
    assert no_best_note(touching, "m") == \
        "No bold in lpips: the 95% intervals of vc-8bit and fp8-fa4 overlap."
    one = long_table({**ref, "vc-8bit": (30.0, 1.0)}, "psnr")
    assert best(one, "psnr")[0] is None and "fewer than two" in no_best_note(one, "m")
    single_clip = long_table({**ref, "fp8-fa4": (27.0, math.nan), "vc-8bit": (30.0, 1.0)}, "psnr")
    assert "fp8-fa4 has no interval" in no_best_note(single_clip, "m")


def make_timeit_run(root: Path) -> Path:
    """A timeit run folder as `vcbench timeit` writes it (its RunFolder and table)."""
    from vcbench.runs import RunFolder

    table = pd.DataFrame({"method": ["bf16", "sage2-8bit", "vc-8bit"],
                          "implementation": ["cudnn-sdpa", "vcbench-triton", "vcbench-triton"],
                          "attention_ms": [200.0, 180.0, 125.0]})
    table["speedup_vs_bf16"] = 200.0 / table.attention_ms
    with RunFolder.create(root, "timeit", {"methods": list(table.method), "shape": "wan22-720p"}) as run:
        run.table("timeit", table)
    return root


def test_figures_are_real_images(tmp_path):
    from vcbench.analysis.commands import analyze_expcast_command

    gen = make_generate_run(tmp_path / "gen")
    analyze_expcast_command(-0.35, out=tmp_path / "expcast")
    timeit = make_timeit_run(tmp_path / "timeit")
    build_report([gen, tmp_path / "expcast", timeit], tmp_path / "out")
    speed = pd.read_csv(tmp_path / "out" / "speedup.csv").set_index("method")
    assert speed.loc["vc-8bit", "speedup_vs_bf16"] == pytest.approx(1.6)
    for name in ("psnr_per_model.png", "speedup.png", "frame_strip_tiny-wan.png", "fig5_expcast.png"):
        image = read_png(tmp_path / "out" / name)
        assert image.shape[0] > 150 and image.shape[1] > 300, name
        # Not blank: many distinct colours, and plenty of non-white pixels.
        assert len(np.unique(image.reshape(-1, 3), axis=0)) > 50, name
        assert (image < 200).any(axis=-1).mean() > 0.02, name
    md = (tmp_path / "out" / "report.md").read_text()
    for name in ("psnr_per_model.png", "speedup.png", "frame_strip_tiny-wan.png", "fig5_expcast.png"):
        assert f"]({name})" in md


def test_different_models_are_shown_side_by_side(tmp_path):
    a = make_generate_run(tmp_path / "a", model="tiny-wan")
    b = make_generate_run(tmp_path / "b", model="other-model", methods=("bf16", "vc-8bit"))
    build_report([a, b], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "### tiny-wan" in md and "### other-model" in md
    assert "runs differ in model / inputs: other-model, tiny-wan" in md
    fid = pd.read_csv(tmp_path / "out" / "fidelity.csv")
    assert set(fid[fid.method == "vc-8bit"].model) == {"tiny-wan", "other-model"}


def test_same_model_with_different_steps_is_refused(tmp_path, capsys):
    a = make_generate_run(tmp_path / "a", steps=8)
    b = make_generate_run(tmp_path / "b", steps=12)
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(a), str(b), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "differ in steps (8 vs 12)" in err
    assert not (tmp_path / "out" / "report.md").exists()


def test_same_method_twice_is_refused_unless_the_schedule_differs(tmp_path):
    a = make_generate_run(tmp_path / "a")
    b = make_generate_run(tmp_path / "b")
    with pytest.raises(UserError, match="scored in both"):
        build_report([a, b], tmp_path / "out")
    # The schedule ablation: vc-8bit scored against another run's bf16, once per placement.
    ref = make_generate_run(tmp_path / "ref", methods=("bf16",), with_score=False)
    uniform = make_generate_run(tmp_path / "u", methods=("vc-8bit",),
                                schedule={"schedule_placement": "uniform"}, with_score=False)
    write_outputs(score(ref, uniform, ScoreOptions(["psnr"])), uniform / "score.json", None)
    build_report([a, uniform], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| vc-8bit [schedule_placement=uniform] | 4 |" in md
    assert "| vc-8bit | 4 |" in md


def test_score_against_a_non_bf16_reference_is_refused(tmp_path):
    a = make_generate_run(tmp_path / "a")  # holds vc-8bit: --pair-by method pairs it with b's
    b = make_generate_run(tmp_path / "b", methods=("vc-8bit",), model="m2", with_score=False)
    write_outputs(score(a, b, ScoreOptions(["psnr"], pair_by="method")), b / "score.json", None)
    with pytest.raises(UserError, match="against .* vc-8bit clips, not bf16"):
        build_report([b], tmp_path / "out")


def test_score_file_of_another_run_is_refused(tmp_path):
    a = make_generate_run(tmp_path / "a")
    b = make_generate_run(tmp_path / "b", methods=("bf16", "vc-8bit"), model="m2")
    (b / "score.json").write_text((a / "score.json").read_text())  # scores fp8-fa4 clips
    with pytest.raises(UserError, match="did not generate"):
        build_report([b], tmp_path / "out")


def test_not_a_run_folder(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(tmp_path / "empty")])
    assert exit_.value.code == 2
    assert "is not a run folder" in capsys.readouterr().err


def test_speedup_bars_mark_the_nvfp4_fidelity_kernel():
    """Its times are NVFP4 computed on FP16 tensor cores: no bar shows one unlabelled."""
    from vcbench.kernels.backends import NVFP4_IMPLEMENTATION
    from vcbench.report.figures import _with_fidelity_label

    rows = pd.DataFrame({"method": ["bf16", "sage3-4bit", "vc-8bit"],
                         "implementation": ["flash-attn-4", NVFP4_IMPLEMENTATION, "vcbench-sm90"]})
    assert _with_fidelity_label(rows) == ["bf16", "sage3-4bit\n(nvfp4 on fp16 mma)", "vc-8bit"]
    assert _with_fidelity_label(rows.drop(columns="implementation")) == list(rows.method)


def test_axis_labels_say_which_way_is_better():
    from vcbench.metrics import METRICS
    from vcbench.report.figures import axis_label

    assert axis_label("psnr") == "PSNR (dB, higher is better)"
    assert axis_label("lpips") == "LPIPS (lower is better)"
    for name, entry in METRICS.items():
        assert axis_label(name).endswith(
            "higher is better)" if entry.higher_is_better else "lower is better)")


def test_a_fusion_run_renders_figure_7_labelled_with_its_card(tmp_path):
    from vcbench.analysis.fusion import RUNGS, with_factors
    from vcbench.runs import RunFolder

    ms = [40.0, 25.0, 16.0, math.nan, 10.0]
    table = with_factors(pd.DataFrame({"rung": [r for r, _ in RUNGS], "stage": [s for _, s in RUNGS],
                                       "ms": ms, "note": ["", "", "", "not built", ""]}))
    # factors by hand: each timed rung over the one before it (the untimed rung skipped)
    assert table.step_factor.tolist()[1:3] == [1.6, 25.0 / 16.0] and math.isnan(table.step_factor[3])
    assert table.step_factor[4] == 1.6 and table.cumulative_factor[4] == 4.0
    root = tmp_path / "fig7"
    config = {"method": "vc-8bit-vsmooth", "shape": [1, 40, 75600, 128], "device": "NVIDIA H200"}
    with RunFolder.create(root, "analyze fusion", config) as run:
        run.table("fusion", table)
    build_report([root], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Figure 7" in md and "on NVIDIA H200" in md and "](fig7_fusion.png)" in md
    image = read_png(tmp_path / "out" / "fig7_fusion.png")
    assert image.shape[0] > 150 and (image < 200).any(axis=-1).mean() > 0.02
    assert pd.read_csv(tmp_path / "out" / "fusion.csv").ms.tolist()[:3] == ms[:3]


def _cli(*args) -> int:
    try:
        main([str(a) for a in args])
    except SystemExit as e:
        return e.code
    return 0


def _psnr_by_hand(method: str, sigma: float) -> list[float]:
    """PSNR of each clip make_generate_run made for `method` against the bf16 clip of its
    prompt and seed."""
    out = []
    for p_i in range(len(PROMPTS)):
        for seed in SEEDS:
            ref = smooth_clip(10 * p_i + seed, frames=4, height=32, width=32)
            out.append(psnr_by_hand(ref, perturb(ref, 100 * p_i + seed, sigma * (1 + 0.3 * seed))))
    return out


def test_score_run_then_report_run_shows_the_fidelity_table(tmp_path, capsys):
    gen = make_generate_run(tmp_path / "gen", with_score=False)
    assert _cli("report", gen, "--out", tmp_path / "before") == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [f"warning: {gen} has no score.json: the report leaves its clips "
                        f"unscored; score them first with: vcbench score {gen}"]

    assert _cli("score", gen, "--metrics", "psnr") == 0  # no --json: into the run folder
    assert f"scores in {gen / 'score.json'}" in capsys.readouterr().out.replace("\n", "")
    assert _cli("report", gen, "--out", tmp_path / "out") == 0
    assert "warning" not in capsys.readouterr().err
    psnr = pd.read_csv(tmp_path / "out" / "fidelity.csv").query("metric == 'psnr'").set_index("method")
    for method, sigma in SIGMA.items():
        assert psnr.loc[method, "mean"] == pytest.approx(np.mean(_psnr_by_hand(method, sigma)), abs=1e-6)
    assert "| vc-8bit | 4 |" in (tmp_path / "out" / "report.md").read_text()


def test_report_prints_each_variant_under_its_own_name(tmp_path, capsys):
    """The console table names a variant as report.md does: "[schedule_placement=uniform]"
    must not be read as rich markup and dropped, which printed two rows under one name."""
    gen = make_generate_run(tmp_path / "gen")
    ref = make_generate_run(tmp_path / "ref", methods=("bf16",), with_score=False)
    uniform = make_generate_run(tmp_path / "u", methods=("vc-8bit",),
                                schedule={"schedule_placement": "uniform"}, with_score=False)
    write_outputs(score(ref, uniform, ScoreOptions(["psnr", "ssim"])), uniform / "score.json", None)
    capsys.readouterr()
    assert _cli("report", gen, ref, uniform, "--out", tmp_path / "out") == 0
    out, err = capsys.readouterr()
    names = [line.split("│")[1].strip() for line in out.splitlines() if line.count("│") > 2]
    assert names == ["bf16", "fp8-fa4", "vc-8bit", "vc-8bit [schedule_placement=uniform]"]
    # the bf16-only reference run has nothing to score: no warning that it is unscored
    assert "warning" not in err


def test_score_across_runs_pairs_with_the_reference_runs_bf16_and_report_takes_it(tmp_path, capsys):
    a = make_generate_run(tmp_path / "a")  # bf16, and a vc-8bit of its own (sigma 2)
    b = make_generate_run(tmp_path / "b", methods=("vc-8bit",), sigma={"vc-8bit": 5.0},
                          with_score=False)
    assert _cli("score", a, b, "--metrics", "psnr") == 0
    assert (b / "score.json").is_file() and json.loads((a / "score.json").read_text())["cand"] is None
    assert _cli("report", b, "--out", tmp_path / "out") == 0
    psnr = pd.read_csv(tmp_path / "out" / "fidelity.csv").query("metric == 'psnr'").set_index("method")
    # against a's bf16 clips, not a's vc-8bit ones
    assert psnr.loc["vc-8bit", "mean"] == pytest.approx(np.mean(_psnr_by_hand("vc-8bit", 5.0)), abs=1e-6)
    assert psnr.loc["vc-8bit", "n"] == 4

    # method to method is a rerun check: written where asked, not into the run folder
    (b / "score.json").unlink()
    assert _cli("score", a, b, "--metrics", "psnr", "--pair-by", "method",
                "--json", tmp_path / "rerun.json") == 0
    assert not (b / "score.json").exists()
    rows = json.loads((tmp_path / "rerun.json").read_text())["rows"]
    assert all("/a/clips/vc-8bit/" in r["ref"] for r in rows)
