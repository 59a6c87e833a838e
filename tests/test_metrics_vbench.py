"""VBench subject consistency on CPU without real weights: a DINO ViT-B/16 with seeded random
weights in a temporary VBench cache, checked against torchvision's independent ViT-B/16 and
against vbench's formula written out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from score_fixtures import smooth_clip

from vcbench.errors import UserError
from vcbench.metrics.vbench import DINO_FILE, DinoViTB16, SubjectConsistency, build_vbench_metric


@pytest.fixture(scope="module")
def dino_state():
    torch.manual_seed(0)
    model = DinoViTB16()
    with torch.no_grad():  # DINO-like scales: random tokens must not all collapse to one CLS
        for name, p in model.named_parameters():
            if name in ("cls_token", "pos_embed"):
                p.normal_(0, 0.02)
    return model.state_dict()


@pytest.fixture
def vbench_cache(tmp_path, monkeypatch, dino_state):
    (tmp_path / DINO_FILE).parent.mkdir(parents=True)
    torch.save(dino_state, tmp_path / DINO_FILE)
    monkeypatch.setenv("VBENCH_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_dino_matches_torchvision_vit_b16_on_the_same_weights(dino_state):
    from torchvision.models import vit_b_16

    tv = vit_b_16()
    tv.heads = torch.nn.Identity()
    mapped = {"class_token": dino_state["cls_token"], "encoder.pos_embedding": dino_state["pos_embed"],
              "conv_proj.weight": dino_state["patch_embed.proj.weight"],
              "conv_proj.bias": dino_state["patch_embed.proj.bias"],
              "encoder.ln.weight": dino_state["norm.weight"], "encoder.ln.bias": dino_state["norm.bias"]}
    for i in range(12):
        ours, theirs = f"blocks.{i}.", f"encoder.layers.encoder_layer_{i}."
        for a, b in (("norm1", "ln_1"), ("norm2", "ln_2"), ("attn.qkv", "self_attention.in_proj"),
                     ("attn.proj", "self_attention.out_proj"), ("mlp.fc1", "mlp.0"), ("mlp.fc2", "mlp.3")):
            sep = "_" if b.endswith("in_proj") else "."
            mapped[f"{theirs}{b}{sep}weight"] = dino_state[f"{ours}{a}.weight"]
            mapped[f"{theirs}{b}{sep}bias"] = dino_state[f"{ours}{a}.bias"]
    tv.load_state_dict(mapped, strict=True)
    ours = DinoViTB16()
    ours.load_state_dict(dino_state)
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(x), tv.eval()(x), atol=1e-4, rtol=1e-4)


def test_non_square_frames_interpolate_position_embeddings_as_dino_does(dino_state):
    model = DinoViTB16()
    model.load_state_dict(dino_state)
    # 480x832 resized to a 224 shorter side is 224x388: a 14x24 patch grid.
    pos = model._position_embedding(14 * 24, 224, 388)
    assert pos.shape == (1, 1 + 14 * 24, 768)
    torch.testing.assert_close(pos[:, 0], model.pos_embed[:, 0])


def test_subject_consistency_follows_vbench_formula(vbench_cache):
    metric = SubjectConsistency("cpu")
    clip = torch.from_numpy(smooth_clip(0, frames=3, height=40, width=56))
    f = metric.features(clip)
    cos = lambda a, b: max(0.0, float(F.cosine_similarity(f[a:a + 1], f[b:b + 1])))  # noqa: E731
    expected = np.mean([(cos(i - 1, i) + cos(0, i)) / 2 for i in range(1, 3)])
    assert math.isclose(metric(clip), expected, rel_tol=1e-9)
    still = clip[:1].repeat(2, 1, 1, 1)
    assert math.isclose(metric(still), 1.0, rel_tol=1e-5)


def test_missing_weights_name_the_file_and_the_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("VBENCH_CACHE_DIR", str(tmp_path))
    with pytest.raises(UserError, match=r"dino_model/dino_vitbase16_pretrain.pth not found in .*"):
        build_vbench_metric("subject_consistency", "cpu", None)
    with pytest.raises(UserError, match="musiq_spaq_ckpt-358bb6af.pth not found in " + str(tmp_path)):
        build_vbench_metric("imaging_quality", "cpu", None)


def test_wrong_weights_are_a_one_line_error(vbench_cache):
    torch.save({"pos_embed": torch.zeros(1)}, vbench_cache / DINO_FILE)
    with pytest.raises(UserError, match="is not DINO ViT-B/16") as err:
        SubjectConsistency("cpu")
    assert "\n" not in str(err.value)
