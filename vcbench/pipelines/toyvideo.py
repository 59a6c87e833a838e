"""ToyVideo: procedural captioned clips that the embedded tiny DiT is trained on.

A clip is one coloured shape (disk, square, triangle) moving left, right, up or down over a
static textured background (stripes or checker in another colour). Everything is drawn on
the fly from a seed; nothing is stored. The caption is made from the parameters
("a red disk drifting right over blue stripes"), so a generated clip can be checked against
its caption automatically (vcbench.pipelines.check_tiny).

17 frames (Wan needs 4k+1: one first frame plus 16 frames of motion) at 64x64. A fixed set of
caption combinations is held out of training; the check generates from those.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import numpy as np

from vcbench.errors import UserError

FRAMES, SIZE = 17, 64
# Saturated shape colours; the background draws the same hues dimmed, so a shape's colour
# mask never picks up background texture (a caption never pairs a colour with itself).
COLOURS = {"red": (1.0, 0.0, 0.0), "green": (0.0, 1.0, 0.0), "blue": (0.0, 0.0, 1.0),
           "yellow": (1.0, 1.0, 0.0)}
SHAPES = ("disk", "square", "triangle")
DIRECTIONS = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}  # (dx, dy), y down
TEXTURES = ("stripes", "checker")
BACKGROUND_LEVEL, BASE_LEVEL = 0.45, 0.08
HOLDOUT_SEED, HOLDOUT_COUNT = 8, 24

# Fixed caption vocabulary; index 0 is padding (an all-zero embedding), 1 an unknown word.
VOCAB = ("<pad>", "<unk>", "a", "drifting", "over", *COLOURS, *SHAPES, *DIRECTIONS, *TEXTURES)
CAPTION_LENGTH = 8


@dataclass(frozen=True)
class Combo:
    colour: str
    shape: str
    direction: str
    background: str
    texture: str

    @property
    def caption(self) -> str:
        return f"a {self.colour} {self.shape} drifting {self.direction} over {self.background} {self.texture}"


def all_combos() -> list[Combo]:
    return [Combo(c, s, d, b, t) for c, s, d, b, t in
            itertools.product(COLOURS, SHAPES, DIRECTIONS, COLOURS, TEXTURES) if b != c]


def split() -> tuple[list[Combo], list[Combo]]:
    """(train, held_out), the same on every machine. Held-out combos cycle through every
    (colour, direction) pair, so 20 of them test each colour and each direction 5 times; their
    shape, background colour and texture are drawn from a fixed seed."""
    rng = random.Random(HOLDOUT_SEED)
    pairs = list(itertools.product(COLOURS, DIRECTIONS))
    held: list[Combo] = []
    while len(held) < HOLDOUT_COUNT:
        rng.shuffle(pairs)
        for colour, direction in pairs[: HOLDOUT_COUNT - len(held)]:
            background = rng.choice([b for b in COLOURS if b != colour])
            combo = Combo(colour, rng.choice(SHAPES), direction, background, rng.choice(TEXTURES))
            if combo not in held:
                held.append(combo)
    return [c for c in all_combos() if c not in held], held


def held_out_captions(n: int = 20) -> list[str]:
    return [c.caption for c in split()[1][:n]]


def parse_caption(caption: str) -> Combo:
    words = caption.lower().split()
    if (len(words) != 8 or words[0] != "a" or words[3] != "drifting" or words[5] != "over"
            or words[1] not in COLOURS or words[2] not in SHAPES or words[4] not in DIRECTIONS
            or words[6] not in COLOURS or words[7] not in TEXTURES):
        raise UserError(f"not a toyvideo caption ('a COLOUR SHAPE drifting DIRECTION over COLOUR TEXTURE'): {caption!r}")
    if words[1] == words[-2]:
        raise UserError(f"toyvideo caption with the same shape and background colour: {caption!r}")
    return Combo(words[1], words[2], words[4], words[-2], words[-1])


def tokenize(caption: str, length: int = CAPTION_LENGTH) -> list[int]:
    """Words split on whitespace, looked up in VOCAB (unknown -> 1), padded with 0 to `length`."""
    index = {w: i for i, w in enumerate(VOCAB)}
    ids = [index.get(w, 1) for w in caption.lower().replace(".", " ").replace(",", " ").split()]
    return (ids + [0] * length)[:length]


def render(combo: Combo, rng: np.random.Generator, frames: int = FRAMES, size: int = SIZE) -> np.ndarray:
    """One clip, float32 (F, H, W, 3) in [0, 1]. `rng` draws size, speed, start and texture phase."""
    radius = rng.uniform(0.11, 0.15) * size
    travel = rng.uniform(0.40, 0.55) * size  # total distance over the clip
    dx, dy = DIRECTIONS[combo.direction]
    margin = radius + 1
    # Start so that the whole path stays inside the frame.
    lo_x = margin + (travel if dx < 0 else 0)
    hi_x = size - margin - (travel if dx > 0 else 0)
    lo_y = margin + (travel if dy < 0 else 0)
    hi_y = size - margin - (travel if dy > 0 else 0)
    x0, y0 = rng.uniform(lo_x, hi_x), rng.uniform(lo_y, hi_y)
    period = int(rng.choice([8, 12, 16]))
    phase = int(rng.integers(period))
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5

    if combo.texture == "stripes":  # diagonal, so no stripe lies along a motion axis
        on = ((xx + yy + phase) // (period // 2)) % 2 == 0
    else:
        on = (((xx + phase) // (period // 2)) + ((yy + phase) // (period // 2))) % 2 == 0
    bg = np.full((size, size, 3), BASE_LEVEL, np.float32)
    bg[on] = BACKGROUND_LEVEL * np.asarray(COLOURS[combo.background], np.float32) + BASE_LEVEL

    out = np.empty((frames, size, size, 3), np.float32)
    colour = np.asarray(COLOURS[combo.colour], np.float32)
    for f in range(frames):
        t = f / (frames - 1)
        cx, cy = x0 + dx * travel * t, y0 + dy * travel * t
        out[f] = bg
        out[f][shape_mask(combo.shape, xx - cx, yy - cy, radius)] = colour
    return out


def shape_mask(shape: str, x: np.ndarray, y: np.ndarray, r: float) -> np.ndarray:
    if shape == "disk":
        return x * x + y * y <= r * r
    if shape == "square":
        return (np.abs(x) <= 0.85 * r) & (np.abs(y) <= 0.85 * r)
    # Upright triangle with its centroid at the centre.
    return (y <= 0.8 * r) & (y >= -1.2 * r + 1.8 * np.abs(x))


class ToyVideo:
    """Training batches, a pure function of (seed, step): rerunning a step gives the same clips."""

    def __init__(self, seed: int, frames: int = FRAMES, size: int = SIZE) -> None:
        self.seed, self.frames, self.size = seed, frames, size
        self.train = split()[0]

    def batch(self, step: int, n: int) -> tuple[np.ndarray, list[str]]:
        """(clips float32 (n, F, H, W, 3) in [0, 1], captions)."""
        rng = np.random.default_rng([self.seed, step])
        combos = [self.train[i] for i in rng.integers(len(self.train), size=n)]
        clips = np.stack([render(c, rng, self.frames, self.size) for c in combos])
        return clips, [c.caption for c in combos]
