"""`--model diffusers --model-path DIR`: four diffusers video pipelines other than Wan, built
whole on tiny random configs (tests/tiny_video_pipelines.py), saved, and run through the CLI;
and the folder mistakes, each one `error:` line."""

import json

import pytest
import torch
from cli_runs import prompts_file, run_vcbench
from tiny_video_pipelines import BUILDERS, CALLS_PER_STEP, FRAMES

import vcbench
from vcbench.pipelines.loaded import ClipSettings
from vcbench.pipelines.registry import load_model

STEPS = 2
SMALL = ["--steps", str(STEPS), "--height", "32", "--width", "32", "--device", "cpu"]
# The `__call__` defaults diffusers documents for each pipeline (CogVideoX: height and width
# from the transformer's sample size, 4 latents x the VAE's 8; no frame default).
DEFAULTS = {"CogVideoXPipeline": ClipSettings(steps=50, frames=0, height=32, width=32),
            "LTXPipeline": ClipSettings(steps=50, frames=161, height=512, width=704),
            "HunyuanVideoPipeline": ClipSettings(steps=50, frames=129, height=720, width=1280),
            "MochiPipeline": ClipSettings(steps=64, frames=19, height=480, width=848)}
# The latent grid of a FRAMES x 32x32 clip, from each build's VAE factors and patch size:
# CogVideoX 4x time, 8x space, patch 2 (its input frames-first); LTX-Video 4x, 4x, patch 1
# (its input packed into tokens); HunyuanVideo 4x, 8x, patch 1; Mochi 6x, 8x, patch 2.
GRIDS = {"CogVideoXPipeline": (2, 2, 2), "LTXPipeline": (2, 8, 8), "HunyuanVideoPipeline": (2, 4, 4),
         "MochiPipeline": (2, 2, 2)}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each pipeline's saved folder and self-attention module count, built on first use."""
    built = {}

    def get(name):
        if name not in built:
            built[name] = BUILDERS[name](tmp_path_factory.mktemp("pipelines") / name)
        return built[name]
    return get


def _generate(path, out, prompts, frames=5):
    return run_vcbench("generate", "--model", "diffusers", "--model-path", path, "--methods", "bf16,sage2-8bit",
                       "--prompts", prompts, "--seeds", "0", *SMALL, "--frames", frames, "--out", out)


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_generate_routes_every_self_attention_call_and_repeats(name, folders, tmp_path):
    path, modules = folders(name)
    prompts = prompts_file(tmp_path, {"p0": "a fox runs through the snow"})
    rows = []
    for k in range(2):  # a rerun into a fresh folder makes every clip again
        r = _generate(path, tmp_path / f"run{k}", prompts, FRAMES[name])
        assert r.returncode == 0, r.stderr
        manifest = json.loads((tmp_path / f"run{k}" / "manifest.json").read_text())
        assert manifest["status"] == "ok" and manifest["config"]["model"] == f"diffusers:{name}"
        rows.append({row["method"]: row for row in manifest["items"]})
    for method in ("bf16", "sage2-8bit"):
        row = rows[0][method]
        assert row["status"] == "ok" and row["model"] == f"diffusers:{name}"
        assert row["attention_calls"] == modules * CALLS_PER_STEP[name] * STEPS
        assert row["sha256"] == rows[1][method]["sha256"]  # bit-identical across reruns
    assert rows[0]["bf16"]["sha256"] != rows[0]["sage2-8bit"]["sha256"]  # the swap took effect


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_defaults_noise_grid_and_cross_attention(name, folders):
    path, _ = folders(name)
    model = load_model("diffusers", path, "cpu")
    assert model.defaults == DEFAULTS[name]
    # The first transformer input is the seed's CPU noise, in the pipeline's own latent layout.
    # (2 steps: Mochi's sigma schedule divides by half the step count.)
    seen = []
    handle = model.pipe.transformer.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs.get("hidden_states", args[0] if args else None)),
        with_kwargs=True)
    try:
        with vcbench.patch(model.pipe, "bf16") as p:
            model.generate("a fox", 7, ClipSettings(steps=2, frames=FRAMES[name], height=32, width=32))
    finally:
        handle.remove()
    first = seen[0][:1]
    assert torch.equal(first, torch.randn(first.shape, generator=torch.Generator().manual_seed(7)))
    assert p.state.grid == GRIDS[name]
    # Only LTX-Video has cross-attention (attn2, no is_cross_attention flag); its 128 text
    # tokens are exactly as many as the 2 x 8 x 8 video tokens, so shapes alone cannot tell.
    cross = {f"transformer.transformer_blocks.{i}.attn2": 2 for i in range(2)} if name == "LTXPipeline" else {}
    assert dict(p.plain) == cross


def _error_line(r, alone=True):
    """The run's one `error:` line: all it printed, or (`alone=False`, a mistake found once
    the model is loaded) the last line after the loaders' progress bars, with no traceback."""
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1 if alone else [x for x in lines if x.startswith("error:")] == lines[-1:], r.stderr
    return lines[-1]


def _index(folder, index):
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def test_folder_mistakes_are_one_error_line(tmp_path):
    prompts = prompts_file(tmp_path, {"p0": "a fox"})
    (tmp_path / "empty").mkdir()
    cases = {
        "empty": "has no model_index.json",
        _index(tmp_path / "unknown", {"_class_name": "NoSuchVideoPipeline"}).name:
            "names pipeline class 'NoSuchVideoPipeline', which diffusers",
        _index(tmp_path / "no-subfolder", {"_class_name": "CogVideoXPipeline",
                                           "transformer": ["diffusers", "CogVideoXTransformer3DModel"]}).name:
            "lists component 'transformer' (CogVideoXTransformer3DModel) but the folder has no transformer/",
        _index(tmp_path / "not-a-pipeline", {"_class_name": "AutoencoderKL"}).name:
            "names 'AutoencoderKL', which is not a diffusers pipeline class",
        _index(tmp_path / "unet", {"_class_name": "TextToVideoSDPipeline"}).name:
            "has no transformer component",
    }
    for folder, message in cases.items():
        line = _error_line(_generate(tmp_path / folder, tmp_path / f"out-{folder}", prompts))
        assert message in line
        assert not (tmp_path / f"out-{folder}" / "clips").exists()


def test_wan_folder_without_a_config_is_one_error_line(tmp_path):
    folder = _index(tmp_path / "wan", {"_class_name": "WanPipeline",
                                       "transformer": ["diffusers", "WanTransformer3DModel"],
                                       "transformer_2": ["diffusers", "WanTransformer3DModel"],
                                       "vae": ["diffusers", "AutoencoderKLWan"]})
    for part in ("transformer", "transformer_2", "vae"):  # every subfolder, none with a config
        (folder / part).mkdir()
        (folder / part / "diffusion_pytorch_model.safetensors").write_bytes(b"")
    r = run_vcbench("generate", "--model", "wan22-t2v-a14b", "--model-path", folder, "--out", tmp_path / "out")
    assert f"{folder / 'transformer'} has no config.json" in _error_line(r)


def test_settings_the_pipeline_cannot_make_are_one_error_line(folders, tmp_path):
    prompts = prompts_file(tmp_path, {"p0": "a fox"})
    ltx, _ = folders("LTXPipeline")
    cases = [(ltx, ["--height", "34"], "LTXPipeline needs height and width divisible by 4 (VAE 4x, patch 1)"),
             # the VAE allows it, the pipeline's own check_inputs does not
             (ltx, ["--height", "48"], "LTXPipeline: `height` and `width` have to be divisible by 32"),
             (ltx, ["--frames", "6"], "LTXPipeline needs a frame count of 4k+1"),
             (folders("CogVideoXPipeline")[0], [], "diffusers:CogVideoXPipeline has no default for --frames")]
    for k, (path, flags, message) in enumerate(cases):
        size = {"--steps": "2", "--frames": "5", "--height": "32", "--width": "32"}
        if flags:
            size[flags[0]] = flags[1]
        else:
            del size["--frames"]
        r = run_vcbench("generate", "--model", "diffusers", "--model-path", path, "--methods", "bf16",
                        "--prompts", prompts, *(a for kv in size.items() for a in kv), "--device", "cpu",
                        "--out", tmp_path / f"out{k}")
        assert message in _error_line(r, alone=False)
        assert not any((tmp_path / f"out{k}").glob("clips/**/row.json"))  # refused before any clip
