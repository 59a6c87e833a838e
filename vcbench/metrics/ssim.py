"""SSIM of a clip: scikit-image's `structural_similarity` per frame on RGB, averaged over frames.

Settings are those of Wang et al. 2004: an 11x11 Gaussian window with sigma 1.5, K1 = 0.01,
K2 = 0.03, population (not sample) covariance, data range 255; skimage averages the SSIM map
over channels and over the pixels at least 5 away from the border.

On the CPU this calls skimage itself. On a GPU it runs `_ssim_frames_torch`, the same
computation as batched separable convolutions in float64; tests hold it to skimage. Because
skimage crops the 5-pixel border that its padded filter touches, a 'valid' convolution
reproduces it exactly whatever skimage's padding mode is.
"""

from __future__ import annotations

import numpy as np
import torch

from vcbench.errors import UserError

DATA_RANGE = 255.0
SIGMA = 1.5
K1, K2 = 0.01, 0.03
RADIUS = int(3.5 * SIGMA + 0.5)  # skimage's truncate=3.5 -> an 11-tap window


def ssim(ref: torch.Tensor, cand: torch.Tensor) -> float:
    """ref, cand: (T, H, W, C) in [0, 255], same shape, any device."""
    if min(ref.shape[1:3]) < 2 * RADIUS + 1:
        raise UserError(f"SSIM needs frames of at least {2 * RADIUS + 1}x{2 * RADIUS + 1} pixels (its window); "
                        f"these are {ref.shape[2]}x{ref.shape[1]}")
    per_frame = ssim_frames_skimage(ref, cand) if ref.device.type == "cpu" else _ssim_frames_torch(ref, cand)
    return float(np.mean(per_frame))


def ssim_frames_skimage(ref: torch.Tensor, cand: torch.Tensor) -> np.ndarray:
    from skimage.metrics import structural_similarity

    ref_np, cand_np = ref.double().numpy(), cand.double().numpy()
    return np.array([
        structural_similarity(r, c, gaussian_weights=True, sigma=SIGMA, K1=K1, K2=K2,
                              use_sample_covariance=False, data_range=DATA_RANGE, channel_axis=-1)
        for r, c in zip(ref_np, cand_np, strict=True)
    ])


def _ssim_frames_torch(ref: torch.Tensor, cand: torch.Tensor, frames_per_batch: int = 8) -> np.ndarray:
    """Per-frame SSIM as batched float64 convolutions; matches `ssim_frames_skimage`."""
    taps = torch.arange(-RADIUS, RADIUS + 1, dtype=torch.float64, device=ref.device)
    gauss = torch.exp(-(taps**2) / (2 * SIGMA**2))
    gauss = gauss / gauss.sum()
    channels = ref.shape[-1]
    across = gauss.view(1, 1, 1, -1).repeat(channels, 1, 1, 1)
    down = gauss.view(1, 1, -1, 1).repeat(channels, 1, 1, 1)

    def blur(x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.conv2d(x, across, groups=channels)
        return torch.nn.functional.conv2d(x, down, groups=channels)

    c1, c2 = (K1 * DATA_RANGE) ** 2, (K2 * DATA_RANGE) ** 2
    out = []
    for start in range(0, ref.shape[0], frames_per_batch):
        x = ref[start:start + frames_per_batch].double().permute(0, 3, 1, 2)
        y = cand[start:start + frames_per_batch].double().permute(0, 3, 1, 2)
        mu_x, mu_y = blur(x), blur(y)
        var_x = blur(x * x) - mu_x**2
        var_y = blur(y * y) - mu_y**2
        cov = blur(x * y) - mu_x * mu_y
        ssim_map = ((2 * mu_x * mu_y + c1) * (2 * cov + c2)) / ((mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2))
        out.append(ssim_map.mean(dim=(1, 2, 3)).cpu().numpy())
    return np.concatenate(out)
