"""Tiny random-weight diffusers video pipelines other than Wan, each built whole (tokenizers and
text encoders included, nothing downloaded), seeded, and saved with save_pretrained, for the
`--model diffusers` tests. Each builder returns the folder and the number of self-attention
modules of its transformer, counted from the config it was built with (not by vcbench)."""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_tokenizers import letter_tokenizer


def _t5(tokenizer, width):
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(vocab_size=tokenizer.vocab_size, d_model=width, d_kv=16, d_ff=64,
                                   num_layers=1, num_heads=2))


def save_cogvideox(path: Path) -> tuple[Path, int]:
    """CogVideoX: joint [text, video] self-attention in every block (`attn1`), DDIM, batched CFG."""
    from diffusers import (
        AutoencoderKLCogVideoX,
        CogVideoXDDIMScheduler,
        CogVideoXPipeline,
        CogVideoXTransformer3DModel,
    )

    torch.manual_seed(0)
    tokenizer = letter_tokenizer()
    layers = 2
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=2, attention_head_dim=64, in_channels=4, out_channels=4, time_embed_dim=8,
        text_embed_dim=32, num_layers=layers, sample_width=4, sample_height=4, sample_frames=5,
        patch_size=2, temporal_compression_ratio=4, max_text_seq_length=226)
    vae = AutoencoderKLCogVideoX(
        down_block_types=("CogVideoXDownBlock3D",) * 4, up_block_types=("CogVideoXUpBlock3D",) * 4,
        block_out_channels=(8, 8, 8, 8), latent_channels=4, layers_per_block=1, norm_num_groups=2,
        temporal_compression_ratio=4)
    CogVideoXPipeline(tokenizer=tokenizer, text_encoder=_t5(tokenizer, 32), vae=vae, transformer=transformer,
                      scheduler=CogVideoXDDIMScheduler()).save_pretrained(path)
    return path, layers


def save_ltx(path: Path) -> tuple[Path, int]:
    """LTX-Video: self-attention `attn1` and text cross-attention `attn2` per block, batched CFG."""
    from diffusers import (
        AutoencoderKLLTXVideo,
        FlowMatchEulerDiscreteScheduler,
        LTXPipeline,
        LTXVideoTransformer3DModel,
    )

    torch.manual_seed(0)
    tokenizer = letter_tokenizer()
    layers = 2
    transformer = LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=2,
        attention_head_dim=64, cross_attention_dim=128, num_layers=layers, caption_channels=32)
    vae = AutoencoderKLLTXVideo(
        latent_channels=8, block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 8, 8, 8),
        layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1, 1),
        spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False),
        decoder_inject_noise=(False, False, False, False, False), upsample_residual=(False,) * 4,
        upsample_factor=(1,) * 4, timestep_conditioning=False, patch_size=1, patch_size_t=1,
        encoder_causal=True, decoder_causal=False)
    LTXPipeline(tokenizer=tokenizer, text_encoder=_t5(tokenizer, 32), vae=vae, transformer=transformer,
                scheduler=FlowMatchEulerDiscreteScheduler()).save_pretrained(path)
    return path, layers


def save_hunyuanvideo(path: Path) -> tuple[Path, int]:
    """HunyuanVideo (the first one): dual-stream blocks, single-stream blocks and a text token
    refiner, all self-attention (joint [video, text] with a boolean mask over padded text);
    guidance is an embedding, so one transformer call per step."""
    from diffusers import (
        AutoencoderKLHunyuanVideo,
        FlowMatchEulerDiscreteScheduler,
        HunyuanVideoPipeline,
        HunyuanVideoTransformer3DModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    torch.manual_seed(0)
    tokenizer, tokenizer_2 = letter_tokenizer(), letter_tokenizer()
    double, single, refiner = 1, 1, 1
    transformer = HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=64, num_layers=double,
        num_single_layers=single, num_refiner_layers=refiner, patch_size=1, patch_size_t=1,
        guidance_embeds=True, text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(16, 24, 24))
    vae = AutoencoderKLHunyuanVideo(
        latent_channels=4, down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8),
        layers_per_block=1, norm_num_groups=4, spatial_compression_ratio=8, temporal_compression_ratio=4,
        mid_block_add_attention=False)
    llama = LlamaModel(LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, intermediate_size=32,
                                   num_attention_heads=2, num_hidden_layers=3, pad_token_id=0))
    clip = CLIPTextModel(CLIPTextConfig(vocab_size=tokenizer_2.vocab_size, hidden_size=8, intermediate_size=16,
                                        num_attention_heads=2, num_hidden_layers=1, pad_token_id=0,
                                        bos_token_id=1, eos_token_id=2))
    HunyuanVideoPipeline(text_encoder=llama, tokenizer=tokenizer, transformer=transformer, vae=vae,
                         scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=clip,
                         tokenizer_2=tokenizer_2).save_pretrained(path)
    return path, double + single + refiner


def save_mochi(path: Path) -> tuple[Path, int]:
    """Mochi: joint [video, valid text] self-attention (`attn1`, a `MochiAttention`, which has a
    processor but no `set_processor`), computed one batch entry at a time: one SDPA call per
    sample, so two per block per step under CFG."""
    from diffusers import (
        AutoencoderKLMochi,
        FlowMatchEulerDiscreteScheduler,
        MochiPipeline,
        MochiTransformer3DModel,
    )

    torch.manual_seed(0)
    tokenizer = letter_tokenizer()
    layers = 2
    transformer = MochiTransformer3DModel(
        patch_size=2, num_attention_heads=2, attention_head_dim=64, num_layers=layers, pooled_projection_dim=16,
        in_channels=12, qk_norm="rms_norm", text_embed_dim=32, time_embed_dim=4, activation_fn="swiglu",
        max_sequence_length=256)
    vae = AutoencoderKLMochi(latent_channels=12, out_channels=3, encoder_block_out_channels=(32,) * 4,
                             decoder_block_out_channels=(32,) * 4, layers_per_block=(1,) * 5)
    MochiPipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=_t5(tokenizer, 32),
                  tokenizer=tokenizer, transformer=transformer).save_pretrained(path)
    return path, layers


BUILDERS = {"CogVideoXPipeline": save_cogvideox, "LTXPipeline": save_ltx,
            "HunyuanVideoPipeline": save_hunyuanvideo, "MochiPipeline": save_mochi}

# 1 + a multiple of each VAE's temporal factor: 4, and Mochi's 6.
FRAMES = {"CogVideoXPipeline": 5, "LTXPipeline": 5, "HunyuanVideoPipeline": 5, "MochiPipeline": 7}
# SDPA calls per self-attention module per step. One transformer call per step in all four:
# CogVideoX, LTX-Video and Mochi batch the CFG pair into one call, HunyuanVideo embeds its
# guidance (no CFG at the default true_cfg_scale 1); Mochi's processor then attends one batch
# entry at a time (its valid text tokens differ per entry), so two calls.
CALLS_PER_STEP = {"CogVideoXPipeline": 1, "LTXPipeline": 1, "HunyuanVideoPipeline": 1, "MochiPipeline": 2}
