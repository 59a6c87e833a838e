"""MiniMax-H3 (diffusers 0.42 modular pipeline) with a tiny random-weight transformer saved to
disk and loaded back through the `--model-path` loader, then the pipeline's own t2va denoise
workflow run with the attention patched. The tiny folder has no Qwen3-VL text encoder, video
or audio VAE (see docs/pipelines.md), so the text conditioning is given as embeddings and the
denoised latents are compared instead of decoded frames."""

import pytest
import torch

import vcbench
from vcbench.errors import UserError
from vcbench.pipelines.registry import load_model

TEXT_DIM = 32
STEPS = 3  # MiniMax-H3's scheduler evaluates the transformer steps - 1 = 2 times


def _save_tiny_minimax(path):
    from diffusers import MiniMaxH3Scheduler, MiniMaxH3Transformer3DModel
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import (
        MiniMaxH3CoreDenoiseStep,
    )

    torch.manual_seed(0)
    transformer = MiniMaxH3Transformer3DModel(
        num_attention_heads=2, attention_head_dim=128, hidden_size=64, num_layers=2, num_refiner_layers=1,
        ffn_dim=128, text_dim=TEXT_DIM, freq_dim=32, time_embed_hidden_dim=64, time_embed_dim=32)
    pipe = MiniMaxH3CoreDenoiseStep().init_pipeline()
    pipe.update_components(transformer=transformer, scheduler=MiniMaxH3Scheduler(),
                           audio_scheduler=MiniMaxH3Scheduler())
    # Each component in its subfolder, and modular_model_index.json pointing at them.
    pipe.save_pretrained(str(path), overwrite_modular_index=True)
    assert {"transformer", "scheduler", "audio_scheduler"} <= {p.name for p in path.iterdir()}


def _denoise(pipe):
    """The t2va denoise workflow of diffusers' MiniMax-H3 blocks on the loaded components."""
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import (
        MiniMaxH3CoreDenoiseStep,
    )

    run = MiniMaxH3CoreDenoiseStep().init_pipeline()
    run.update_components(transformer=pipe.transformer, scheduler=pipe.scheduler,
                          audio_scheduler=pipe.audio_scheduler)
    g = torch.Generator().manual_seed(7)
    text = torch.randn(1, 12, TEXT_DIM, generator=g)
    with torch.no_grad():
        return run, lambda: run(prompt_embeds=text, text_token_tags=torch.ones(12, dtype=torch.long),
                                height=64, width=64, num_frames=124, num_inference_steps=STEPS,
                                generator=torch.Generator().manual_seed(0), output="latents")


@pytest.fixture(scope="module")
def tiny_minimax(tmp_path_factory):
    path = tmp_path_factory.mktemp("minimax")
    _save_tiny_minimax(path)
    return path


def test_minimax_h3_loads_and_every_packed_attention_call_is_routed(tiny_minimax):
    from diffusers import MiniMaxH3Transformer3DModel

    model = load_model("minimax-h3", tiny_minimax, "cpu")
    assert isinstance(model.pipe.transformer, MiniMaxH3Transformer3DModel)
    run, denoise = _denoise(model.pipe)
    modules = {n: m for n, m in model.pipe.transformer.named_modules() if hasattr(m, "processor")}
    before = {n: m.processor for n, m in modules.items()}
    reference = denoise()
    with vcbench.patch(run, "bf16") as p:
        bf16 = denoise()
    # Two blocks over the packed text+audio+video sequence and the text refiner, once per step.
    assert dict(p.routed) == {f"transformer.{n}": STEPS - 1 for n in modules} and len(modules) == 3
    assert not p.plain and p.state.grid is None
    torch.testing.assert_close(bf16, reference, atol=2e-3, rtol=2e-3)
    with vcbench.patch(run, "vc-8bit") as q:
        vc = denoise()
    assert q.actions == {0: "regroup", 1: "plain"}  # 25% of the 2 published steps
    assert torch.isfinite(vc).all() and not torch.equal(vc, reference)
    # Restored: the same processor objects, and the very same output as before patching.
    assert all(m.processor is before[n] for n, m in modules.items())
    assert torch.equal(denoise(), reference)


def test_minimax_h3_lora_path_changes_the_transformer(tiny_minimax, tmp_path):
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(3)
    lora = {f"transformer.transformer_blocks.{i}.attn.{proj}.lora_{ab}.weight": torch.randn(shape, generator=g)
            for i in range(2) for proj in ("to_q", "to_v")
            for ab, shape in (("A", (4, 64)), ("B", (256, 4)))}
    save_file(lora, tmp_path / "lora.safetensors")
    base = load_model("minimax-h3", tiny_minimax, "cpu")
    with_lora = load_model("minimax-h3", tiny_minimax, "cpu", lora_path=tmp_path / "lora.safetensors")
    _, plain = _denoise(base.pipe)
    _, adapted = _denoise(with_lora.pipe)
    assert not torch.equal(plain(), adapted())
    with pytest.raises(UserError, match="is not a file"):
        load_model("minimax-h3", tiny_minimax, "cpu", lora_path=tmp_path / "missing.safetensors")


def test_minimax_h3_clip_settings_are_checked():
    from vcbench.pipelines.loaded import ClipSettings
    from vcbench.pipelines.minimax import MINIMAX_DEFAULTS, check_minimax

    check_minimax(MINIMAX_DEFAULTS)  # the paper's 243 frames = 17 * 14 + 5, 10.1 s
    for bad in (ClipSettings(8, 81, 768, 1344), ClipSettings(8, 362, 768, 1344), ClipSettings(8, 243, 720, 1280)):
        with pytest.raises(UserError, match="MiniMax-H3 needs"):
            check_minimax(bad)


def test_lora_path_is_refused_for_other_models(tmp_path, capsys):
    from vcbench.cli import main

    (tmp_path / "l.safetensors").write_bytes(b"")
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--model", "tiny-wan", "--lora-path", str(tmp_path / "l.safetensors"),
              "--out", str(tmp_path / "run")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: --lora-path applies to minimax-h3 only, not tiny-wan\n"
