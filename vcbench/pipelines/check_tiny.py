"""The automatic check of a ToyWan model: does a clip show what its caption says?

For a toyvideo caption ("a red disk drifting right over blue stripes") a clip passes when
1. the named colour is in the frame: pixels within COLOUR_RADIUS (RGB in [0, 1]) of it cover
   at least MIN_AREA of the frame on at least PRESENT_FRAMES of the frames, and
2. it moves the named way: the mask centroid, averaged over the last quarter of the frames
   minus over the first quarter, goes at least MIN_TRAVEL of the frame side along the named
   axis with the named sign, and further along it than across it.
The background draws its colours dimmed (toyvideo.BACKGROUND_LEVEL), so texture never counts
as the shape. Ground-truth toyvideo clips travel toyvideo.TRAVEL (0.38-0.50) of the side; noise
does not move.

`check_model` generates one clip per held-out caption through the model's own generate call
(the bf16 method: no attention patch) and reports the fraction that pass.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from vcbench.pipelines import toyvideo

COLOUR_RADIUS = 0.35
MIN_AREA = 0.01
PRESENT_FRAMES = 0.8
MIN_TRAVEL = 0.15
REQUIRED = 0.7  # the bar for trained weights: 70% of 20 held-out captions


@dataclass(frozen=True)
class ClipCheck:
    caption: str
    colour_ok: bool
    direction_ok: bool
    dx: float  # centroid travel, fraction of the width (+ right)
    dy: float  # fraction of the height (+ down)

    @property
    def passed(self) -> bool:
        return self.colour_ok and self.direction_ok


def check_clip(frames: np.ndarray, caption: str) -> ClipCheck:
    """frames uint8 (F, H, W, 3) -> whether they show the caption's colour moving its way."""
    combo = toyvideo.parse_caption(caption)
    rgb = frames.astype(np.float32) / 255.0
    target = np.asarray(toyvideo.COLOURS[combo.colour], np.float32)
    mask = np.linalg.norm(rgb - target, axis=-1) < COLOUR_RADIUS  # (F, H, W)
    f, h, w = mask.shape
    present = mask.reshape(f, -1).mean(axis=1) >= MIN_AREA
    colour_ok = bool(present.mean() >= PRESENT_FRAMES)
    if present.sum() < 2:
        return ClipCheck(caption, colour_ok, False, 0.0, 0.0)

    ys, xs = np.mgrid[0:h, 0:w]
    idx = np.flatnonzero(present)
    cx = np.array([xs[mask[i]].mean() / w for i in idx])
    cy = np.array([ys[mask[i]].mean() / h for i in idx])
    q = max(1, len(idx) // 4)
    dx, dy = float(cx[-q:].mean() - cx[:q].mean()), float(cy[-q:].mean() - cy[:q].mean())
    sx, sy = toyvideo.DIRECTIONS[combo.direction]
    along, across = (dx * sx, dy) if sx else (dy * sy, dx)
    direction_ok = bool(along >= MIN_TRAVEL and along > abs(across))
    return ClipCheck(caption, colour_ok, direction_ok, dx, dy)


def check_model(model, captions: list[str] | None = None, seed: int = 0,
                clips: list | None = None) -> dict:
    """Generate each caption once (seed + i) at the model's defaults; the fraction that pass.
    `clips`, if given, gets each clip's frames (uint8 (F, H, W, 3))."""
    captions = captions or toyvideo.held_out_captions(20)
    rows = []
    for i, caption in enumerate(captions):
        frames = model.generate(caption, seed + i, model.defaults)
        rows.append(check_clip(frames, caption))
        if clips is not None:
            clips.append(frames)
    return {"score": sum(r.passed for r in rows) / len(rows),
            "colour": sum(r.colour_ok for r in rows) / len(rows),
            "direction": sum(r.direction_ok for r in rows) / len(rows),
            "n": len(rows), "required": REQUIRED,
            "clips": [{**asdict(r), "passed": r.passed} for r in rows]}


def write_strip(path, clips: list, every: int = 4, scale: int = 2) -> None:
    """A PNG of clips, one row each, frames 0, every, 2 every, ... side by side (written
    atomically)."""
    import io

    from PIL import Image

    from vcbench.runs import atomic_write_bytes

    rows = [np.concatenate(list(frames[::every]), axis=1) for frames in clips]
    image = np.concatenate(rows, axis=0)
    png = io.BytesIO()
    Image.fromarray(image).resize((image.shape[1] * scale, image.shape[0] * scale),
                                  Image.NEAREST).save(png, format="PNG")
    atomic_write_bytes(path, png.getvalue())


def check_weights(path=None, random: bool = False, device: str | None = None,
                  clips: list | None = None) -> dict:
    """The check on a ToyWan weights file (default: the packaged one), or with `random` on its
    config at a seeded random init: the baseline the trained score is compared with."""
    import torch

    from vcbench.pipelines import toywan
    from vcbench.pipelines.registry import default_device_dtype

    dev, dtype = default_device_dtype(device)
    path = toywan.WEIGHTS if path is None else path
    if not random:
        return check_model(toywan.load_toywan(dev, dtype, path), clips=clips)
    config, _ = toywan.read(path)
    torch.manual_seed(0)
    pipe, text = toywan.build_pipeline(config)
    return check_model(toywan.as_loaded(pipe, text, dev, dtype, random_weights=True), clips=clips)
