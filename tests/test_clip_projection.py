"""`vcbench project-clip`: the projection arithmetic, the config builders, the run folder into
the report, and the refusal on a machine without CUDA."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
import torch

from vcbench.report import build_report
from vcbench.timing import clip_arithmetic as arith
from vcbench.timing import clip_parts
from vcbench.timing import clip_projection as cp


def _parts(rows):
    return pd.DataFrame(rows)


ALL = {"all": "cudnn-sdpa"}
VC = {"regroup": "vcbench-triton", "reuse": "vcbench-triton", "plain": "vcbench-triton"}


def test_step_kinds_follow_the_papers_grouping_schedule():
    # 40 steps, first 25% group (steps 0-9), regroup on every 4th of them: 0, 4, 8.
    kinds = arith.step_kinds("vc-8bit", 40)
    assert kinds == {"regroup": [0, 4, 8], "reuse": [1, 2, 3, 5, 6, 7, 9],
                     "plain": list(range(10, 40))}
    assert list(arith.step_kinds("vc-8bit-vsmooth", 40)) == ["regroup", "reuse", "plain"]
    assert arith.step_kinds("bf16", 40) == {"all": list(range(40))}
    assert arith.step_kinds("fp8-fa4", 8) == {"all": list(range(8))}


def test_projection_golden_values():
    # By hand: text 2 x 0.05 = 0.1 s; VAE 30 s.
    # bf16: 40 steps x 2 calls x 11.0 s = 880.0 s; clip 910.1 s.
    # vc-8bit: 2 x (3 x 12.5 + 7 x 11.5 + 30 x 10.0) = 2 x 418.0 = 836.0 s; clip 866.1 s.
    kinds = arith.step_kinds("vc-8bit", 40)
    rows = [arith.part_row("text_encode", "-", "all", [0.05, 0.04, 0.06], calls=2),
            *arith.transformer_rows("bf16", ALL, {"all": list(range(40))},
                                 {"all": [11.0]}, cfg_passes=2),
            *arith.transformer_rows("vc-8bit", VC, kinds,
                                 {"regroup": [12.5], "reuse": [11.0, 11.5, 12.0],
                                  "plain": [10.0, 10.0]}, cfg_passes=2),
            arith.part_row("vae_decode", "-", "untiled", [30.0], calls=1)]
    parts = _parts(rows)
    vc = parts[parts.method == "vc-8bit"].set_index("kind")
    assert list(vc.calls_in_clip) == [6, 14, 60]
    assert vc.loc["reuse", "call_s"] == 11.5 and vc.loc["reuse", "samples"] == 3
    assert vc.loc["reuse", "total_s"] == pytest.approx(161.0)

    table = arith.projection_table(parts).set_index("method")
    assert table.loc["bf16", "text_encode_s"] == pytest.approx(0.1)
    assert table.loc["bf16", "denoise_s"] == pytest.approx(880.0)
    assert table.loc["bf16", "clip_s"] == pytest.approx(910.1)
    assert table.loc["vc-8bit", "denoise_s"] == pytest.approx(836.0)
    assert table.loc["vc-8bit", "clip_s"] == pytest.approx(866.1)
    assert table.loc["vc-8bit", "transformer_calls"] == 80
    assert table.loc["vc-8bit", "clip_speedup_vs_bf16"] == pytest.approx(910.1 / 866.1)
    assert table.loc["vc-8bit", "denoise_speedup_vs_bf16"] == pytest.approx(880.0 / 836.0)
    assert table.loc["bf16", "clip_speedup_vs_bf16"] == 1.0
    assert arith.projection_table(parts, speedups=False).clip_speedup_vs_bf16.isna().all()
    assert dict(table.implementation) == {"bf16": "cudnn-sdpa", "vc-8bit": "vcbench-triton"}


def test_a_method_whose_steps_ran_on_two_backends_names_both():
    # A V-Smooth method's plain steps are another plan; where one backend takes the grouping
    # steps and another the plain ones, the projection says so instead of naming the first.
    kinds = arith.step_kinds("vc-8bit-fp8qk", 40)
    mixed = {"regroup": "vcbench-sm90", "reuse": "vcbench-sm90", "plain": "vcbench-triton"}
    rows = arith.transformer_rows("vc-8bit-fp8qk", mixed, kinds,
                               {"regroup": [9.0], "reuse": [8.6], "plain": [11.0]}, 2)
    assert [r["implementation"] for r in rows] == ["vcbench-sm90", "vcbench-sm90", "vcbench-triton"]
    table = arith.projection_table(_parts(rows), speedups=False)
    assert table.implementation.tolist() == ["vcbench-sm90 + vcbench-triton"]
    # off the GPU every kind is the backend asked for
    assert clip_parts.kind_implementations("vc-8bit", kinds, "emulate") == dict.fromkeys(kinds, "emulate")


def test_compiled_speedups_are_over_the_compiled_bf16():
    # Shared: text 0.1 s, VAE 30 s. Eager: bf16 880 s, vc-8bit 836 s (as above).
    # Compiled: bf16 40 x 2 x 8.0 = 640 s (clip 670.1), vc-8bit 2 x (3 x 9 + 7 x 8 + 30 x 7)
    # = 586 s (clip 616.1); compile seconds on the first kind only.
    kinds = arith.step_kinds("vc-8bit", 40)
    shared = [arith.part_row("text_encode", "-", "all", [0.05], calls=2),
              arith.part_row("vae_decode", "-", "untiled", [30.0], calls=1)]
    eager = [*arith.transformer_rows("bf16", ALL, {"all": list(range(40))}, {"all": [11.0]}, 2),
             *arith.transformer_rows("vc-8bit", VC, kinds,
                                  {"regroup": [12.5], "reuse": [11.5], "plain": [10.0]}, 2)]
    compiled = [*arith.transformer_rows("bf16", ALL, {"all": list(range(40))}, {"all": [8.0]}, 2,
                                     compile_s={"all": 95.0}),
                *arith.transformer_rows("vc-8bit", VC, kinds,
                                     {"regroup": [9.0], "reuse": [8.0], "plain": [7.0]}, 2,
                                     compile_s={"regroup": 120.0, "reuse": 0.0, "plain": 0.0})]
    parts = _parts([shared[0], *({"compiled": False, **r} for r in eager), *compiled, shared[1]])
    full, plain = arith.projection_table(parts), arith.projection_table(_parts(shared + eager))
    # the eager figures are the uncompiled projection's, untouched by the compiled rows
    pd.testing.assert_frame_equal(full[plain.columns], plain)
    table = full.set_index("method")
    assert table.loc["vc-8bit", "compiled_denoise_s"] == pytest.approx(586.0)
    assert table.loc["vc-8bit", "compiled_clip_s"] == pytest.approx(616.1)
    assert table.loc["bf16", "compiled_clip_s"] == pytest.approx(670.1)
    assert table.loc["vc-8bit", "compiled_clip_speedup_vs_bf16"] == pytest.approx(670.1 / 616.1)
    assert table.loc["vc-8bit", "compiled_denoise_speedup_vs_bf16"] == pytest.approx(640.0 / 586.0)
    assert table.loc["bf16", "compiled_clip_speedup_vs_bf16"] == 1.0
    assert dict(table.compile_s) == {"bf16": 95.0, "vc-8bit": 120.0}  # in none of the seconds
    assert table.loc["vc-8bit", "clip_speedup_vs_bf16"] == pytest.approx(910.1 / 866.1)
    off = arith.projection_table(parts, speedups=False)
    assert off.compiled_clip_speedup_vs_bf16.isna().all() and off.compiled_clip_s.notna().all()
    # a method whose compiled timing failed keeps its eager row; no compiled bf16, no speedup
    no_bf16 = arith.projection_table(parts[~((parts.method == "bf16") & parts.compiled.eq(True))])
    assert no_bf16.compiled_clip_speedup_vs_bf16.isna().all()
    assert no_bf16.set_index("method").compiled_clip_s.isna().tolist() == [True, False]


def test_the_papers_clip_and_the_published_configs():
    spec = clip_parts.WAN22_720P
    assert spec.latent_shape() == (1, 16, 21, 90, 160)  # 81 frames of 1280x720 through 4x/8x
    assert spec.video_tokens() == 75600  # over patch (1, 2, 2)
    assert (spec.steps, spec.cfg_passes, spec.text_calls, spec.text_tokens) == (40, 2, 2, 512)
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    with torch.device("meta"):  # sizes only: nothing is allocated
        expert = WanTransformer3DModel(**clip_parts.WAN22_A14B_TRANSFORMER)
        text = UMT5EncoderModel(UMT5Config(**clip_parts.UMT5_XXL))
        vae = AutoencoderKLWan(**clip_parts.WAN21_VAE)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(expert) == 14_288_491_584  # "A14B": 14.3B per expert
    assert count(text) == 5_680_910_336  # UMT5-XXL encoder (about 11 GB in bf16)
    assert count(vae) == 126_892_531  # the Wan2.1 VAE
    assert expert.config.num_layers == 40 and expert.blocks[0].attn1.heads == 40


def test_builders_at_tiny_scale_keep_diffusers_fp32_modules():
    spec = clip_parts.tiny_spec()
    model = clip_parts.build_transformer(spec.transformer, torch.device("cpu"), torch.bfloat16)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert dtypes["blocks.0.attn1.to_q.weight"] == torch.bfloat16
    assert dtypes["blocks.0.ffn.net.2.weight"] == torch.bfloat16
    assert dtypes["blocks.0.scale_shift_table"] == torch.float32  # _keep_in_fp32_modules
    assert dtypes["condition_embedder.time_embedder.linear_1.weight"] == torch.float32
    assert model.rope.freqs_cos.dtype == torch.float32  # buffers as built, not cast to bf16
    assert not any(p.requires_grad for p in model.parameters())
    with clip_parts.first_blocks(model, 1):
        assert len(model.blocks) == 1
    assert len(model.blocks) == 2
    # The bf16 / fp32 mixture runs (as from_pretrained's does), every block through the patch.
    rows = clip_parts.time_transformer_method(model, spec, "bf16", 1, "emulate",
                                              torch.device("cpu"), torch.bfloat16)
    assert [(r["kind"], r["calls_in_clip"]) for r in rows] == [("all", 16)]


def test_compiled_timing_leaves_the_transformer_as_it_was():
    spec, cpu = clip_parts.tiny_spec(), torch.device("cpu")
    model = clip_parts.build_transformer(spec.transformer, cpu, torch.float32)
    g = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(spec.latent_shape(), generator=g),
                  timestep=torch.tensor([500.0]), return_dict=False,
                  encoder_hidden_states=torch.randn(1, spec.text_tokens, 32, generator=g))
    processors = [m.processor for m in model.modules() if hasattr(m, "processor")]
    with torch.no_grad():
        reference = model(**inputs)[0]
        # One graph per function allowed: unless uncompiling resets Dynamo, the second method
        # reaches the limit (which would run it eager, unsaid; here an error).
        with torch._dynamo.config.patch(recompile_limit=1):
            rows = [r for m in ("sage2-8bit", "bf16") for r in clip_parts.time_transformer_method(
                model, spec, m, 1, "emulate", cpu, torch.float32, compile=True)]
        after = model(**inputs)[0]
        recompiled = torch.compile(model)(**inputs)[0]  # no patched graph reused
    torch._dynamo.reset()
    assert [(r["method"], r["compiled"]) for r in rows] == [("sage2-8bit", True), ("bf16", True)]
    assert all(r["compile_s"] > 0 for r in rows)
    assert torch.equal(after, reference)
    assert all(not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    assert [m.processor for m in model.modules() if hasattr(m, "processor")] == processors
    torch.testing.assert_close(recompiled, reference, atol=1e-4, rtol=1e-4)


def test_a_failing_method_leaves_the_others_written(tmp_path, monkeypatch):
    real = cp.time_transformer_method

    def flaky(model, spec, method, *args, **kwargs):
        if method == "vc-8bit":
            raise RuntimeError("kernel broke")
        return real(model, spec, method, *args, **kwargs)

    monkeypatch.setattr(cp, "time_transformer_method", flaky)
    req = cp.Request(methods=["vc-8bit"], device="cpu", backend="emulate", text_repeats=1)
    with pytest.raises(RuntimeError, match="vc-8bit failed"):
        cp.project_clip(req, tmp_path / "p", clip_parts.tiny_spec())
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["status"] == "failed"
    items = {i["item"]: i for i in manifest["items"]}
    assert items["bf16"]["status"] == "ok" and "kernel broke" in items["vc-8bit"]["error"]
    assert list(pd.read_csv(tmp_path / "p" / "projection.csv").method) == ["bf16"]


def test_tiny_run_folder_into_the_report(tmp_path):
    req = cp.Request(methods=["vc-8bit"], device="cpu", backend="emulate", text_repeats=1)
    table, label = cp.project_clip(req, tmp_path / "proj", clip_parts.tiny_spec())
    assert list(table.method) == ["bf16", "vc-8bit"]  # bf16 added as the baseline
    assert label.startswith("projected from random-weight tiny transformer on cpu")
    assert "emulated" in label and table.clip_speedup_vs_bf16.isna().all()
    manifest = json.loads((tmp_path / "proj" / "manifest.json").read_text())
    assert manifest["command"] == "project-clip" and manifest["status"] == "ok"
    assert manifest["config"]["random_weights"] and manifest["config"]["label"] == label
    parts = pd.read_csv(tmp_path / "proj" / "parts.csv")
    # tiny: 8 steps -> regroup on step 0, reuse on 1, plain on 2-7; two CFG calls each
    vc = parts[parts.method == "vc-8bit"].set_index("kind")
    assert dict(vc.calls_in_clip) == {"regroup": 2, "reuse": 2, "plain": 12}
    assert set(parts.part) == {"text_encode", "transformer", "vae_decode"}
    # the patch handed Wan's RoPE to the methods; the emulation rotates q and k first
    assert set(parts[parts.part == "transformer"].rope) == {"eager"}
    assert list(table.rope) == ["eager", "eager"] and "RoPE inside each transformer call" in label
    clip = table.set_index("method").clip_s
    assert np.isfinite(clip).all() and (clip > 0).all()
    # without compile nothing of it shows
    assert "compile" not in manifest["config"]
    assert not {"compiled", "compile_s"} & (set(parts.columns) | set(table.columns))

    report = build_report([tmp_path / "proj"], tmp_path / "out")
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Clip wall clock, projected (Figure 6, bottom)" in md
    assert "Projected, not measured" in md and label in md
    assert (tmp_path / "out" / "clip_time_projected.csv").is_file()
    assert not (tmp_path / "out" / "speedup.png").exists()  # emulated: no speedup drawn
    assert "projected" in report.main_title


def test_tiny_compiled_run_times_compiled_beside_eager(tmp_path):
    req = cp.Request(methods=["vc-8bit"], device="cpu", backend="emulate", text_repeats=1,
                     compile=True)
    lines: list[str] = []
    table, label = cp.project_clip(req, tmp_path / "proj", clip_parts.tiny_spec(), say=lines.append)
    manifest = json.loads((tmp_path / "proj" / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["config"]["compile"] is True
    assert {i["item"]: i["status"] for i in manifest["items"]} == {
        "bf16": "ok", "bf16 compiled": "ok", "vc-8bit": "ok", "vc-8bit compiled": "ok"}
    parts = pd.read_csv(tmp_path / "proj" / "parts.csv")
    transformer = parts[parts.part == "transformer"]
    assert transformer.compiled.tolist() == [False, True] + [False] * 3 + [True] * 3
    is_compiled = transformer.compiled.eq(True)  # object dtype: the shared parts' cells are blank
    for _, rows in transformer[is_compiled].groupby("method"):
        first, *rest = rows.itertuples()
        # the first kind's warm-up compiled the one graph; the other kinds reused it
        assert first.compile_s > 0 and all(r.compile_s == 0 for r in rest)
        # compilation is out of the timed calls: none of them took a compile's time
        assert rows.sample_max_s.max() < first.compile_s
    t = table.set_index("method")
    compiled = transformer[is_compiled].groupby("method")
    assert dict(t.compile_s) == pytest.approx(dict(compiled.compile_s.sum()))
    assert dict(t.compiled_denoise_s) == pytest.approx(dict(compiled.total_s.sum()))
    eager = transformer[~is_compiled].groupby("method")
    assert dict(t.denoise_s) == pytest.approx(dict(eager.total_s.sum()))
    assert (t.compiled_clip_s - t.compiled_denoise_s).tolist() == pytest.approx(
        (t.clip_s - t.denoise_s).tolist())  # text and VAE: the same shared parts
    assert table.compiled_clip_speedup_vs_bf16.isna().all()  # emulated: no speedup
    assert any("vc-8bit regroup compiled (" in line for line in lines)

    build_report([tmp_path / "proj"], tmp_path / "out")
    projected = pd.read_csv(tmp_path / "out" / "clip_time_projected.csv").set_index("method")
    assert projected.compiled_clip_s.tolist() == pytest.approx(t.compiled_clip_s.tolist())


def _gpu_like_runs(root):
    """A timeit run and a project-clip run as the device writes them (numbers made up)."""
    from vcbench.runs import RunFolder

    speed = pd.DataFrame({"method": ["bf16", "vc-8bit"], "implementation": ["cudnn-sdpa"] * 2,
                          "attention_ms": [200.0, 125.0]})
    speed["speedup_vs_bf16"] = 200.0 / speed.attention_ms
    with RunFolder.create(root / "timeit", "timeit", {"shape": "wan22-720p"}) as run:
        run.table("timeit", speed)
    rows = [arith.part_row("text_encode", "-", "all", [0.05], 2),
            *arith.transformer_rows("bf16", ALL, {"all": list(range(40))}, {"all": [11.0]}, 2),
            *arith.transformer_rows("vc-8bit", VC, arith.step_kinds("vc-8bit", 40),
                                 {"regroup": [12.5], "reuse": [11.5], "plain": [10.0]}, 2),
            arith.part_row("vae_decode", "-", "untiled", [30.0], 1)]
    parts = pd.DataFrame(rows)
    label = "projected from random-weight full-size transformer on NVIDIA H200 (test)"
    with RunFolder.create(root / "proj", "project-clip",
                          {"model": "wan22-t2v-a14b", "label": label, "random_weights": True,
                           "backend": "gpu"}) as run:
        run.table("parts", parts)
        run.table("projection", arith.projection_table(parts))
    return root / "timeit", root / "proj", label


def test_figure6_draws_the_projected_panel_beside_the_attention_speedup(tmp_path):
    from PIL import Image

    timeit, proj, label = _gpu_like_runs(tmp_path)
    build_report([timeit, proj], tmp_path / "out")
    projected = pd.read_csv(tmp_path / "out" / "clip_time_projected.csv").set_index("method")
    assert projected.loc["vc-8bit", "clip_speedup_vs_bf16"] == pytest.approx(910.1 / 866.1)
    assert projected.loc["vc-8bit", "label"] == label
    image = np.asarray(Image.open(tmp_path / "out" / "speedup.png").convert("RGB"))
    assert image.shape[1] > 2 * image.shape[0]  # two panels side by side
    assert len(np.unique(image.reshape(-1, 3), axis=0)) > 50
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Figure 6, top" in md and "Figure 6, bottom" in md and "](speedup.png)" in md
    assert not math.isnan(projected.loc["bf16", "clip_s"])


@pytest.mark.parametrize("extra", [[], ["--compile"]])
def test_cli_on_a_cpu_machine_says_it_needs_cuda(tmp_path, extra):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = subprocess.run([sys.executable, "-m", "vcbench", "project-clip", *extra, "--out",
                        str(tmp_path / "p")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: project-clip needs a CUDA GPU, and this machine has none"
    assert not (tmp_path / "p").exists()  # refused before any run folder was made
