"""ToyWan: the trained tiny Wan that `tiny-wan` ships (weights in vcbench/pipelines/data/).

It is diffusers' own `WanPipeline` around a small `WanTransformer3DModel` (head dim 128, one
expert), so `vcbench generate` and `vcbench.patch` run exactly the code they run for Wan2.2.
Two parts differ from Wan, both so that the whole model fits in 2 MB and trains in minutes:
- `PatchifyVAE`: a fixed, exactly invertible patchify in place of Wan's VAE. It keeps Wan's
  causal layout (latent frame 0 = frame 0, then one latent frame per 4 frames) at 4x spatial
  compression: 17 frames of 64x64 -> 5 x 16 x 16 latents of 192 channels -> 320 tokens after
  the transformer's 1x2x2 patch. Nothing to train, nothing lost.
- `CaptionEmbedding`: a learned embedding of the toyvideo caption vocabulary, one row per
  (position, word) (the cross-attention has no positions of its own, and "a red disk over
  blue stripes" must not mean "a blue disk over red stripes"). Padding is all zeros, so the
  empty prompt (CFG's negative) is the all-zero sequence the trainer drops captions to.

- `XPredWanTransformer`: `WanTransformer3DModel` (same modules, same attention) whose network
  predicts the clean latents; its forward returns the flow velocity (x_t - x_0) / sigma that
  Wan's scheduler takes. A 768-value patch token read out of a 128-wide model cannot carry
  the noise a velocity holds, but can carry a clean patch (Li & He 2025, "Back to Basics: Let
  Denoising Generative Models Denoise"); velocity prediction left speckle in every sample.

One safetensors file holds the transformer (`transformer.*`), the caption embedding
(`text.*`) and, in its metadata, the JSON config everything is rebuilt from.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from torch import nn

from vcbench.errors import UserError
from vcbench.pipelines import toyvideo

WEIGHTS = Path(__file__).parent / "data" / "toywan.safetensors"
TEXT_DIM = 32
# Pixel statistics of ToyVideo in [-1, 1] (dark base, dimmed texture, a small bright shape);
# the latents the transformer sees are (patchified pixels - MEAN) / STD.
PIXEL_MEAN, PIXEL_STD = -0.6, 0.45


def transformer_config(layers: int = 3, heads: int = 1, ffn: int = 256) -> dict:
    channels = PatchifyVAE.channels_for(patch=4, temporal=4)
    return dict(patch_size=(1, 2, 2), num_attention_heads=heads, attention_head_dim=128,
                in_channels=channels, out_channels=channels, text_dim=TEXT_DIM, freq_dim=64,
                ffn_dim=ffn, num_layers=layers, cross_attn_norm=True,
                qk_norm="rms_norm_across_heads", rope_max_seq_len=256)


def scheduler(shift: float):
    from diffusers import UniPCMultistepScheduler

    # Wan's sampler (UniPC on flow sigmas); the shift is the one the trainer sampled sigmas with.
    return UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                   num_train_timesteps=1000, flow_shift=shift)


class PatchifyVAE(ModelMixin, ConfigMixin):
    """Pixels (B, 3, 1+4k, H, W) in [-1, 1] <-> latents (B, 3*4*p*p, 1+k, H/p, W/p), exactly."""

    @staticmethod
    def channels_for(patch: int, temporal: int) -> int:
        return 3 * temporal * patch * patch

    @register_to_config
    def __init__(self, patch: int = 4, temporal: int = 4, mean: float = PIXEL_MEAN,
                 std: float = PIXEL_STD) -> None:
        super().__init__()
        z = self.channels_for(patch, temporal)
        # The names WanPipeline reads from a VAE config.
        self.register_to_config(z_dim=z, latents_mean=[mean] * z, latents_std=[std] * z,
                                scale_factor_spatial=patch, scale_factor_temporal=temporal)
        # A buffer so that .dtype/.device (which diffusers reads) follow .to().
        self.register_buffer("anchor", torch.zeros(()), persistent=False)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        p, t = self.config.patch, self.config.temporal
        b, c, f, h, w = x.shape
        # Frame 0 fills its own latent frame (Wan's causal first frame), repeated t times.
        x = torch.cat([x[:, :, :1].expand(b, c, t, h, w), x[:, :, 1:]], dim=2)
        n = x.shape[2] // t
        x = x.reshape(b, c, n, t, h // p, p, w // p, p).permute(0, 1, 3, 5, 7, 2, 4, 6)
        return x.reshape(b, c * t * p * p, n, h // p, w // p)

    def decode(self, z: torch.Tensor, return_dict: bool = True):
        p, t = self.config.patch, self.config.temporal
        b, _, n, hp, wp = z.shape
        x = z.reshape(b, 3, t, p, p, n, hp, wp).permute(0, 1, 5, 2, 6, 3, 7, 4)
        x = x.reshape(b, 3, n, t, hp * p, wp * p)
        first = x[:, :, 0].mean(dim=2, keepdim=True)  # the t copies of frame 0
        video = torch.cat([first, x[:, :, 1:].flatten(2, 3)], dim=2)
        if return_dict:
            from diffusers.models.autoencoders.vae import DecoderOutput
            return DecoderOutput(sample=video)
        return (video,)


SIGMA_MIN = 0.05  # the velocity divides by sigma; the clamp bounds it near the data end


def _xpred_class():
    from diffusers import WanTransformer3DModel
    from diffusers.models.modeling_outputs import Transformer2DModelOutput

    class XPredWanTransformer(WanTransformer3DModel):
        """The network's output is x_0; forward returns v = (x_t - x_0) / max(sigma, SIGMA_MIN)."""

        def forward(self, hidden_states, timestep, encoder_hidden_states, *args,
                    return_dict: bool = True, **kwargs):
            x0 = super().forward(hidden_states, timestep, encoder_hidden_states, *args,
                                 return_dict=False, **kwargs)[0]
            sigma = (timestep.float() / 1000).clamp(min=SIGMA_MIN).view(-1, 1, 1, 1, 1)
            v = ((hidden_states.float() - x0.float()) / sigma).to(x0.dtype)
            return Transformer2DModelOutput(sample=v) if return_dict else (v,)

    return XPredWanTransformer


XPredWanTransformer = _xpred_class()


class PositionedPatchEmbedding(nn.Conv3d):
    """Wan's patch embedding (the same Conv3d, same state-dict names) plus a learned absolute
    position term, factorised over (frame, row, column): pos_t[:, t] + pos_h[:, h] + pos_w[:, w].

    Wan's transformer knows positions only through RoPE, i.e. relative ones. Real Wan latents
    carry absolute cues from its VAE's zero-padded convolutions; the patchify VAE carries none,
    so from pure noise (sigma 1, where the sampler starts) every token of the toy model looked
    alike and its x_0 estimate could not put the shape earlier on the left and later on the
    right: run 4 learned colour, but its estimates moved the same with the caption's direction
    word swapped (benchmarks/toywan/toywan_direction.py). Zero as constructed (`add_positions` draws a
    new model's). 128 x (8 + 16 + 16) values."""

    MAX = (8, 16, 16)

    @classmethod
    def wrap(cls, conv: nn.Conv3d) -> PositionedPatchEmbedding:
        new = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride)
        new.load_state_dict(conv.state_dict(), strict=False)
        return new

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        c = self.out_channels
        self.pos_t, self.pos_h, self.pos_w = (nn.Parameter(torch.zeros(c, n)) for n in self.MAX)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        _, c, t, h, w = y.shape
        if t > self.MAX[0] or h > self.MAX[1] or w > self.MAX[2]:
            raise UserError(f"ToyWan positions cover {self.MAX} latent patches, got {(t, h, w)}")
        pos = (self.pos_t[:, :t].view(c, t, 1, 1) + self.pos_h[:, :h].view(c, 1, h, 1)
               + self.pos_w[:, :w].view(c, 1, 1, w))
        return y + pos.to(y.dtype)


# Std of each factor of a new model's position term (pos_t, pos_h, pos_w drawn N(0, std^2)):
# the sum is then ~0.5 per channel, as loud as the patch embedding of pure noise (~0.58 per
# channel at init). Zero-initialised, the term stayed at 7-14% of that noise after ~1000 CPU
# steps at sigma >= 0.98, too faint to tell positions apart where the input is all noise.
POSITION_INIT_STD = 0.3


def add_positions(transformer, std: float = 0.0) -> None:
    """Wrap the patch embedding; `std` > 0 draws the position term (a new model), 0 leaves it
    at zero (a model fine-tuned from weights without positions starts where they were)."""
    transformer.patch_embedding = PositionedPatchEmbedding.wrap(transformer.patch_embedding)
    if std:
        with torch.no_grad():
            for p in (transformer.patch_embedding.pos_t, transformer.patch_embedding.pos_h,
                      transformer.patch_embedding.pos_w):
                p.normal_(0.0, std)


class CaptionEmbedding(nn.Module):
    """Caption -> (1, L, TEXT_DIM): one learned row per (position, word); padding stays zero.

    A row per (position, word) rather than a word row plus a position row: the transformer
    reads the caption through one head of cross-attention, and a head that attends to all
    words at once gets the sum of their rows. With word + position rows that sum is the same
    for "a red disk ... over blue stripes" and "a blue disk ... over red stripes"; with a row
    per (position, word) it still says which colour is the shape's."""

    def __init__(self, dim: int = TEXT_DIM, length: int = toyvideo.CAPTION_LENGTH) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(length, len(toyvideo.VOCAB), dim))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        slots = torch.arange(ids.shape[-1], device=ids.device)
        return self.table[slots, ids] * (ids != 0).unsqueeze(-1)

    def ids(self, captions: list[str]) -> torch.Tensor:
        return torch.tensor([toyvideo.tokenize(c, self.table.shape[0]) for c in captions])

    @torch.no_grad()
    def encode(self, prompt: str) -> torch.Tensor:
        return self(self.ids([prompt]).to(self.table.device)).float().cpu()


def state_dict(transformer, text: CaptionEmbedding) -> dict[str, torch.Tensor]:
    out = {f"transformer.{k}": v for k, v in transformer.state_dict().items()}
    out.update({f"text.{k}": v for k, v in text.state_dict().items()})
    return {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in out.items()}


def read(path: Path = WEIGHTS) -> tuple[dict, dict[str, torch.Tensor]]:
    """(config, tensors) of a ToyWan safetensors file."""
    from safetensors import safe_open

    if not Path(path).is_file():
        raise UserError(f"{path}: no such weights file")
    with safe_open(str(path), "pt") as f:
        meta = f.metadata() or {}
        if "config" not in meta:
            raise UserError(f"{path}: not a ToyWan weights file (no config in its metadata)")
        return json.loads(meta["config"]), {k: f.get_tensor(k) for k in f.keys()}


POSITION_KEYS = tuple(f"patch_embedding.pos_{a}" for a in "thw")


def build_pipeline(config: dict, tensors: dict[str, torch.Tensor] | None = None,
                   new_positions: bool = False, position_std: float = POSITION_INIT_STD):
    """(WanPipeline, CaptionEmbedding) in float32; `tensors` None keeps the seeded init (its
    position term drawn with `position_std`). `new_positions`: tensors from a model without
    positions may leave those at zero (fine-tuning)."""
    from diffusers import WanPipeline, WanTransformer3DModel

    cls = XPredWanTransformer if config.get("prediction") == "x0" else WanTransformer3DModel
    transformer = cls(**config["transformer"])
    if config.get("positions"):
        add_positions(transformer, position_std if tensors is None else 0.0)
    text = CaptionEmbedding()
    if tensors is not None:
        def part(prefix):
            return {k[len(prefix):]: v.float() for k, v in tensors.items() if k.startswith(prefix)}
        missing, unexpected = transformer.load_state_dict(part("transformer."), strict=False)
        allowed = set(POSITION_KEYS) if new_positions else set()
        if unexpected or set(missing) - allowed:
            raise UserError(f"weights do not fit the config: missing {missing}, unexpected {unexpected}")
        text.load_state_dict(part("text."), strict=True)
    vae = PatchifyVAE(**config["vae"])
    pipe = WanPipeline(tokenizer=None, text_encoder=None, vae=vae, transformer=transformer,
                       transformer_2=None, scheduler=scheduler(config["shift"]))
    pipe.set_progress_bar_config(disable=True)
    return pipe, text


def load_toywan(device: torch.device, dtype: torch.dtype, path: Path = WEIGHTS):
    config, tensors = read(path)
    pipe, text = build_pipeline(config, tensors)
    return as_loaded(pipe, text, device, dtype, random_weights=False,
                     weights=Path(path).name, trained=config.get("training", {}))


def as_loaded(pipe, text: CaptionEmbedding, device: torch.device, dtype: torch.dtype,
              random_weights: bool, **extra):
    """The `LoadedModel` that `vcbench generate` and the check use, at the trained size."""
    from vcbench.pipelines.loaded import ClipSettings, LoadedModel
    from vcbench.pipelines.wan import call_wan

    pipe.to(device)
    text.to(device)
    if dtype != torch.float32:
        pipe.to(dtype=dtype)
    # The size it was trained at; 20 steps of UniPC.
    defaults = ClipSettings(steps=20, frames=toyvideo.FRAMES, height=toyvideo.SIZE, width=toyvideo.SIZE)
    return LoadedModel("tiny-wan", pipe, defaults, call_wan, device, dtype,
                       random_weights=random_weights, extra={"conditioning": text.encode, **extra})
