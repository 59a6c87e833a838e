"""SSIM against an independent numpy implementation of Wang et al. 2004 (Gaussian window)."""

import math

import numpy as np
import pytest
import torch

from vcbench.metrics.ssim import _ssim_frames_torch, ssim, ssim_frames_skimage


def wang_ssim_rgb(x: np.ndarray, y: np.ndarray) -> float:
    """Mean SSIM over channels and over every full 11x11 window (no padding), sigma 1.5,
    K1 0.01, K2 0.03, L 255, population statistics: Wang et al.'s formula, written out."""
    taps = np.arange(-5, 6)
    g = np.exp(-(taps**2) / (2 * 1.5**2))
    window = np.outer(g, g) / np.outer(g, g).sum()
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    values = []
    for ch in range(x.shape[-1]):
        a, b = x[..., ch].astype(np.float64), y[..., ch].astype(np.float64)
        for i in range(a.shape[0] - 10):
            for j in range(a.shape[1] - 10):
                pa, pb = a[i:i + 11, j:j + 11], b[i:i + 11, j:j + 11]
                mu_a, mu_b = (window * pa).sum(), (window * pb).sum()
                var_a = (window * (pa - mu_a) ** 2).sum()
                var_b = (window * (pb - mu_b) ** 2).sum()
                cov = (window * (pa - mu_a) * (pb - mu_b)).sum()
                values.append((2 * mu_a * mu_b + c1) * (2 * cov + c2)
                              / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2)))
    return float(np.mean(values))


@pytest.fixture
def pair():
    rng = np.random.default_rng(3)
    ref = rng.integers(0, 256, (2, 16, 19, 3)).astype(np.uint8)
    cand = np.clip(ref + rng.normal(0, 25, ref.shape), 0, 255).astype(np.uint8)
    return torch.from_numpy(ref), torch.from_numpy(cand)


def test_skimage_path_matches_wang_et_al(pair):
    ref, cand = pair
    expected = [wang_ssim_rgb(r, c) for r, c in zip(ref.numpy(), cand.numpy(), strict=True)]
    np.testing.assert_allclose(ssim_frames_skimage(ref, cand), expected, rtol=1e-10)
    assert math.isclose(ssim(ref, cand), float(np.mean(expected)), rel_tol=1e-10)


def test_batched_torch_path_matches_skimage(pair):
    ref, cand = pair
    np.testing.assert_allclose(_ssim_frames_torch(ref, cand, frames_per_batch=1),
                               ssim_frames_skimage(ref, cand), rtol=1e-12)


def test_identical_frames_score_one(pair):
    ref, _ = pair
    assert math.isclose(ssim(ref, ref.clone()), 1.0, rel_tol=1e-12)


def test_frames_smaller_than_the_window_are_a_user_error():
    from vcbench.errors import UserError

    tiny = torch.zeros(1, 8, 8, 3, dtype=torch.uint8)
    with pytest.raises(UserError, match="11x11"):
        ssim(tiny, tiny)
