"""VBench imaging quality on CPU without real weights: pyiqa's MUSIQ architecture with seeded
random weights in a temporary VBench cache. The multi-scale tokens are checked against a numpy
re-computation (its own bicubic resize, patch grid and position hash), the clip score against
vbench's formula written out, and the whole path through `vcbench score`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from score_fixtures import perturb, smooth_clip, write_frames

from vcbench.cli import main
from vcbench.errors import UserError
from vcbench.metrics.musiq import Musiq, multiscale_tokens
from vcbench.metrics.vbench import (
    MUSIQ_FILE,
    ImagingQuality,
    build_vbench_metric,
    vbench_longer_resize,
)


@pytest.fixture(scope="module")
def musiq_state():
    torch.manual_seed(0)
    model = Musiq()
    with torch.no_grad():  # pyiqa's init of the embeddings it creates with zeros here
        encoder = model.transformer_encoder
        encoder.posembed_input.position_emb.normal_(0, 0.02)
        encoder.scaleembed_input.scale_emb.normal_(0, 0.02)
    return model.state_dict()


def cache_holding(folder, state):
    (folder / MUSIQ_FILE).parent.mkdir(parents=True)
    torch.save(state, folder / MUSIQ_FILE)
    return folder


@pytest.fixture(scope="module")
def saved_cache(tmp_path_factory, musiq_state):
    return cache_holding(tmp_path_factory.mktemp("vbench"), musiq_state)  # ~100 MB: written once


@pytest.fixture
def vbench_cache(saved_cache, monkeypatch):
    monkeypatch.setenv("VBENCH_CACHE_DIR", str(saved_cache))
    return saved_cache


@pytest.fixture(scope="module")
def metric(saved_cache):
    return ImagingQuality("cpu", saved_cache)


def test_checkpoint_round_trips_with_strict_loading(metric, musiq_state):
    loaded = metric.model.state_dict()
    assert loaded.keys() == musiq_state.keys()
    assert all(torch.equal(loaded[k], musiq_state[k]) for k in musiq_state)


def test_a_dataparallel_prefix_is_stripped_as_pyiqa_does(tmp_path, musiq_state):
    cache_holding(tmp_path, {f"module.{k}": v for k, v in musiq_state.items()})
    assert torch.equal(ImagingQuality("cpu", tmp_path).model.head.weight, musiq_state["head.weight"])


def test_a_checkpoint_missing_a_layer_is_a_one_line_error(tmp_path, musiq_state):
    cache_holding(tmp_path, {k: v for k, v in musiq_state.items() if "encoderblock_13" not in k})
    with pytest.raises(UserError, match="is not pyiqa's MUSIQ") as err:
        ImagingQuality("cpu", tmp_path)
    assert "\n" not in str(err.value)


def test_missing_weights_are_a_one_line_error_naming_file_and_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("VBENCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(UserError) as err:
        build_vbench_metric("imaging_quality", "cpu", None)
    assert "pyiqa_model/musiq_spaq_ckpt-358bb6af.pth not found in " + str(tmp_path) in str(err.value)
    assert "\n" not in str(err.value)


def numpy_bicubic(image: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Keys cubic convolution (a = -0.75), half-pixel centres, edge-clamped taps: the rule of
    torch's bicubic with align_corners=False, written out separably in float64."""
    def cubic(d):
        d = np.abs(d)
        return np.where(d <= 1, (1.25 * d - 2.25) * d * d + 1,
                        np.where(d < 2, ((-0.75 * d + 3.75) * d - 6) * d + 3, 0.0))

    def along(axis_len, out_len):
        src = (np.arange(out_len) + 0.5) * axis_len / out_len - 0.5
        base = np.floor(src).astype(int)
        taps = base[:, None] + np.arange(-1, 3)[None, :]
        weights = cubic(src[:, None] - taps)
        matrix = np.zeros((out_len, axis_len))
        for i in range(out_len):
            for t, w in zip(np.clip(taps[i], 0, axis_len - 1), weights[i], strict=True):
                matrix[i, t] += w
        return matrix

    rows, cols = along(image.shape[1], out_h), along(image.shape[2], out_w)
    return np.einsum("ij,cjk,lk->cil", rows, image.astype(np.float64), cols)


def numpy_tokens(image: np.ndarray, scale_id: int, max_len: int | None):
    """Zero 'SAME' padding to a multiple of 32 (smaller half first), 32x32 patches row-major as
    (channel, row, col) vectors, positions hashed onto 10x10 as floor(i * 10 / count)."""
    _, h, w = image.shape
    rows, cols = -(-h // 32), -(-w // 32)
    ph, pw = rows * 32 - h, cols * 32 - w
    padded = np.pad(image, ((0, 0), (ph // 2, ph - ph // 2), (pw // 2, pw - pw // 2)))
    patches = [padded[:, r * 32:(r + 1) * 32, c * 32:(c + 1) * 32].reshape(-1)
               for r in range(rows) for c in range(cols)]
    positions = [(r * 10 // rows) * 10 + c * 10 // cols for r in range(rows) for c in range(cols)]
    n = len(patches)
    extra = (max_len - n) if max_len is not None else 0
    patches += [np.zeros(3 * 32 * 32)] * extra
    return np.array(patches), positions + [0] * extra, [scale_id] * n + [0] * extra, [1] * n + [0] * extra


def test_multiscale_tokens_match_a_numpy_recomputation():
    image = np.random.default_rng(0).uniform(-1, 1, (3, 40, 70)).astype(np.float32)
    patches, positions, scales, mask = multiscale_tokens(torch.from_numpy(image)[None])
    expected = []
    for scale_id, longer in enumerate((224, 384)):
        size = (round(40 * longer / 70), longer)  # aspect kept, longer side 70 -> `longer`
        expected.append(numpy_tokens(numpy_bicubic(image, *size), scale_id, (longer // 32) ** 2))
    expected.append(numpy_tokens(image, 2, None))  # the original resolution: every patch
    assert patches.shape == (1, 49 + 144 + 2 * 3, 3 * 32 * 32)
    np.testing.assert_allclose(patches[0].numpy(), np.concatenate([e[0] for e in expected]), atol=2e-5)
    assert positions.tolist() == sum((e[1] for e in expected), [])
    assert scales.tolist() == sum((e[2] for e in expected), [])
    assert mask.tolist() == sum((e[3] for e in expected), [])


def test_frames_over_512_are_resized_as_vbench_longer_mode():
    frames = torch.zeros(1, 3, 480, 832, dtype=torch.uint8)
    assert vbench_longer_resize(frames).shape[-2:] == (math.floor(480 * 512 / 832), 512)
    small = torch.randint(0, 255, (2, 3, 512, 300), dtype=torch.uint8)
    assert vbench_longer_resize(small) is small  # at most 512 on the longer side: untouched


def test_clip_score_is_the_mean_frame_score_over_100(metric):
    clip = torch.from_numpy(smooth_clip(3, frames=2, height=24, width=40))
    with torch.no_grad():  # vbench: each frame alone, (1, 3, H, W) / 255, MUSIQ's raw output
        per_frame = [float(metric.model(clip[i].permute(2, 0, 1)[None].float() / 255)) for i in range(2)]
    assert per_frame[0] != per_frame[1]  # the mean is not a constant of the weights
    assert math.isclose(metric(clip), sum(per_frame) / 2 / 100, rel_tol=1e-12)


def test_vcbench_score_reports_imaging_quality_for_candidate_and_reference(vbench_cache, metric, tmp_path):
    ref = smooth_clip(0, frames=1, height=24, width=40)
    cand = perturb(ref, 1, 20.0)
    args = ["score", write_frames(tmp_path / "ref", ref), write_frames(tmp_path / "cand", cand),
            "--metrics", "psnr,imaging_quality", "--json", tmp_path / "s.json"]
    main([str(a) for a in args])  # returns on success; an error would raise SystemExit(2)
    (row,) = json.loads((tmp_path / "s.json").read_text())["rows"]
    assert math.isclose(row["imaging_quality"], metric(torch.from_numpy(cand)), rel_tol=1e-12)
    assert math.isclose(row["imaging_quality_ref"], metric(torch.from_numpy(ref)), rel_tol=1e-12)
    assert row["imaging_quality"] != row["imaging_quality_ref"]
