"""`vcbench capture`: run a pipeline once (BF16 attention) and save the post-RoPE q, k, v of
chosen self-attention layers at chosen steps, one safetensors file per (layer, step), with
keys q, k, v (B, H, N, D) and grid (T, H, W): what `timeit --tensors` and `analyze --tensors`
read. Only the first transformer call of a step (the conditional pass) is saved."""

from __future__ import annotations

from pathlib import Path

import torch

from vcbench.errors import UserError
from vcbench.kernels import REFERENCE_METHOD
from vcbench.pipelines.loaded import ClipSettings
from vcbench.pipelines.patch import patch
from vcbench.runs import atomic_write_bytes


def run_capture(model_name: str, model_path: Path | None, prompt: str, seed: int, layers: list[int],
                steps_at: list[int], out: Path, settings: dict, device: str | None = None) -> list[Path]:
    from safetensors.torch import save

    from vcbench.pipelines import registry

    entry = registry.check_request(model_name, model_path, device)  # all before loading
    d = entry.defaults
    s = ClipSettings(**{k: getattr(d, k) if settings.get(k) is None else settings[k]
                        for k in ("steps", "frames", "height", "width")})
    registry.check_settings(entry, s)
    bad = [t for t in steps_at if not 0 <= t < s.steps]
    if bad:
        raise UserError(f"--at-steps {bad[0]} is outside 0..{s.steps - 1}")
    model = registry.load_model(model_name, model_path, device)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    names: list[str] = []

    def observe(name, step, pass_index, q, k, v, grid):
        if name not in names:
            names.append(name)
        if pass_index or step not in steps_at or names.index(name) not in layers:
            return
        tensors = {"q": q, "k": k, "v": v}
        tensors = {key: t.detach().to("cpu", torch.bfloat16).contiguous() for key, t in tensors.items()}
        if grid is not None:
            tensors["grid"] = torch.tensor(grid, dtype=torch.int64)
        path = out / f"{name}.step{step:03d}.safetensors"
        atomic_write_bytes(path, save(tensors, metadata={"model": model.name, "layer": name,
                                                         "step": str(step), "prompt": prompt,
                                                         "seed": str(seed),
                                                         "random_weights": str(model.random_weights)}))
        written.append(path)

    with patch(model.pipe, REFERENCE_METHOD) as p:
        p.observe = observe
        model.generate(prompt, seed, s)
    if not written:
        raise UserError(f"no attention call matched --layers {layers} (the model has {len(names)} "
                        "self-attention layers)")
    return written
