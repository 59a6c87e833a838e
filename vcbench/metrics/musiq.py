"""MUSIQ (Ke et al., ICCV 2021) as pyiqa implements it, for VBench's imaging quality.

A faithful re-implementation of pyiqa's `archs/musiq_arch.py` and `data/multiscale_trans_util.py`
(identical from pyiqa 0.1.10 to 0.1.16 but for formatting), with the parameter names of pyiqa's
released checkpoints, so `musiq_spaq_ckpt-358bb6af.pth` loads with strict=True. pyiqa itself is
not imported: its package import pulls a large dependency tree.

An image becomes one token sequence over three scales (scale ids 0, 1, 2): the image resized
(bicubic, aspect kept) to a longer side of 224 and of 384, each zero-padded to a fixed 7x7 and
12x12 patches, then the image at its own resolution, all its 32x32 patches. Every token carries
a hashed spatial position (its row and column mapped onto a 10x10 grid) and its scale id. Each
patch goes through a small ResNet stem (weight-standardised convolutions, GroupNorm), is
flattened into a linear embedding, and a 14-layer transformer reads the sequence; a linear head
on the CLS token gives the quality score (SPAQ: roughly 0-100).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

PATCH = 32
HASH_GRID = 10
LONGER_SIDES = (224, 384)  # pyiqa sorts them; the scale id is the index in this order
ROOT_DIM = 64


def same_pad(x: torch.Tensor, kernel: int, stride: int) -> torch.Tensor:
    """TensorFlow 'SAME' zero padding (pyiqa's exact_padding_2d): the smaller half goes first."""
    h, w = x.shape[-2:]
    pad_h = (math.ceil(h / stride) - 1) * stride + kernel - h
    pad_w = (math.ceil(w / stride) - 1) * stride + kernel - w
    return F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2))


def hashed_positions(rows: int, cols: int, grid: int = HASH_GRID) -> torch.Tensor:
    """Row-major (rows*cols,) indices into a grid x grid table: pyiqa's nearest-neighbour
    interpolation of arange(grid) to `rows` and to `cols` (kept as F.interpolate, its rounding)."""
    table = torch.arange(grid, dtype=torch.float32).reshape(1, 1, grid)
    pos_h = F.interpolate(table, rows, mode="nearest").reshape(rows, 1).long()
    pos_w = F.interpolate(table, cols, mode="nearest").reshape(1, cols).long()
    return (pos_h * grid + pos_w).reshape(-1)


def _scale_tokens(image: torch.Tensor, scale_id: int, max_len: int | None):
    """(N, 3, h, w) -> patches (N, L, 3*32*32), positions (L,), scale ids (L,), mask (L,).
    max_len pads with zero patches (position 0, scale 0, mask 0), as pyiqa does."""
    h, w = image.shape[-2:]
    patches = F.unfold(same_pad(image, PATCH, PATCH), PATCH, stride=PATCH).transpose(1, 2)
    rows, cols = math.ceil(h / PATCH), math.ceil(w / PATCH)
    positions = hashed_positions(rows, cols)
    scales = torch.full_like(positions, scale_id)
    mask = torch.ones_like(positions)
    if max_len is not None:
        pad = max_len - positions.shape[0]  # never negative: the longer side is max_len's side
        patches = F.pad(patches, (0, 0, 0, pad))
        positions, scales, mask = (F.pad(t, (0, pad)) for t in (positions, scales, mask))
    return patches, positions, scales, mask


def multiscale_tokens(image: torch.Tensor):
    """pyiqa's get_multiscale_patches(max_seq_len_from_original_res=-1) on (N, 3, H, W) in [-1, 1]:
    the 224 and 384 scales (each padded to ceil(side/32)^2 tokens), then the original resolution."""
    h, w = image.shape[-2:]
    parts = []
    for scale_id, longer in enumerate(LONGER_SIDES):
        ratio = longer / max(h, w)
        # round() is Python's (half to even), as in pyiqa; bicubic without antialias.
        size = (round(h * ratio), round(w * ratio))
        resized = F.interpolate(image, size, mode="bicubic", align_corners=False)
        parts.append(_scale_tokens(resized, scale_id, math.ceil(longer / PATCH) ** 2))
    parts.append(_scale_tokens(image, len(LONGER_SIDES), None))
    patches = torch.cat([p[0] for p in parts], dim=1)
    positions, scales, mask = (torch.cat([p[i] for p in parts]).to(image.device) for i in (1, 2, 3))
    return patches, positions, scales, mask


class StdConv(nn.Conv2d):
    """Weight-standardised convolution with 'SAME' padding (torch.std: unbiased, as pyiqa)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = same_pad(x, self.kernel_size[0], self.stride[0])
        w = self.weight - self.weight.mean((1, 2, 3), keepdim=True)
        w = w / (w.std((1, 2, 3), keepdim=True) + 1e-5)
        return F.conv2d(x, w, self.bias, self.stride)


class Bottleneck(nn.Module):
    def __init__(self, inplanes: int, outplanes: int):
        super().__init__()
        self.conv1 = StdConv(inplanes, inplanes, 1, 1, bias=False)
        self.gn1 = nn.GroupNorm(32, inplanes, eps=1e-4)
        self.conv2 = StdConv(inplanes, inplanes, 3, 1, bias=False)
        self.gn2 = nn.GroupNorm(32, inplanes, eps=1e-4)
        self.conv3 = StdConv(inplanes, outplanes, 1, 1, bias=False)
        self.gn3 = nn.GroupNorm(32, outplanes, eps=1e-4)
        self.conv_proj = StdConv(inplanes, outplanes, 1, 1, bias=False)  # inplanes != outplanes
        self.gn_proj = nn.GroupNorm(32, outplanes, eps=1e-4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = self.gn_proj(self.conv_proj(x))
        x = F.relu(self.gn1(self.conv1(x)))
        x = F.relu(self.gn2(self.conv2(x)))
        return F.relu(self.gn3(self.conv3(x)) + identity)


class MultiHeadAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(dim, dim) for _ in range(3))
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = (proj(x).reshape(b, n, self.heads, c // self.heads).transpose(1, 2)
                   for proj in (self.query, self.key, self.value))
        attn = (q @ k.transpose(-2, -1)) * (c // self.heads) ** -0.5
        # pyiqa masks a (query, key) pair when either is padding, with -1e3 (not -inf): kept as is.
        pair = (mask[:, None, :, None] * mask[:, None, None, :]) == 0
        attn = attn.masked_fill(pair, -1e3).softmax(dim=-1)
        return self.out((attn @ v).transpose(1, 2).reshape(b, n, c))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, mlp_dim: int, heads: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attention = MultiHeadAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(dim, mlp_dim)
        self.mlp.fc2 = nn.Linear(mlp_dim, dim)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x), mask)
        return x + self.mlp.fc2(F.gelu(self.mlp.fc1(self.norm2(x))))


class TransformerEncoder(nn.Module):
    def __init__(self, dim: int, mlp_dim: int, heads: int, layers: int, scales: int):
        super().__init__()
        self.posembed_input = nn.Module()
        self.posembed_input.position_emb = nn.Parameter(torch.zeros(1, HASH_GRID * HASH_GRID, dim))
        self.scaleembed_input = nn.Module()
        self.scaleembed_input.scale_emb = nn.Parameter(torch.zeros(scales, dim))
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.encoder_norm = nn.LayerNorm(dim, eps=1e-6)
        self.transformer = nn.ModuleDict({f"encoderblock_{i}": TransformerBlock(dim, mlp_dim, heads)
                                          for i in range(layers)})

    def forward(self, x, positions, scales, mask):
        x = x + self.posembed_input.position_emb[0][positions] + self.scaleembed_input.scale_emb[scales]
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
        mask = torch.cat([torch.ones_like(mask[:, :1]), mask], dim=1)
        for block in self.transformer.values():
            x = block(x, mask)
        return self.encoder_norm(x)


class Musiq(nn.Module):
    """pyiqa's MUSIQ(num_class=1) as VBench builds it: (N, 3, H, W) in [0, 1] -> (N,) scores."""

    def __init__(self, hidden: int = 384, mlp_dim: int = 1152, heads: int = 6, layers: int = 14):
        super().__init__()
        self.conv_root = StdConv(3, ROOT_DIM, 7, 2, bias=False)
        self.gn_root = nn.GroupNorm(32, ROOT_DIM, eps=1e-6)
        self.block1 = Bottleneck(ROOT_DIM, ROOT_DIM * 4)
        self.embedding = nn.Linear(ROOT_DIM * 4 * (PATCH // 4) ** 2, hidden)
        self.transformer_encoder = TransformerEncoder(hidden, mlp_dim, heads, layers, len(LONGER_SIDES) + 1)
        self.head = nn.Linear(hidden, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        patches, positions, scales, mask = multiscale_tokens((images - 0.5) * 2)  # [-1, 1] as MUSIQ
        n, length, _ = patches.shape
        x = patches.reshape(n * length, 3, PATCH, PATCH)
        x = F.relu(self.gn_root(self.conv_root(x)))
        x = F.max_pool2d(same_pad(x, 3, 2), 3, 2)  # zero padding after the ReLU, as pyiqa's
        x = self.block1(x).permute(0, 2, 3, 1)  # channels last: the TensorFlow flattening order
        x = self.embedding(x.reshape(n, length, -1))
        batch = lambda t: t.expand(n, -1)  # noqa: E731  the same token layout for every image
        x = self.transformer_encoder(x, batch(positions), batch(scales), batch(mask))
        # num_class=1: pyiqa's dist_to_mos multiplies by 1 and its crop mean is over one crop.
        return self.head(x[:, 0])[:, 0]
