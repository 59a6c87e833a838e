"""PSNR against the textbook formula, computed by hand in numpy on tiny clips."""

import math

import numpy as np
import torch

from vcbench.metrics.psnr import psnr


def test_psnr_matches_hand_formula_with_mse_pooled_over_frames():
    ref = np.array([[[[0, 10, 20]], [[30, 40, 50]]], [[[100, 110, 120]], [[200, 210, 220]]]], np.uint8)
    cand = ref.copy()
    cand[0, 0, 0, 0] = 3   # one error of 3 in frame 0
    cand[1, 1, 0, 2] = 210  # one error of 10 in frame 1
    # 12 values; squared errors 9 and 100 pooled over all of them.
    expected = 10 * math.log10(255**2 / ((9 + 100) / 12))
    assert math.isclose(psnr(torch.from_numpy(ref), torch.from_numpy(cand)), expected, rel_tol=1e-12)


def test_pooled_psnr_differs_from_the_mean_of_per_frame_psnrs():
    rng = np.random.default_rng(0)
    ref = rng.integers(0, 256, (2, 4, 5, 3)).astype(np.uint8)
    cand = ref.astype(int)
    cand[0] += 1
    cand[1] += 20
    cand = np.clip(cand, 0, 255).astype(np.uint8)
    err = (ref.astype(float) - cand) ** 2
    pooled = 10 * np.log10(255**2 / err.mean())
    per_frame = np.mean([10 * np.log10(255**2 / e.mean()) for e in err])
    got = psnr(torch.from_numpy(ref), torch.from_numpy(cand))
    assert math.isclose(got, pooled, rel_tol=1e-12)
    assert abs(got - per_frame) > 1.0


def test_identical_clips_give_inf():
    clip = torch.from_numpy(np.random.default_rng(1).integers(0, 256, (3, 8, 8, 3)).astype(np.uint8))
    assert psnr(clip, clip.clone()) == math.inf


def test_no_uint8_wraparound():
    ref = torch.zeros(1, 2, 2, 1, dtype=torch.uint8)
    cand = torch.full((1, 2, 2, 1), 255, dtype=torch.uint8)
    assert psnr(ref, cand) == 0.0  # MSE = 255^2 exactly, not (0 - 255) mod 256 = 1
