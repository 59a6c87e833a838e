"""MiniMax-H3 (diffusers 0.42 modular pipeline), random weights saved to disk and loaded back
through the `--model-path` loader.

Two tiny folders: one with the transformer and schedulers only (the t2va denoise workflow run
with given text embeddings: routing, LoRA), and a complete one (Qwen3-VL text encoder with 51
tiny layers, since the pipeline reads hidden state 50, its processor and a byte-level tokenizer
built here; the video VAE and the audio VAE) that `call_minimax`'s `pipe(prompt=...)` and
`vcbench generate` run end to end: text encoding, denoising, video and audio decode."""

import json

import numpy as np
import pytest
import torch
from tiny_tokenizers import byte_level_qwen_tokenizer

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
    assert capsys.readouterr().err == "error: model tiny-wan takes no --lora-path (only minimax-h3 does)\n"


# -- the complete pipeline ---------------------------------------------------------------------

# The smallest legal clip: 124 = 17 * 7 + 5 frames (5.2 s at 24 fps, the pipeline's minimum
# duration), 64x64 (a multiple of its 32-pixel canvas step); 3 steps = 2 transformer calls.
SMALL = ["--steps", "3", "--frames", "124", "--height", "64", "--width", "64"]
PROMPT = "a red kite over a grey sea"


def _qwen3vl_tokenizer(folder):
    """Byte-level Qwen2 tokenizer with the vision tokens Qwen3VLProcessor looks up."""
    return byte_level_qwen_tokenizer(folder, (
        "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"))


def _save_full_minimax(path):
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3Scheduler,
        MiniMaxH3Transformer3DModel,
    )
    from diffusers.modular_pipelines import MiniMaxH3Blocks
    from transformers import (
        Qwen2VLImageProcessor,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
        Qwen3VLProcessor,
    )
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

    tok = _qwen3vl_tokenizer(path / "tokenizer-src")
    ids = {name: tok.convert_tokens_to_ids(f"<|{name}|>") for name in ("image_pad", "video_pad", "vision_start",
                                                                        "vision_end")}
    torch.manual_seed(0)
    # 51 decoder layers (hidden_states[50] is the conditioning), each 32 wide with 2 heads.
    text_encoder = Qwen3VLForConditionalGeneration(Qwen3VLConfig(
        text_config=dict(vocab_size=len(tok), hidden_size=TEXT_DIM, intermediate_size=32, num_hidden_layers=51,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                          "mrope_section": [2, 3, 3], "mrope_interleaved": True}),
        vision_config=dict(depth=1, hidden_size=16, intermediate_size=16, num_heads=1, out_hidden_size=TEXT_DIM,
                           patch_size=16, deepstack_visual_indexes=[0], num_position_embeddings=16),
        image_token_id=ids["image_pad"], video_token_id=ids["video_pad"],
        vision_start_token_id=ids["vision_start"], vision_end_token_id=ids["vision_end"]))
    processor = Qwen3VLProcessor(image_processor=Qwen2VLImageProcessor(patch_size=16), tokenizer=tok,
                                 video_processor=Qwen3VLVideoProcessor(patch_size=16))
    transformer = MiniMaxH3Transformer3DModel(
        num_attention_heads=2, attention_head_dim=128, hidden_size=64, num_layers=2, num_refiner_layers=1,
        ffn_dim=128, text_dim=TEXT_DIM, freq_dim=32, time_embed_hidden_dim=64, time_embed_dim=32)
    # The released geometry (16x spatial, 4x temporal, 17-frame chunks) with tiny widths.
    vae = AutoencoderKLMiniMaxH3(block_out_channels=(8,) * 6, layers_per_block=1, norm_num_groups=4,
                                 decoder_num_layers=1, decoder_num_attention_heads=1, decoder_attention_head_dim=16,
                                 decoder_num_register_tokens=1, decoder_ffn_mult=1)
    audio_vae = AutoencoderKLMiniMaxH3Audio(
        encoder_dim=2, latent_dim=32, latent_channels=32, num_attention_heads=1, decoder_dim=4,
        decoder_rates=(800,), decoder_kernel_sizes=(800,), resblock_kernel_sizes=(3,),
        resblock_dilation_sizes=((1,),), latents_mean=[0.0] * 32, latents_std=[1.0] * 32)
    pipe = MiniMaxH3Blocks().init_pipeline()
    pipe.update_components(text_encoder=text_encoder, tokenizer=tok, processor=processor, transformer=transformer,
                           vae=vae, audio_vae=audio_vae, scheduler=MiniMaxH3Scheduler(),
                           audio_scheduler=MiniMaxH3Scheduler(shift=3.0))
    pipe.save_pretrained(str(path / "model"), overwrite_modular_index=True)
    return path / "model"


@pytest.fixture(scope="module")
def full_minimax(tmp_path_factory):
    return _save_full_minimax(tmp_path_factory.mktemp("minimax-full"))


def test_minimax_h3_end_to_end_text_encoder_denoise_and_decode(full_minimax):
    from vcbench.pipelines.loaded import ClipSettings

    model = load_model("minimax-h3", full_minimax, "cpu")
    pipe = model.pipe
    calls = {"text_encoder": 0, "vae": 0, "audio_vae": 0}

    def count(name):
        return lambda *a: calls.__setitem__(name, calls[name] + 1)

    pipe.text_encoder.model.register_forward_hook(count("text_encoder"))
    pipe.vae.decoder.register_forward_hook(count("vae"))
    pipe.audio_vae.decoder.register_forward_hook(count("audio_vae"))
    small = ClipSettings(steps=3, frames=124, height=64, width=64)
    modules = {n: m.processor for n, m in pipe.transformer.named_modules() if hasattr(m, "processor")}
    reference = model.generate(PROMPT, 0, small)
    assert reference.shape == (124, 64, 64, 3) and reference.dtype == np.uint8 and reference.std() > 0
    assert calls["text_encoder"] == 1 and calls["vae"] >= 1 and calls["audio_vae"] == 1
    with vcbench.patch(pipe, "vc-8bit") as p:
        vc = model.generate(PROMPT, 0, small)
    # Two blocks over the packed text+audio+video sequence and the text refiner, 2 calls each;
    # neither the Qwen3-VL encoder nor the VAE decoder (both attend too) is touched.
    assert dict(p.routed) == {f"transformer.{n}": 2 for n in modules} and len(modules) == 3
    assert p.actions == {0: "regroup", 1: "plain"} and not p.plain
    assert vc.shape == reference.shape and not np.array_equal(vc, reference)
    # Restored: the same processors, and bit-identical frames; the prompt reaches the frames.
    assert all(m.processor is modules[n] for n, m in pipe.transformer.named_modules() if n in modules)
    assert np.array_equal(model.generate(PROMPT, 0, small), reference)
    assert not np.array_equal(model.generate("a blue tram at night", 0, small), reference)


def test_vcbench_generate_minimax_h3_from_model_path(full_minimax, tmp_path):
    from vcbench.cli import main
    from vcbench.pipelines.video_io import read_frames

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "kite", "prompt": PROMPT}) + "\n")
    out = tmp_path / "run"
    main(["generate", "--model", "minimax-h3", "--model-path", str(full_minimax), "--methods", "bf16,vc-8bit",
          "--prompts", str(prompts), "--seeds", "0", *SMALL, "--out", str(out)])
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "ok" and manifest["config"]["model"] == "minimax-h3"
    rows = {r["item"]: r for r in manifest["items"]}
    assert set(rows) == {"bf16/kite/s0", "vc-8bit/kite/s0"}
    for r in rows.values():
        assert r["status"] == "ok" and r["steps"] == 3 and r["attention_calls"] == 6
        assert read_frames(out / r["frames_dir"]).shape == (124, 64, 64, 3)
    assert rows["vc-8bit/kite/s0"]["grouping_actions"] == {"0": "regroup", "1": "plain"}
    assert rows["bf16/kite/s0"]["sha256"] != rows["vc-8bit/kite/s0"]["sha256"]
