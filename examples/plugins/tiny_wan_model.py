"""A model plugin: a diffusers WanPipeline built from a small config with seeded random weights,
registered as the model `tiny-wan-1layer` (one transformer block, one expert).

    vcbench generate --plugin examples/plugins/tiny_wan_model.py --model tiny-wan-1layer ...

A real model's loader reads `--model-path DIR` (`needs_path=True`) with
`from_pretrained(DIR, local_files_only=True)`; the call is any function that makes one clip.
"""

import torch

import vcbench
from vcbench.pipelines.loaded import ClipSettings, LoadedModel
from vcbench.pipelines.registry import ModelEntry
from vcbench.pipelines.wan import check_wan


def load(path, device, dtype):
    from diffusers import AutoencoderKLWan, WanPipeline, WanTransformer3DModel

    from vcbench.pipelines.text_conditioning import ByteConditioning
    from vcbench.pipelines.tiny import (
        TEXT_DIM,
        wan_scheduler,
        wan_transformer_config,
        wan_vae_config,
    )
    from vcbench.pipelines.wan import call_wan

    torch.manual_seed(7)  # the same weights on every machine
    transformer = WanTransformer3DModel(**wan_transformer_config(layers=1, heads=2))
    vae = AutoencoderKLWan(**wan_vae_config())
    pipe = WanPipeline(tokenizer=None, text_encoder=None, transformer=transformer, vae=vae,
                       scheduler=wan_scheduler())
    pipe.set_progress_bar_config(disable=True)
    pipe.to(device)
    return LoadedModel("tiny-wan-1layer", pipe, DEFAULTS, call_wan, device, dtype,
                       random_weights=True, extra={"conditioning": ByteConditioning(TEXT_DIM)})


# The clip a request gets for each setting it leaves out, known before the model loads; `check`
# refuses, before anything loads, the settings the model cannot make (Wan: 4k+1 frames, sides
# that are multiples of 16).
DEFAULTS = ClipSettings(steps=4, frames=5, height=64, width=64)
vcbench.register(ModelEntry("tiny-wan-1layer", "WanPipeline, one random-weight block (a plugin)",
                            load, defaults=DEFAULTS, needs_path=False, check=check_wan))
