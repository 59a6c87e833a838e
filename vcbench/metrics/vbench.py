"""VBench dimensions, computed as vbench 0.1.5 computes them, on the candidate clip alone.

We reimplement rather than import vbench: vbench 0.1.5 pins old numpy/transformers, loads DINO
through `torch.hub` from a cloned GitHub repo, and pulls MUSIQ from pyiqa with its own heavy
dependency tree. The code below follows vbench/subject_consistency.py and vbench/utils.py line
by line; docs/metrics.md says what was kept.

Weights are read from the user's VBench cache, laid out as VBench lays it out:
    $VBENCH_CACHE_DIR (default ~/.cache/vbench)/dino_model/dino_vitbase16_pretrain.pth
    $VBENCH_CACHE_DIR/pyiqa_model/musiq_spaq_ckpt-358bb6af.pth
A missing file is a one-line error naming it and where it was looked for; nothing is downloaded.

subject_consistency: DINO ViT-B/16 CLS features of every frame (shorter side resized to 224,
bilinear without antialias, ImageNet normalisation), L2-normalised; each frame after the first
scores the mean of max(0, cos) with the previous frame and with the first frame; the clip's
score is the mean over those frames.

imaging_quality: MUSIQ trained on SPAQ (pyiqa's architecture, re-implemented in musiq.py) on
every frame; a frame whose longer side exceeds 512 is first resized to a longer side of 512
(vbench's default 'longer' mode: bilinear without antialias on uint8, sizes truncated by int()),
then /255. The clip's score is the mean frame score / 100 (vbench divides its average by 100).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from vcbench.errors import UserError
from vcbench.metrics.musiq import Musiq

DINO_FILE = Path("dino_model") / "dino_vitbase16_pretrain.pth"
MUSIQ_FILE = Path("pyiqa_model") / "musiq_spaq_ckpt-358bb6af.pth"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def vbench_cache_dir(override: Path | None = None) -> Path:
    if override is not None:
        return Path(override)
    return Path(os.environ.get("VBENCH_CACHE_DIR") or Path.home() / ".cache" / "vbench")


def weight_file(relative: Path, cache: Path | None) -> Path:
    root = vbench_cache_dir(cache)
    path = root / relative
    if not path.is_file():
        raise UserError(f"VBench weights {relative} not found in {root} (set VBENCH_CACHE_DIR or "
                        f"--vbench-cache to the folder VBench downloads into)")
    return path


def build_vbench_metric(name: str, device: str, cache: Path | None):
    if name == "subject_consistency":
        return SubjectConsistency(device, cache)
    if name == "imaging_quality":
        return ImagingQuality(device, cache)
    raise UserError(f"unknown VBench dimension {name!r}")


def load_weights(model: nn.Module, relative: Path, cache: Path | None, what: str) -> nn.Module:
    """A state dict from the VBench cache into `model` with strict=True; one-line errors."""
    path = weight_file(relative, cache)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UserError(f"{path}: cannot read as a torch state dict ({type(e).__name__})") from None
    # pyiqa's loader strips a DataParallel "module." prefix; do the same.
    state = {k.removeprefix("module."): v for k, v in state.items()} if isinstance(state, dict) else state
    try:
        model.load_state_dict(state, strict=True)
    except (RuntimeError, TypeError, AttributeError) as e:
        raise UserError(f"{path} is not {what} ({str(e).splitlines()[0]})") from None
    return model.eval()


class SubjectConsistency:
    """`SubjectConsistency(device)(frames) -> float` for (T, H, W, 3) uint8 frames."""

    def __init__(self, device: str = "cpu", cache: Path | None = None, frames_per_batch: int = 8):
        self.model = load_weights(DinoViTB16(), DINO_FILE, cache, "DINO ViT-B/16").to(device)
        self.device = torch.device(device)
        self.frames_per_batch = frames_per_batch

    @torch.inference_mode()
    def features(self, frames: torch.Tensor) -> torch.Tensor:
        from torchvision.transforms.functional import normalize, resize

        if frames.shape[-1] != 3 or frames.dtype != torch.uint8:
            raise UserError("subject_consistency needs 8-bit RGB frames")
        out = []
        for start in range(0, frames.shape[0], self.frames_per_batch):
            # vbench.utils.dino_transform(224): Resize(224, antialias=False) on uint8 frames,
            # then /255 and ImageNet normalisation. Frames are independent, so batching is exact.
            x = frames[start:start + self.frames_per_batch].to(self.device).permute(0, 3, 1, 2)
            x = resize(x, 224, antialias=False).float().div(255.0)
            x = normalize(x, IMAGENET_MEAN, IMAGENET_STD)
            out.append(F.normalize(self.model(x), dim=-1, p=2))
        return torch.cat(out)

    def __call__(self, frames: torch.Tensor) -> float:
        return subject_consistency_from_features(self.features(frames))


def subject_consistency_from_features(features: torch.Tensor) -> float:
    """vbench.subject_consistency's per-video score from (T, D) L2-normalised features."""
    if features.shape[0] < 2:
        raise UserError("subject_consistency needs at least 2 frames")
    total = 0.0
    for i in range(1, features.shape[0]):
        sim_pre = max(0.0, F.cosine_similarity(features[i - 1:i], features[i:i + 1]).item())
        sim_fir = max(0.0, F.cosine_similarity(features[0:1], features[i:i + 1]).item())
        total += (sim_pre + sim_fir) / 2
    return total / (features.shape[0] - 1)


class ImagingQuality:
    """`ImagingQuality(device)(frames) -> float` for (T, H, W, 3) uint8 frames: mean MUSIQ / 100."""

    def __init__(self, device: str = "cpu", cache: Path | None = None):
        self.model = load_weights(Musiq(), MUSIQ_FILE, cache, "pyiqa's MUSIQ (num_class=1)").to(device)
        self.device = torch.device(device)
        # On a CPU one frame at a time is fastest (measured on 2 shared cores) and bit-identical to
        # vbench's frame-by-frame loop; a GPU wants a batch.
        self.frames_per_batch = 1 if self.device.type == "cpu" else 16

    @torch.inference_mode()
    def frame_scores(self, frames: torch.Tensor) -> torch.Tensor:
        """(T,) float64 MUSIQ scores (SPAQ scale, about 0-100), one per frame."""
        if frames.shape[-1] != 3 or frames.dtype != torch.uint8:
            raise UserError("imaging_quality needs 8-bit RGB frames")
        images = vbench_longer_resize(frames.cpu().permute(0, 3, 1, 2)).float() / 255.0
        out = []
        # Frames are scored independently (vbench feeds one at a time); a batch only shares the
        # token layout, since all frames of a clip have one size.
        for start in range(0, images.shape[0], self.frames_per_batch):
            out.append(self.model(images[start:start + self.frames_per_batch].to(self.device)).double().cpu())
        return torch.cat(out)

    def __call__(self, frames: torch.Tensor) -> float:
        return float(self.frame_scores(frames).mean()) / 100.0


def vbench_longer_resize(images: torch.Tensor, limit: int = 512) -> torch.Tensor:
    """vbench.imaging_quality.transform(mode='longer') without its /255, on (T, 3, H, W) uint8.
    Resized on the CPU, where vbench resizes (uint8 rounding may differ on a GPU)."""
    from torchvision.transforms.functional import resize

    _, _, h, w = images.shape
    if max(h, w) <= limit:
        return images
    scale = limit / max(h, w)  # vbench's arithmetic, int() truncation included
    return resize(images, [int(scale * h), int(scale * w)], antialias=False)


class DinoViTB16(nn.Module):
    """DINO's vit_base(patch_size=16, num_classes=0): same parameter names as the released
    checkpoint; returns the final-norm CLS token."""

    def __init__(self, dim: int = 768, depth: int = 12, heads: int = 12, patch: int = 16):
        super().__init__()
        self.patch = patch
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(3, dim, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, (224 // patch) ** 2 + 1, dim))
        self.blocks = nn.ModuleList(_Block(dim, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, _, height, width = x.shape
        tokens = self.patch_embed.proj(x).flatten(2).transpose(1, 2)
        tokens = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), tokens), dim=1)
        tokens = tokens + self._position_embedding(tokens.shape[1] - 1, height, width)
        for block in self.blocks:
            tokens = block(tokens)
        return self.norm(tokens)[:, 0]

    def _position_embedding(self, patches: int, height: int, width: int) -> torch.Tensor:
        """DINO's interpolate_pos_encoding, including its +0.1 against rounding."""
        n = self.pos_embed.shape[1] - 1
        if patches == n and height == width:
            return self.pos_embed
        side = int(math.sqrt(n))
        rows, cols = height // self.patch + 0.1, width // self.patch + 0.1
        grid = self.pos_embed[:, 1:].reshape(1, side, side, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, scale_factor=(rows / side, cols / side), mode="bicubic")
        grid = grid.permute(0, 2, 3, 1).reshape(1, -1, self.pos_embed.shape[-1])
        return torch.cat((self.pos_embed[:, :1], grid), dim=1)


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(dim, 3 * dim)
        self.attn.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(dim, 4 * dim)
        self.mlp.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        qkv = self.attn.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        x = x + self.attn.proj(attended.transpose(1, 2).reshape(b, n, c))
        return x + self.mlp.fc2(F.gelu(self.mlp.fc1(self.norm2(x))))
