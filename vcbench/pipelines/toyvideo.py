"""ToyVideo: procedural captioned clips that the embedded tiny DiT is trained on.

A clip is one coloured shape (disk, square, triangle) moving left, right, up or down over a
static textured background (stripes or checker in another colour). Everything is drawn on
the fly from a seed; nothing is stored. The caption is made from the parameters
("a red disk drifting right over blue stripes"), so a generated clip can be checked against
its caption automatically (vcbench.pipelines.check_tiny).

17 frames (Wan needs 4k+1: one first frame plus 16 frames of motion) at 64x64. A fixed set of
caption combinations is held out of training; the check generates from those.

A clip is a row of PARAMS (drawn on the host, `draw`); `render_batch` draws a batch of rows
with tensor ops on whatever device the rows are on, so the trainer renders on the GPU.
"""

from __future__ import annotations

import functools
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


# A clip's parameters, one float64 row per clip (indices into the tables above, then geometry).
PARAMS = ("colour", "shape", "direction", "background", "texture",
          "radius", "travel", "x0", "y0", "period", "phase")
RADIUS = (0.14, 0.19)  # of the side: 9-12 px discs, so the shape is ~6-11% of the frame
TRAVEL = (0.38, 0.50)  # of the side, over the clip


def draw(combos: list[Combo], rng: np.random.Generator, size: int = SIZE) -> np.ndarray:
    """PARAMS rows (n, len(PARAMS)) of clips of `combos`; `rng` draws each clip's size, travel,
    start and texture period and phase, vectorised over the clips."""
    n = len(combos)
    radius = rng.uniform(*RADIUS, size=n) * size
    travel = rng.uniform(*TRAVEL, size=n) * size  # total distance over the clip
    moves = np.array([DIRECTIONS[c.direction] for c in combos], dtype=np.float64).reshape(n, 2)
    margin = radius + 1
    # Start so that the whole path stays inside the frame.
    lo = margin[:, None] + np.where(moves < 0, travel[:, None], 0)
    hi = size - margin[:, None] - np.where(moves > 0, travel[:, None], 0)
    start = rng.uniform(lo, hi)
    period = rng.choice([8, 12, 16], size=n)
    phase = np.floor(rng.uniform(size=n) * period)
    ids = np.array([(_INDEX["colour"][c.colour], SHAPES.index(c.shape), _INDEX["direction"][c.direction],
                     _INDEX["colour"][c.background], TEXTURES.index(c.texture)) for c in combos],
                   dtype=np.float64).reshape(n, 5)
    return np.column_stack([ids, radius, travel, start, period, phase])


_INDEX = {"colour": {c: i for i, c in enumerate(COLOURS)}, "direction": {d: i for i, d in enumerate(DIRECTIONS)}}


@functools.cache
def _tables(device):
    """(palette, moves, word ids of each caption slot) on `device`, made once: a tensor built
    from Python lists on a GPU is a copy that waits for the GPU, every time."""
    import torch

    words = {word: i for i, word in enumerate(VOCAB)}
    slots = [torch.tensor([words[x] for x in names], device=device)
             for names in (list(COLOURS), SHAPES, list(DIRECTIONS), list(COLOURS), TEXTURES)]
    return (torch.tensor(list(COLOURS.values()), dtype=torch.float32, device=device),
            torch.tensor(list(DIRECTIONS.values()), dtype=torch.float64, device=device), slots)


def render_batch(params, frames: int = FRAMES, size: int = SIZE):
    """Clips float32 (B, F, H, W, 3) in [0, 1] and shape masks bool (B, F, H, W) from PARAMS
    rows (a float64 tensor, or an array), on the rows' device: one vectorised pass, so the
    trainer draws its batches on the GPU. Integer texture arithmetic and float64 centres make
    the result the same on every device."""
    import torch

    p = torch.as_tensor(params, dtype=torch.float64)
    dev = p.device
    col = {name: p[:, i] for i, name in enumerate(PARAMS)}
    b = p.shape[0]
    colour, shape, direction, background, texture = (col[n].long() for n in PARAMS[:5])
    period, phase = col["period"].long(), col["phase"].long()

    # Background: diagonal stripes (no stripe lies along a motion axis) or a checker.
    i = torch.arange(size, device=dev)
    half = (period // 2).view(b, 1, 1)
    ph = phase.view(b, 1, 1)
    u = (i.view(1, size, 1) + ph) // half  # rows
    v = (i.view(1, 1, size) + ph) // half  # columns
    diag = (i.view(1, size, 1) + i.view(1, 1, size) + ph) // half
    on = torch.where((texture == 0).view(b, 1, 1), diag % 2 == 0, (u + v) % 2 == 0)  # (B, H, W)
    palette, moves_table, _ = _tables(dev)
    bg_rgb = BACKGROUND_LEVEL * palette[background] + BASE_LEVEL  # (B, 3)
    bg = torch.where(on.unsqueeze(-1), bg_rgb.view(b, 1, 1, 3),
                     torch.full((), BASE_LEVEL, dtype=torch.float32, device=dev))

    # Shape centres per frame in float64, then offsets of pixel centres in float32.
    moves = moves_table[direction]
    t = torch.arange(frames, dtype=torch.float64, device=dev) / (frames - 1)
    cx = col["x0"].view(b, 1) + (moves[:, 0] * col["travel"]).view(b, 1) * t  # (B, F)
    cy = col["y0"].view(b, 1) + (moves[:, 1] * col["travel"]).view(b, 1) * t
    centres = i.to(torch.float32) + 0.5
    x = centres.view(1, 1, 1, size) - cx.to(torch.float32).view(b, frames, 1, 1)
    y = centres.view(1, 1, size, 1) - cy.to(torch.float32).view(b, frames, 1, 1)
    r = col["radius"].to(torch.float32).view(b, 1, 1, 1)
    masks = torch.stack([shape_mask(name, x, y, r) for name in SHAPES])  # (S, B, F, H, W)
    mask = masks.gather(0, shape.view(1, b, 1, 1, 1).expand(1, b, frames, size, size))[0]
    clips = torch.where(mask.unsqueeze(-1), palette[colour].view(b, 1, 1, 1, 3), bg.unsqueeze(1))
    return clips, mask


def render(combo: Combo, rng: np.random.Generator, frames: int = FRAMES, size: int = SIZE) -> np.ndarray:
    """One clip, float32 (F, H, W, 3) in [0, 1]."""
    clips, _ = render_batch(draw([combo], rng, size), frames, size)
    return clips[0].numpy()


def shape_mask(shape: str, x, y, r):
    """Inside `shape` of size r centred at the origin (numpy arrays or tensors, broadcast)."""
    if shape == "disk":
        return x * x + y * y <= r * r
    if shape == "square":
        return (abs(x) <= 0.85 * r) & (abs(y) <= 0.85 * r)
    # Upright triangle with its centroid at the centre.
    return (y <= 0.8 * r) & (y >= -1.2 * r + 1.8 * abs(x))


def caption_ids(params, length: int = CAPTION_LENGTH):
    """Token ids (B, length) of the captions of PARAMS rows, on their device (= tokenize)."""
    import torch

    p = torch.as_tensor(params)
    w = {word: i for i, word in enumerate(VOCAB)}
    slots = _tables(p.device)[2]
    c = [slots[k][p[:, k].long()] for k in range(len(slots))]
    fixed = [torch.full_like(c[0], w[x]) for x in ("a", "drifting", "over")]
    ids = torch.stack([fixed[0], c[0], c[1], fixed[1], c[2], fixed[2], c[3], c[4]], dim=1)
    return torch.nn.functional.pad(ids, (0, max(0, length - ids.shape[1])))[:, :length]


class ToyVideo:
    """Training batches, a pure function of (seed, step): rerunning a step gives the same clips."""

    def __init__(self, seed: int, frames: int = FRAMES, size: int = SIZE) -> None:
        self.seed, self.frames, self.size = seed, frames, size
        self.train = split()[0]

    def draw(self, step: int, n: int) -> tuple[np.ndarray, list[Combo]]:
        """(PARAMS rows float64 (n, len(PARAMS)), combos) of batch `step`."""
        rng = np.random.default_rng([self.seed, step])
        combos = [self.train[i] for i in rng.integers(len(self.train), size=n)]
        return draw(combos, rng, self.size), combos

    def batch(self, step: int, n: int) -> tuple[np.ndarray, list[str]]:
        """(clips float32 (n, F, H, W, 3) in [0, 1], captions), rendered on the CPU."""
        params, combos = self.draw(step, n)
        clips, _ = render_batch(params, self.frames, self.size)
        return clips.numpy(), [c.caption for c in combos]
