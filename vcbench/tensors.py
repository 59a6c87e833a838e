"""Attention tensors on disk: safetensors files with keys q, k, v (B, H, N, D) and an optional
grid (T, H, W). The format `vcbench capture` writes and `analyze --tensors` / `timeit --tensors`
read. safetensors holds only arrays, so reading an untrusted file runs no code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from vcbench.errors import UserError


@dataclass(frozen=True)
class AttentionTensors:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grid: tuple[int, int, int] | None = None
    source: str = ""


def load_tensors(path: str | Path) -> AttentionTensors:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise UserError(f"tensors file {path} does not exist")
    try:
        data = load_file(path)
    except (SafetensorError, OSError, ValueError) as e:
        raise UserError(f"{path}: not a readable safetensors file ({e})") from None
    missing = [key for key in ("q", "k", "v") if key not in data]
    if missing:
        raise UserError(f"{path}: missing key(s) {', '.join(missing)} (expected q, k, v and optional grid)")
    q, k, v = data["q"], data["k"], data["v"]
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dim() != 4:
            raise UserError(f"{path}: {name} must be (B, H, N, D), got shape {tuple(x.shape)}")
    if not (q.shape == k.shape == v.shape):
        raise UserError(f"{path}: q, k, v shapes differ: {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    grid = None
    if "grid" in data:
        g = data["grid"].flatten().tolist()
        if len(g) != 3 or any(int(x) < 1 for x in g):
            raise UserError(f"{path}: grid must hold three positive integers (T, H, W), got {g}")
        grid = tuple(int(x) for x in g)
        if grid[0] * grid[1] * grid[2] > q.shape[-2]:
            raise UserError(f"{path}: grid {grid} has more tokens than the sequence ({q.shape[-2]})")
    return AttentionTensors(q, k, v, grid, str(path))


def save_tensors(path: str | Path, t: AttentionTensors) -> None:
    from safetensors.torch import save

    from vcbench.runs import atomic_write_bytes

    data = {"q": t.q.contiguous(), "k": t.k.contiguous(), "v": t.v.contiguous()}
    if t.grid is not None:
        data["grid"] = torch.tensor(t.grid, dtype=torch.int64)
    atomic_write_bytes(path, save(data))
