"""Train ToyWan on ToyVideo with Wan's objective (rectified flow), write weights and a model card.

    python -m vcbench.pipelines.train_tiny --out DIR [--steps N --batch B --device cuda]
    vcbench train-tiny --out DIR ...   (the same function)

Objective, as Wan trains: x_t = (1 - s) x_0 + s n, the transformer predicts n - x_0 at
timestep 1000 s; s is uniform, warped by the same shift the UniPC sampler uses, so training
sees the noise levels sampling visits. By default the network predicts x_0 and its forward
returns the velocity (toywan.XPredWanTransformer), so the loss is still Wan's velocity loss. Captions are dropped to the empty (all-zero) embedding
10% of the time, so classifier-free guidance (WanPipeline's, scale 4) has an unconditional
model. The saved weights are an EMA of the trained ones, in bf16.

Deterministic given --seed and --data-seed: batch k is toyvideo.ToyVideo(data_seed).batch(k),
caption dropout and noise levels from a CPU generator seeded with --seed, the noise from a
generator on the training device seeded with --seed + 1. On CPU the run is
bitwise repeatable; on CUDA up to the GPU's own float non-determinism. --max-seconds stops
early (the card records the step reached) and anneals the learning rate by elapsed time, so
such a run depends on the machine's speed; the card says which kind of run made the weights.

DIR gets toywan.safetensors, card.md, loss.csv, loss.png and check.json (the caption check
on 20 held-out captions, trained weights and the same config with random weights).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import torch

from vcbench.errors import UserError
from vcbench.pipelines import toyvideo, toywan

DROP_CAPTION = 0.1


class Batches(torch.utils.data.Dataset):
    """Step k -> batch k, so DataLoader workers render ahead without changing the data."""

    def __init__(self, data_seed: int, batch: int, steps: int) -> None:
        self.data, self.batch, self.steps = toyvideo.ToyVideo(data_seed), batch, steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int):
        clips, captions = self.data.batch(step, self.batch)
        # uint8 across the worker boundary: a quarter of the bytes of float32.
        return torch.from_numpy((clips * 255).round().astype("uint8")), captions


def train(out: Path, steps: int = 6000, batch: int = 64, lr: float = 1e-3, seed: int = 0,
          data_seed: int = 0, device: str = "cpu", layers: int = 3, shift: float = 3.0,
          ema: float = 0.999, log_every: int = 100, max_seconds: float | None = None,
          workers: int = 0, check: bool = True, prediction: str = "x0") -> dict:
    if prediction not in ("x0", "flow"):
        raise UserError(f"--prediction must be x0 or flow, got {prediction!r}")
    if steps < 1 or batch < 1:
        raise UserError(f"--steps and --batch must be positive, got {steps} and {batch}")
    out.mkdir(parents=True, exist_ok=True)
    dev = torch.device(device)
    config = dict(transformer=toywan.transformer_config(layers), vae={}, shift=shift,
                  prediction=prediction)
    torch.manual_seed(seed)
    pipe, text = toywan.build_pipeline(config)
    model = pipe.transformer.to(dev).train()
    text.to(dev).train()
    vae = pipe.vae
    params = list(model.parameters()) + list(text.parameters())
    averaged = [copy.deepcopy(model).eval().requires_grad_(False),
                copy.deepcopy(text).requires_grad_(False)]
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.01)
    warmup = min(200, steps // 10 + 1)

    def lr_at(k):  # linear warmup, cosine down to 10% over the steps (or the time) planned
        if k < warmup:
            return lr * (k + 1) / warmup
        done = (k - warmup) / max(1, steps - warmup)
        if max_seconds is not None:  # a time-bounded run still anneals before it stops
            done = max(done, (time.time() - start) / max_seconds)
        return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, done))))

    commit = git_commit()  # now: others may commit while a long run trains
    g = torch.Generator().manual_seed(seed)
    # Noise is drawn where it is used: a 16M-float randn on one CPU thread costs more than the
    # whole training step on a GPU.
    g_noise = torch.Generator(dev).manual_seed(seed + 1)
    start = time.time()
    loader = torch.utils.data.DataLoader(Batches(data_seed, batch, steps), batch_size=None,
                                         num_workers=workers, prefetch_factor=4 if workers else None)
    autocast = torch.autocast("cuda", torch.bfloat16) if dev.type == "cuda" else torch.autocast("cpu", enabled=False)
    losses, window, done = [], [], 0
    for k, (clips, captions) in enumerate(loader):
        x = clips.permute(0, 4, 1, 2, 3).to(dev).float() / 127.5 - 1
        x0 = (vae.encode(x) - toywan.PIXEL_MEAN) / toywan.PIXEL_STD
        ids = text.ids(captions)
        ids[torch.rand(len(captions), generator=g) < DROP_CAPTION] = 0
        u = torch.rand(len(captions), generator=g)
        s = shift * u / (1 + (shift - 1) * u)
        noise = torch.randn(x0.shape, generator=g_noise, device=dev)
        sv = s.to(dev).view(-1, 1, 1, 1, 1)
        xt = (1 - sv) * x0 + sv * noise
        rate = lr_at(k)
        for group in opt.param_groups:
            group["lr"] = rate
        with autocast:
            pred = model(xt, timestep=(s * 1000).to(dev), encoder_hidden_states=text(ids.to(dev)),
                         return_dict=False)[0]
        loss = torch.nn.functional.mse_loss(pred.float(), noise - x0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        decay = min(ema, (1 + k) / (10 + k))
        with torch.no_grad():
            for avg, cur in zip(averaged, (model, text), strict=True):
                torch._foreach_lerp_(list(avg.parameters()), list(cur.parameters()), 1 - decay)
        window.append(loss.item())
        done = k + 1
        if done % log_every == 0 or done == steps:
            losses.append((done, sum(window) / len(window)))
            window = []
            print(f"step {done}/{steps} loss {losses[-1][1]:.4f} lr {rate:.2e} "
                  f"{time.time() - start:.0f}s", flush=True)
        if max_seconds is not None and time.time() - start > max_seconds:
            print(f"stopping at step {done}: --max-seconds {max_seconds:g} reached", flush=True)
            break
    wall = time.time() - start
    if window:
        losses.append((done, sum(window) / len(window)))

    training = dict(steps=done, planned_steps=steps, max_seconds=max_seconds, batch=batch, lr=lr, seed=seed,
                    data_seed=data_seed, shift=shift, ema=ema, drop_caption=DROP_CAPTION,
                    final_loss=round(losses[-1][1], 5), wall_s=round(wall, 1),
                    device=describe(dev), torch=torch.__version__, commit=commit)
    config["training"] = training
    weights = out / "toywan.safetensors"
    save(weights, config, toywan.state_dict(*averaged))
    write_loss(out, losses)
    result = {"training": training}
    if check:
        result["check"] = run_check(weights, config, dev)
        (out / "check.json").write_text(json.dumps(result["check"], indent=1))
    write_card(out, config, result)
    return result


def save(path: Path, config: dict, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"config": json.dumps(config)})


def run_check(weights: Path, config: dict, dev: torch.device) -> dict:
    """The caption check on the saved (bf16) weights, and on the same config at random init."""
    from vcbench.pipelines.check_tiny import check_weights

    trained = check_weights(weights, device=str(dev))
    random = check_weights(weights, random=True, device=str(dev))
    print(f"check: trained {trained['score']:.2f}, random {random['score']:.2f} "
          f"(required {trained['required']:.2f})", flush=True)
    return {"trained": trained, "random": random, "device": str(dev)}


def write_loss(out: Path, losses: list[tuple[int, float]]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (out / "loss.csv").write_text("step,loss\n" + "".join(f"{s},{v:.6f}\n" for s, v in losses))
    fig, ax = plt.subplots(figsize=(5, 3), dpi=100)
    ax.plot([s for s, _ in losses], [v for _, v in losses])
    ax.set_xlabel("step")
    ax.set_ylabel("flow-matching loss")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "loss.png")
    plt.close(fig)


def write_card(out: Path, config: dict, result: dict) -> None:
    t = result["training"]
    lines = ["# ToyWan: the trained tiny-wan", "",
             "diffusers `WanPipeline` + `WanTransformer3DModel` (one expert), fixed invertible "
             "patchify VAE, learned caption-word embedding; trained on ToyVideo "
             "(vcbench/pipelines/toyvideo.py) by vcbench/pipelines/train_tiny.py.", "",
             "## Training", "", "| key | value |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in t.items()]
    lines += ["", "![loss](loss.png)", "", "## Config", "", "```json",
              json.dumps({k: v for k, v in config.items() if k != "training"}, indent=1), "```"]
    if "check" in result:
        c = result["check"]
        lines += ["", "## Caption check (vcbench/pipelines/check_tiny.py)", "",
                  f"20 held-out captions, one clip each (seed = index), on {c['device']} at the model defaults "
                  "(bf16 on CUDA, float32 on CPU, as `vcbench generate`).", "",
                  "| weights | pass | colour | direction |", "| --- | --- | --- | --- |"]
        for name in ("trained", "random"):
            r = c[name]
            lines.append(f"| {name} | {r['score']:.2f} | {r['colour']:.2f} | {r['direction']:.2f} |")
        lines.append(f"\nRequired for trained weights: {c['trained']['required']:.2f}.")
    (out / "card.md").write_text("\n".join(lines) + "\n")


def describe(dev: torch.device) -> str:
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    return f"cpu ({torch.get_num_threads()} threads)"


def git_commit() -> str:
    """HEAD's hash, or "unknown" where the tree is no git checkout (a copy on a device)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=10).stdout.strip()
    except OSError:
        return "unknown"
    return head if len(head) == 40 and all(c in "0123456789abcdef" for c in head) else "unknown"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="train_tiny", description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=6000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--log-every", type=int, default=100)
    p.add_argument("--max-seconds", type=float, default=None)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--prediction", default="x0", help="x0 (default) or flow: what the network outputs")
    a = p.parse_args(argv)
    try:
        train(a.out, a.steps, a.batch, a.lr, a.seed, a.data_seed, a.device, a.layers,
              log_every=a.log_every, max_seconds=a.max_seconds, workers=a.workers,
              check=not a.no_check, prediction=a.prediction)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
