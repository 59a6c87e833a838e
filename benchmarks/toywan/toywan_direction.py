"""How much of the clip's motion a ToyWan model's x_0 estimate holds, noise level by noise level.

    python benchmarks/toywan/toywan_direction.py WEIGHTS [WEIGHTS ...] [--clips 32 --sigmas 0.95,0.8,0.6,0.4]

On one fixed batch of training-like clips (ToyVideo(99), noise seed 1) the clips are noised
to each sigma and the model's x_0 estimate (one forward, the caption given, no CFG) is decoded.
A soft mask of the named colour (1 - RGB distance / 0.6, clipped at 0) gives a centroid per
frame; the columns are means over the clips:
- travel: centroid of the last quarter of the frames minus the first quarter, along the named
  direction, fraction of the side (the clips' own masks give `true`, ~0.33-0.44);
- swapped: the same with the caption's direction word replaced by its opposite (left <-> right,
  up <-> down), measured along the original direction: travel - swapped is how much the model
  moves the shape because of the word;
- err: mean |centroid - true centroid| over the frames, fraction of the side;
- word: mean |pixel difference| (RGB in [0, 1]) between the two estimates, true and swapped
  caption: whether the direction word changes the estimate at all, thresholds aside;
- lin: travel of a threshold-free centroid, the named colour's excess over the frame's mean
  (relu of (rgb - frame mean) . colour), true caption; lin_sw the same, swapped.
The check's sampler decides the trajectory at high sigma; an estimate that does not travel
there gives samples that do not travel.
"""

from __future__ import annotations

import argparse

import torch

from vcbench.pipelines import toyvideo, toywan


def centroids(weight: torch.Tensor) -> torch.Tensor:
    """(B, F, H, W) non-negative -> (B, F, 2) centroid (x, y) as fractions of the side."""
    b, f, h, w = weight.shape
    ys = (torch.arange(h, dtype=torch.float32) + 0.5) / h
    xs = (torch.arange(w, dtype=torch.float32) + 0.5) / w
    total = weight.sum((2, 3)).clamp(min=1e-6)
    return torch.stack([(weight * xs).sum((2, 3)) / total,
                        (weight * ys.view(h, 1)).sum((2, 3)) / total], dim=-1)


def travel(c: torch.Tensor, axis: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """(B, F, 2) centroids -> (B,) last quarter minus first quarter along each clip's axis."""
    q = max(1, c.shape[1] // 4)
    d = c[:, -q:].mean(1) - c[:, :q].mean(1)
    return d.gather(1, axis.view(-1, 1))[:, 0] * sign


@torch.no_grad()
def measure(path, n: int = 32, sigmas=(0.95, 0.8, 0.6, 0.4)) -> list[dict]:
    config, tensors = toywan.read(path)
    pipe, text = toywan.build_pipeline(config, tensors)
    model, vae = pipe.transformer.eval(), pipe.vae
    rows, _ = toyvideo.ToyVideo(99).draw(0, n)
    rows = torch.from_numpy(rows)
    clips, mask = toyvideo.render_batch(rows)
    x0 = (vae.encode(clips.permute(0, 4, 1, 2, 3) * 2 - 1) - toywan.PIXEL_MEAN) / toywan.PIXEL_STD
    direction = rows[:, toyvideo.PARAMS.index("direction")].long()
    moves = torch.tensor(list(toyvideo.DIRECTIONS.values()), dtype=torch.float32)[direction]
    axis = (moves[:, 0] == 0).long()  # 0: x, 1: y
    sign = moves.sum(1)
    swapped = rows.clone()
    swapped[:, toyvideo.PARAMS.index("direction")] = (direction ^ 1).double()  # left<->right, up<->down
    ids, ids_swapped = toyvideo.caption_ids(rows), toyvideo.caption_ids(swapped)
    colour = torch.tensor(list(toyvideo.COLOURS.values()), dtype=torch.float32)[
        rows[:, toyvideo.PARAMS.index("colour")].long()]
    c_true = centroids(mask.float())
    nan = float("nan")
    out = [dict(sigma=0.0, travel=float(travel(c_true, axis, sign).mean()), swapped=nan, err=0.0,
                word=nan, lin=nan, lin_sw=nan)]
    g = torch.Generator().manual_seed(1)
    noise = torch.randn(x0.shape, generator=g)
    for s in sigmas:
        xt = (1 - s) * x0 + s * noise
        res, est_rgb = {}, {}
        for name, cap in (("travel", ids), ("swapped", ids_swapped)):
            t = torch.full((n,), s * 1000)
            v = model(xt, timestep=t, encoder_hidden_states=text(cap), return_dict=False)[0]
            est = xt - max(s, toywan.SIGMA_MIN) * v if config.get("prediction") == "x0" else xt - s * v
            pix = vae.decode(est * toywan.PIXEL_STD + toywan.PIXEL_MEAN, return_dict=False)[0]
            rgb = ((pix.permute(0, 2, 3, 4, 1) + 1) / 2).clamp(0, 1)  # (B, F, H, W, 3)
            dist = (rgb - colour.view(n, 1, 1, 1, 3)).norm(dim=-1)
            c = centroids((1 - dist / 0.6).clamp(min=0))
            res[name] = float(travel(c, axis, sign).mean())
            est_rgb[name] = rgb
            excess = ((rgb - rgb.mean((2, 3), keepdim=True)) * colour.view(n, 1, 1, 1, 3)).sum(-1)
            res["lin" if name == "travel" else "lin_sw"] = float(travel(centroids(excess.clamp(min=0)), axis, sign).mean())
            if name == "travel":
                res["err"] = float((c - c_true).norm(dim=-1).mean())
        res["word"] = float((est_rgb["travel"] - est_rgb["swapped"]).abs().mean())
        out.append(dict(sigma=s, **res))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("weights", nargs="+")
    p.add_argument("--clips", type=int, default=32)
    p.add_argument("--sigmas", default="0.95,0.8,0.6,0.4")
    a = p.parse_args()
    sigmas = [float(x) for x in a.sigmas.split(",")]
    for path in a.weights:
        print(path)
        print("sigma  travel  swapped  err    word    lin     lin_sw")
        for r in measure(path, a.clips, sigmas):
            print(f"{r['sigma']:.2f}  {r['travel']:+.3f}  {r['swapped']:+.3f}  {r['err']:.3f}  "
                  f"{r['word']:.4f}  {r['lin']:+.3f}  {r['lin_sw']:+.3f}", flush=True)


if __name__ == "__main__":
    main()
