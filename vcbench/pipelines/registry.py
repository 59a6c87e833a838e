"""Model names -> loaders. `tiny-wan` (trained weights shipped in the package) and
`tiny-wan-random` (a seeded random init, for tests) are built in; the others load a local
diffusers folder (`diffusers`: any text-to-video pipeline, by the folder's model_index.json).

Every real model loads from `--model-path` with `local_files_only=True` (nothing is fetched),
in bf16 on CUDA. The defaults are the paper's (appendix A); the CLI can override each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from vcbench.errors import UserError
from vcbench.pipelines.loaded import LoadedModel


@dataclass(frozen=True)
class ModelEntry:
    name: str
    summary: str
    load: Callable[[Path | None, torch.device, torch.dtype], LoadedModel]
    needs_path: bool = True
    takes_lora: bool = False  # load(path, device, dtype, lora_path)


def _tiny_wan(path, device, dtype):
    from vcbench.pipelines.toywan import load_toywan
    return load_toywan(device, dtype)


def _tiny_wan_random(path, device, dtype):
    from vcbench.pipelines.tiny import load_tiny_wan
    return load_tiny_wan(device, dtype)


def _wan22(path, device, dtype):
    from vcbench.pipelines.wan import load_wan22
    return load_wan22(path, device, dtype)


def _hunyuan15(path, device, dtype):
    from vcbench.pipelines.hunyuan import load_hunyuan15
    return load_hunyuan15(path, device, dtype)


def _minimax_h3(path, device, dtype, lora_path):
    from vcbench.pipelines.minimax import load_minimax_h3
    return load_minimax_h3(path, device, dtype, lora_path)


def _longcat(path, device, dtype):
    from vcbench.pipelines.longcat import load_longcat
    return load_longcat(path, device, dtype)


def _diffusers(path, device, dtype):
    from vcbench.pipelines.any_diffusers import load_diffusers
    return load_diffusers(path, device, dtype)


MODELS = {e.name: e for e in (
    ModelEntry("tiny-wan", "WanPipeline, one expert trained on ToyVideo (packaged, 1.9 MB), "
               "320 tokens (CPU demo)", _tiny_wan, needs_path=False),
    ModelEntry("tiny-wan-random", "WanPipeline, two random-weight experts, 768 tokens (tests)",
               _tiny_wan_random, needs_path=False),
    ModelEntry("wan22-t2v-a14b", "Wan2.2-T2V-A14B, diffusers WanPipeline", _wan22),
    ModelEntry("hunyuanvideo15", "HunyuanVideo-1.5 T2V, diffusers HunyuanVideo15Pipeline", _hunyuan15),
    ModelEntry("minimax-h3", "MiniMax-H3, diffusers modular pipeline (+ 8-step LoRA)", _minimax_h3,
               takes_lora=True),
    ModelEntry("longcat-video", "LongCat-Video through its upstream package", _longcat),
    ModelEntry("diffusers", "any local diffusers text-to-video pipeline with a transformer: the "
               "class its model_index.json names", _diffusers),
)}


def default_device_dtype(device: str | None = None) -> tuple[torch.device, torch.dtype]:
    """bf16 on CUDA; float32 on the CPU, where bf16 matmuls are slow and the methods emulate
    their own operand precision anyway."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return dev, (torch.bfloat16 if dev.type == "cuda" else torch.float32)


def load_model(name: str, path: str | Path | None = None, device: str | None = None,
               lora_path: str | Path | None = None) -> LoadedModel:
    entry = MODELS.get(name)
    if entry is None:
        raise UserError(f"unknown model {name!r} (known: {', '.join(MODELS)})")
    if entry.needs_path:
        if path is None:
            raise UserError(f"model {name} loads local weights: pass --model-path DIR")
        path = Path(path)
        if not path.is_dir():
            raise UserError(f"--model-path {path} is not a directory")
    dev, dtype = default_device_dtype(device)
    if entry.takes_lora:
        if lora_path is not None and not Path(lora_path).is_file():
            raise UserError(f"--lora-path {lora_path} is not a file")
        return entry.load(path, dev, dtype, Path(lora_path) if lora_path else None)
    if lora_path is not None:
        raise UserError(f"--lora-path applies to minimax-h3 only, not {name}")
    return entry.load(path, dev, dtype)
