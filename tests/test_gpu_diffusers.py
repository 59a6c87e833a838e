"""`--model diffusers` on CUDA, where the pipeline runs in bf16 (needs a GPU; skipped elsewhere):
the seeded latents reach each pipeline in its own latent dtype, and the CLI run routes every
self-attention call through the GPU kernels (`--backend auto`)."""

import json

import pytest
import torch
from cli_runs import prompts_file, run_vcbench
from tiny_video_pipelines import BUILDERS, CALLS_PER_STEP, FRAMES

from vcbench.pipelines.loaded import ClipSettings
from vcbench.pipelines.registry import load_model

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
STEPS = 2


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_bf16_pipeline_on_cuda(name, tmp_path):
    path, modules = BUILDERS[name](tmp_path / name)
    model = load_model("diffusers", path, "cuda")
    assert model.dtype == torch.bfloat16
    seen = []
    handle = model.pipe.transformer.register_forward_pre_hook(
        lambda m, args, kwargs: seen.append(kwargs.get("hidden_states", args[0] if args else None)),
        with_kwargs=True)
    try:
        model.generate("a fox", 7, ClipSettings(steps=2, frames=FRAMES[name], height=32, width=32))
    finally:
        handle.remove()
    first = seen[0][:1]
    noise = torch.randn(first.shape, generator=torch.Generator().manual_seed(7))
    assert torch.equal(first.cpu(), noise.to(first.dtype))  # CPU noise, cast as the pipeline's
    del model
    torch.cuda.empty_cache()

    out = tmp_path / "run"
    r = run_vcbench("generate", "--model", "diffusers", "--model-path", path, "--methods", "bf16,sage2-8bit",
                    "--prompts", prompts_file(tmp_path, {"p0": "a fox runs"}), "--seeds", "0",
                    "--steps", STEPS, "--frames", FRAMES[name], "--height", "32", "--width", "32",
                    "--backend", "auto", "--device", "cuda", "--out", out)
    assert r.returncode == 0, r.stderr
    rows = {row["method"]: row for row in json.loads((out / "manifest.json").read_text())["items"]}
    for row in rows.values():
        assert row["status"] == "ok" and row["attention_calls"] == modules * CALLS_PER_STEP[name] * STEPS
    assert rows["bf16"]["sha256"] != rows["sage2-8bit"]["sha256"]
