"""Random-weight pipelines built from small configs: `tiny-wan-random` and the test models.

`tiny-wan-random` is diffusers' own `WanPipeline` (two experts, as Wan2.2-T2V-A14B) with a small
`WanTransformer3DModel` and `AutoencoderKLWan`, weights drawn from a fixed seed. Head dim is
128 like the real model, so every method runs its real tile shapes; the default clip has
3 latent frames of 16x16 patches = 768 video tokens. The text encoder is replaced by
`ByteConditioning` (no tokenizer download). Everything it generates is random-weight output
and is labelled so (`random_weights: true`).

The `*_config` functions are the small configs of each family that the tests save with
`save_pretrained` and load back through the real `--model-path` loaders.
"""

from __future__ import annotations

import torch

from vcbench.pipelines.loaded import ClipSettings

WEIGHT_SEED = 1234
TEXT_DIM = 64
HEAD_DIM = 128
# 12 steps: a 3-step grouping window (regroup at 0, reuse at 1-2, plain after).
TINY_WAN_RANDOM_DEFAULTS = ClipSettings(steps=12, frames=9, height=256, width=256)


def wan_transformer_config(layers: int = 2, heads: int = 2) -> dict:
    return dict(patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=HEAD_DIM,
                in_channels=16, out_channels=16, text_dim=TEXT_DIM, freq_dim=64, ffn_dim=256,
                num_layers=layers, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                rope_max_seq_len=256)


def wan_vae_config() -> dict:
    # Keeps Wan's 4x temporal / 8x spatial compression and z_dim 16 with far fewer channels.
    return dict(base_dim=8, z_dim=16, dim_mult=[1, 1, 2, 2], num_res_blocks=1,
                temperal_downsample=[False, True, True])


def wan_scheduler():
    from diffusers import UniPCMultistepScheduler

    # Wan2.2's own sampler settings (flow matching, shift 12 for T2V-A14B).
    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                   num_train_timesteps=1000, flow_shift=12.0)


def seeded(seed: int):
    """Module weights drawn under a fixed seed, so the tiny model is the same everywhere."""
    torch.manual_seed(seed)


def build_tiny_wan_components(layers: int = 2, heads: int = 2) -> dict:
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    seeded(WEIGHT_SEED)
    transformer = WanTransformer3DModel(**wan_transformer_config(layers, heads))
    seeded(WEIGHT_SEED + 1)
    transformer_2 = WanTransformer3DModel(**wan_transformer_config(layers, heads))
    seeded(WEIGHT_SEED + 2)
    vae = AutoencoderKLWan(**wan_vae_config())
    return dict(transformer=transformer, transformer_2=transformer_2, vae=vae,
                scheduler=wan_scheduler())


def build_tiny_wan(layers: int = 2, heads: int = 2):
    """diffusers.WanPipeline with random weights, no tokenizer/text encoder (prompt_embeds)."""
    from diffusers import WanPipeline

    parts = build_tiny_wan_components(layers, heads)
    pipe = WanPipeline(tokenizer=None, text_encoder=None, boundary_ratio=0.875, **parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def hunyuan15_transformer_config() -> dict:
    return dict(in_channels=65, out_channels=32, num_attention_heads=2, attention_head_dim=HEAD_DIM,
                num_layers=1, num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1,
                qk_norm="rms_norm", text_embed_dim=TEXT_DIM, text_embed_2_dim=32,
                image_embed_dim=32, rope_axes_dim=(16, 56, 56), target_size=64, task_type="t2v")


def load_tiny_wan(device: torch.device, dtype: torch.dtype):
    from vcbench.pipelines.loaded import LoadedModel
    from vcbench.pipelines.text_conditioning import ByteConditioning
    from vcbench.pipelines.wan import call_wan

    pipe = build_tiny_wan().to(device)
    if dtype != torch.float32:  # built in float32; diffusers warns on a no-op cast
        pipe.to(dtype=dtype)
    return LoadedModel("tiny-wan-random", pipe, TINY_WAN_RANDOM_DEFAULTS, call_wan, device, dtype, random_weights=True,
                       extra={"conditioning": ByteConditioning(TEXT_DIM)})
