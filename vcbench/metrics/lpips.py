"""LPIPS of a clip: the `lpips` package's AlexNet model with its v0.1 heads, per frame, averaged.

Frames in [0, 255] are mapped to [-1, 1] (x / 127.5 - 1) as LPIPS expects. The backbone
weights come from `lpips_backbone` (no hub download); the heads from the lpips wheel.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from vcbench.errors import UserError
from vcbench.metrics.lpips_backbone import alexnet_state_dict

# On a CPU one frame at a time is fastest (larger batches spill the caches); a GPU wants many.
_FRAMES_PER_BATCH = {"cpu": 1, "cuda": 16}
# AlexNet's two 3x3 max-pools need a 7-pixel map after the stride-4 first convolution.
MIN_SIDE = 31


class Lpips:
    """Build once (loads weights), then call per clip: `Lpips(device)(ref, cand) -> float`."""

    def __init__(self, device: str = "cpu", backbone: Path | None = None, sdist: Path | None = None,
                 state: dict[str, torch.Tensor] | None = None):
        import lpips

        with warnings.catch_warnings():  # torchvision's deprecation chatter about `pretrained`
            warnings.simplefilter("ignore")
            # pnet_rand=True: build AlexNet without asking torchvision to download it; the real
            # backbone is loaded just below. pretrained=True loads the wheel's v0.1 heads.
            model = lpips.LPIPS(net="alex", version="0.1", pretrained=True, pnet_rand=True, verbose=False)
        state = state if state is not None else alexnet_state_dict(backbone, sdist)
        missing = {k for k in model.state_dict() if k.startswith("net.")} - set(state)
        if missing:
            raise UserError(f"LPIPS backbone lacks {sorted(missing)[0]}")
        model.load_state_dict(state, strict=False)
        self.model = model.eval().to(device)
        self.device = torch.device(device)
        self.frames_per_batch = _FRAMES_PER_BATCH.get(self.device.type, 16)

    def __call__(self, ref: torch.Tensor, cand: torch.Tensor) -> float:
        return float(self.per_frame(ref, cand).mean())

    @torch.inference_mode()
    def per_frame(self, ref: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
        """ref, cand: (T, H, W, 3) in [0, 255] -> (T,) float64 LPIPS distances."""
        if ref.shape[-1] != 3:
            raise UserError(f"LPIPS needs RGB frames; these have {ref.shape[-1]} channel(s)")
        if min(ref.shape[1:3]) < MIN_SIDE:
            raise UserError(f"LPIPS (AlexNet) needs frames at least {MIN_SIDE}x{MIN_SIDE}; these are "
                            f"{ref.shape[1]}x{ref.shape[2]}")
        out = []
        for start in range(0, ref.shape[0], self.frames_per_batch):
            x = _to_unit_range(ref[start:start + self.frames_per_batch], self.device)
            y = _to_unit_range(cand[start:start + self.frames_per_batch], self.device)
            out.append(self.model(x, y).flatten().double().cpu())
        return torch.cat(out)


def _to_unit_range(frames: torch.Tensor, device: torch.device) -> torch.Tensor:
    return (frames.to(device).float().permute(0, 3, 1, 2) / 127.5 - 1.0).contiguous()
