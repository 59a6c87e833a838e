"""Model names -> loaders: `MODELS`, a registry like the methods' (vcbench/registry.py), so a
plugin adds a model as the built-ins are added here. `tiny-wan` (trained weights shipped in the
package) and `tiny-wan-random` (a seeded random init, for tests) are built in; the others load a
local diffusers folder (`diffusers`: any text-to-video pipeline, by the folder's
model_index.json).

Every real model loads from `--model-path` with `local_files_only=True` (nothing is fetched),
in bf16 on CUDA. The defaults are the paper's (appendix A); the CLI can override each.

An entry says, without loading anything, what a request must satisfy: its clip defaults, the
clip settings it accepts (`check`), the folder layout it loads (`check_folder`), whether it
takes a folder or a LoRA. `check_request` applies all of them, so a mistake is one line before
a model loads or a run folder is made.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from vcbench.errors import UserError
from vcbench.pipelines import longcat
from vcbench.pipelines.hunyuan import HUNYUAN15_DEFAULTS, check_hunyuan15
from vcbench.pipelines.loaded import ClipSettings, LoadedModel
from vcbench.pipelines.minimax import MINIMAX_DEFAULTS, check_minimax
from vcbench.pipelines.tiny import TINY_WAN_RANDOM_DEFAULTS
from vcbench.pipelines.toyvideo import FRAMES as TOY_FRAMES
from vcbench.pipelines.toyvideo import SIZE as TOY_SIZE
from vcbench.pipelines.wan import WAN22_DEFAULTS, check_wan
from vcbench.registry import Registry


@dataclass(frozen=True)
class ModelEntry:
    """`load(path, device, dtype[, lora_path]) -> LoadedModel`; `needs_path`: it reads
    `--model-path DIR`."""

    name: str
    summary: str
    load: Callable[[Path | None, torch.device, torch.dtype], LoadedModel]
    # the clip a request gets for each setting it leaves out; None: the loaded pipeline's own
    defaults: ClipSettings | None
    needs_path: bool = True  # False: built in, and a --model-path would be ignored: refused
    takes_lora: bool = False  # load(path, device, dtype, lora_path)
    check: Callable[[ClipSettings], None] | None = None  # clip settings it refuses: UserError
    check_folder: Callable[[Path], None] | None = None  # the --model-path layout it loads


def diffusers_folder(*needed: str, index: str = "model_index.json",
                     components: bool = True) -> Callable[[Path], None]:
    """A check of a local diffusers folder before it loads: its index file is there, and (with
    `components`) a subfolder for each component the index names, and for each of `needed`."""
    def check(path: Path) -> None:
        index_path = path / index
        if not index_path.is_file():
            raise UserError(f"--model-path {path}: no {index} (a local diffusers folder of the "
                            "model is expected)")
        if not components:
            return
        try:
            listed = json.loads(index_path.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"{index_path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        named = {k for k, v in listed.items()
                 if not k.startswith("_") and isinstance(v, list) and v and v[0] is not None}
        missing = sorted((named | set(needed)) - {d.name for d in path.iterdir() if d.is_dir()})
        if missing:
            raise UserError(f"--model-path {path}: missing {', '.join(m + '/' for m in missing)} "
                            f"(the subfolders {index} names and the loader needs)")
        from vcbench.pipelines.any_diffusers import check_layout

        check_layout(path)  # each component's config and weights, as loading reads them
    return check


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


def check_diffusers_folder(path: Path) -> None:
    """`--model diffusers`: the folder's layout, and the class its index names, before loading."""
    from vcbench.pipelines.any_diffusers import check_layout, pipeline_class

    pipeline_class(check_layout(path), path)


def _diffusers(path, device, dtype):
    from vcbench.pipelines.any_diffusers import load_diffusers
    return load_diffusers(path, device, dtype)


MODELS: Registry[ModelEntry] = Registry("model", "vcbench.models")
MODELS.register_builtins((
    ModelEntry("tiny-wan", "WanPipeline, one expert trained on ToyVideo (packaged, 1.9 MB), "
               "320 tokens (CPU demo)", _tiny_wan,
               ClipSettings(steps=20, frames=TOY_FRAMES, height=TOY_SIZE, width=TOY_SIZE),
               needs_path=False, check=check_wan),
    ModelEntry("tiny-wan-random", "WanPipeline, two random-weight experts, 768 tokens (tests)",
               _tiny_wan_random, TINY_WAN_RANDOM_DEFAULTS, needs_path=False, check=check_wan),
    ModelEntry("wan22-t2v-a14b", "Wan2.2-T2V-A14B, diffusers WanPipeline", _wan22,
               WAN22_DEFAULTS, check=check_wan,
               check_folder=diffusers_folder("transformer", "transformer_2", "vae")),
    ModelEntry("hunyuanvideo15", "HunyuanVideo-1.5 T2V, diffusers HunyuanVideo15Pipeline",
               _hunyuan15, HUNYUAN15_DEFAULTS, check=check_hunyuan15,
               check_folder=diffusers_folder("transformer", "vae")),
    ModelEntry("minimax-h3", "MiniMax-H3, diffusers modular pipeline (+ 8-step LoRA)", _minimax_h3,
               MINIMAX_DEFAULTS, takes_lora=True, check=check_minimax,
               check_folder=diffusers_folder(index="modular_model_index.json", components=False)),
    ModelEntry("longcat-video", "LongCat-Video through its upstream package", _longcat,
               longcat.LONGCAT_DEFAULTS, check=longcat.check_longcat,
               check_folder=longcat.check_folder),
    ModelEntry("diffusers", "any local diffusers text-to-video pipeline with a transformer: the "
               "class its model_index.json names", _diffusers, None,
               check_folder=check_diffusers_folder),
))


def default_device_dtype(device: str | None = None) -> tuple[torch.device, torch.dtype]:
    """bf16 on CUDA; float32 on the CPU, where bf16 matmuls are slow and the methods emulate
    their own operand precision anyway."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return dev, (torch.bfloat16 if dev.type == "cuda" else torch.float32)


def check_device(device: str | None) -> None:
    """--device names a device this machine has (None: cuda if present, else cpu)."""
    if device is None:
        return
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserError(f"--device {device!r} is not a device (cpu, cuda, cuda:1, ...)") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {device}: no CUDA GPU is available here (use --device cpu)")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UserError(f"--device {device}: this machine has {torch.cuda.device_count()} "
                            "CUDA GPU(s), numbered from 0")
    elif dev.type != "cpu":
        raise UserError(f"--device {device}: vcbench runs on cpu or cuda")


def check_request(name: str, path: str | Path | None = None, device: str | None = None,
                  lora_path: str | Path | None = None) -> ModelEntry:
    """Everything `load_model` would refuse, found without loading anything."""
    entry = get_model(name)
    if entry.needs_path:
        if path is None:
            raise UserError(f"model {name} loads local weights: pass --model-path DIR")
        path = Path(path)
        if not path.is_dir():
            raise UserError(f"--model-path {path} is not a directory")
        if entry.check_folder is not None:
            entry.check_folder(path)
    elif path is not None:
        raise UserError(f"model {name} is built in and loads no folder: drop --model-path")
    if lora_path is not None:
        if not entry.takes_lora:
            takers = ", ".join(e.name for e in MODELS.values() if e.takes_lora)
            raise UserError(f"model {name} takes no --lora-path (only {takers} does)")
        if not Path(lora_path).is_file():
            raise UserError(f"--lora-path {lora_path} is not a file")
    check_device(device)
    return entry


def get_model(name: str) -> ModelEntry:
    return MODELS.get(name)  # unknown: one line naming the known models


def check_settings(entry: ModelEntry, settings: ClipSettings | None, given=None) -> None:
    """Steps, frames and sizes of at least 1, and what the model itself accepts. With
    `settings` None (a model whose defaults come with its folder), the values `given` sets."""
    for key in ("steps", "frames", "height", "width"):
        value = getattr(settings if settings is not None else given, key)
        if value is not None and value < 1:
            raise UserError(f"--{key} must be at least 1, got {value}")
    if entry.check is not None and settings is not None:
        entry.check(settings)



def load_model(name: str, path: str | Path | None = None, device: str | None = None,
               lora_path: str | Path | None = None) -> LoadedModel:
    entry = check_request(name, path, device, lora_path)
    path = Path(path) if path is not None else None
    dev, dtype = default_device_dtype(device)
    if entry.takes_lora:
        return entry.load(path, dev, dtype, Path(lora_path) if lora_path else None)
    return entry.load(path, dev, dtype)
