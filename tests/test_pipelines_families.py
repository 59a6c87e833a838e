"""The real-model loaders, exercised with tiny configs of each diffusers family saved to disk
and loaded back through the `--model-path` code path."""

import pytest
import torch
from tiny_tokenizers import letter_tokenizer

import vcbench
from vcbench.errors import UserError
from vcbench.pipelines.loaded import ClipSettings
from vcbench.pipelines.registry import load_model
from vcbench.pipelines.tiny import TEXT_DIM, build_tiny_wan_components, hunyuan15_transformer_config


def test_wan22_loader_reads_a_local_two_expert_folder(tmp_path):
    from diffusers import WanPipeline
    from transformers import UMT5Config, UMT5EncoderModel

    tokenizer = letter_tokenizer()
    torch.manual_seed(0)
    encoder = UMT5EncoderModel(UMT5Config(vocab_size=tokenizer.vocab_size, d_model=TEXT_DIM, d_kv=16,
                                          d_ff=64, num_layers=1, num_heads=2))
    WanPipeline(tokenizer=tokenizer, text_encoder=encoder, boundary_ratio=0.875,
                **build_tiny_wan_components()).save_pretrained(tmp_path)
    model = load_model("wan22-t2v-a14b", tmp_path, "cpu")
    assert model.defaults == ClipSettings(steps=40, frames=81, height=720, width=1280)
    small = ClipSettings(steps=3, frames=5, height=128, width=128)
    with vcbench.patch(model.pipe, "vc-8bit") as p:
        frames = model.generate("a fox", 0, small)
    assert frames.shape == (5, 128, 128, 3)
    assert {n.split(".")[0] for n in p.routed} == {"transformer", "transformer_2"}


def test_hunyuan15_joint_masked_attention_is_routed(tmp_path):
    from diffusers import HunyuanVideo15Transformer3DModel

    torch.manual_seed(0)
    HunyuanVideo15Transformer3DModel(**hunyuan15_transformer_config()).save_pretrained(tmp_path)
    model = HunyuanVideo15Transformer3DModel.from_pretrained(tmp_path, local_files_only=True).eval()
    g = torch.Generator().manual_seed(1)
    text_mask = torch.ones(1, 16, dtype=torch.bool)
    text_mask[:, 10:] = False  # padded prompt tokens: masked in the joint attention
    byt5_mask = torch.ones(1, 8, dtype=torch.bool)
    byt5_mask[:, 6:] = False
    inputs = dict(hidden_states=torch.randn(1, 65, 2, 8, 8, generator=g), timestep=torch.tensor([500.0]),
                  encoder_hidden_states=torch.randn(1, 16, TEXT_DIM, generator=g),
                  encoder_attention_mask=text_mask,
                  encoder_hidden_states_2=torch.randn(1, 8, 32, generator=g),
                  encoder_attention_mask_2=byt5_mask, image_embeds=torch.zeros(1, 4, 32),
                  return_dict=False)
    with torch.no_grad():
        reference = model(**inputs)[0]
        with vcbench.patch(model, "bf16") as p:
            bf16 = model(**inputs)[0]
        with vcbench.patch(model, "vc-8bit") as q:
            vc = model(**inputs)[0]
    assert p.routed["transformer.transformer_blocks.0.attn"] == 1  # joint video+text block
    assert p.state.grid == (2, 8, 8)
    # BF16 on the valid tokens only reproduces the masked SDPA output.
    torch.testing.assert_close(bf16, reference, atol=1e-3, rtol=1e-3)
    assert not torch.equal(vc, reference) and torch.isfinite(vc).all()
    assert q.actions == {0: "regroup"}


def test_longcat_without_upstream_package_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="upstream LongCat-Video package"):
        load_model("longcat-video", tmp_path, "cpu")


def test_minimax_h3_modular_pipeline_exists_in_diffusers():
    from diffusers.modular_pipelines import MiniMaxH3ModularPipeline  # noqa: F401
