"""HunyuanVideo-1.5, the whole diffusers pipeline: tiny Qwen2.5-VL and ByT5 text encoders with a
tokenizer built here (no download), tiny transformer and VAE, random weights, saved with
save_pretrained and loaded back through the `--model-path` loader."""


import numpy as np
import torch
from tiny_tokenizers import byte_level_qwen_tokenizer

import vcbench
from vcbench.pipelines.loaded import ClipSettings
from vcbench.pipelines.registry import load_model
from vcbench.pipelines.tiny import TEXT_DIM, hunyuan15_transformer_config

PROMPT = 'A shop sign reading "OPEN" glows in the rain'  # the quoted text goes through ByT5
SMALL = ClipSettings(steps=2, frames=5, height=64, width=64)


def _qwen_tokenizer(folder):
    tok = byte_level_qwen_tokenizer(folder)
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    return tok


def _save_tiny_hunyuan15(path):
    from diffusers import (
        AutoencoderKLHunyuanVideo15,
        ClassifierFreeGuidance,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideo15Pipeline,
        HunyuanVideo15Transformer3DModel,
    )
    from transformers import (
        ByT5Tokenizer,
        Qwen2_5_VLTextConfig,
        Qwen2_5_VLTextModel,
        T5Config,
        T5EncoderModel,
    )

    tok = _qwen_tokenizer(path / "qwen-tokenizer")
    byt5_tok = ByT5Tokenizer()
    torch.manual_seed(0)
    qwen = Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(
        vocab_size=len(tok), hidden_size=TEXT_DIM, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, rope_scaling={"type": "mrope", "mrope_section": [4, 6, 6]}))
    byt5 = T5EncoderModel(T5Config(vocab_size=len(byt5_tok), d_model=32, d_kv=16, d_ff=64, num_layers=1, num_heads=2))
    HunyuanVideo15Pipeline(
        text_encoder=qwen, tokenizer=tok, text_encoder_2=byt5, tokenizer_2=byt5_tok,
        transformer=HunyuanVideo15Transformer3DModel(**hunyuan15_transformer_config()),
        vae=AutoencoderKLHunyuanVideo15(block_out_channels=(16, 16, 32, 32, 32), layers_per_block=1),
        scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), guider=ClassifierFreeGuidance(guidance_scale=6.0),
    ).save_pretrained(path / "model")
    return path / "model"


def test_hunyuan15_full_pipeline_from_a_local_folder(tmp_path):
    model = load_model("hunyuanvideo15", _save_tiny_hunyuan15(tmp_path), "cpu")
    pipe = model.pipe
    calls = {"qwen": 0, "byt5": 0}
    pipe.text_encoder.register_forward_hook(lambda *a: calls.__setitem__("qwen", calls["qwen"] + 1))
    pipe.text_encoder_2.register_forward_hook(lambda *a: calls.__setitem__("byt5", calls["byt5"] + 1))
    processors = {n: m.processor for n, m in pipe.transformer.named_modules() if hasattr(m, "processor")}
    reference = model.generate(PROMPT, 0, SMALL)
    assert reference.shape == (5, 64, 64, 3) and calls["qwen"] >= 1 and calls["byt5"] >= 1
    with vcbench.patch(pipe, "vc-8bit") as p:
        vc = model.generate(PROMPT, 0, SMALL)
    # The joint video+text block and the text refiner, once per step for each CFG pass.
    assert dict(p.routed) == {"transformer.transformer_blocks.0.attn": 4,
                              "transformer.context_embedder.token_refiner.refiner_blocks.0.attn": 4}
    assert p.actions == {0: "regroup", 1: "plain"} and p.state.grid == (2, 4, 4)
    assert vc.shape == reference.shape and not np.array_equal(vc, reference)
    # Restored: the same processors, and the same frames as before the patch, bit for bit.
    assert all(m.processor is processors[n] for n, m in pipe.transformer.named_modules() if n in processors)
    assert np.array_equal(model.generate(PROMPT, 0, SMALL), reference)
