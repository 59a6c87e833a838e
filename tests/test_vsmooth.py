"""V-Smooth: grouping, block demeaning, exact mean restoration, and the grouping schedule."""

import math

import pytest
import torch
from conftest import reference_attention

from vcbench.kernels.reference.engine import emulate
from vcbench.kernels.reference.vsmooth import (
    balanced_labels,
    block_energy_share,
    block_means,
    cube_keys,
    group,
    kmeans,
)
from vcbench.kernels.spec.formats import EXACT
from vcbench.kernels.spec.granularity import Quantizer, Unscaled
from vcbench.kernels.spec.method import Plan
from vcbench.kernels.spec.probability import ExpThenCast
from vcbench.kernels.spec.vsmooth import GroupingSchedule, VSmoothConfig

_EXACT = Quantizer(EXACT, Unscaled())


def exact_plan(vsmooth=None, block=128):
    return Plan(q=_EXACT, k=_EXACT, v=_EXACT, p=ExpThenCast(EXACT), fold_scale_into_q=False,
                vsmooth=vsmooth, block_m=block, block_n=block)


def test_kmeans_recovers_separated_clusters(gen):
    centres = torch.randn(4, 16, generator=gen) * 20
    truth = torch.randint(0, 4, (500,), generator=gen)
    x = centres[truth] + torch.randn(500, 16, generator=gen)
    labels, _ = kmeans(x[None, None], k=4, iters=20)
    labels = labels[0, 0]
    # Same partition up to renaming: every true cluster maps to exactly one label.
    for c in range(4):
        assert labels[truth == c].unique().numel() == 1
    assert labels.unique().numel() == 4


@pytest.mark.parametrize("order", ["kmeans", "sequence", "cube", "balanced"])
def test_mean_restoration_is_exact_in_float64(order, gen):
    # With every format exact, V-Smooth must reproduce softmax(S) V: the permutation is
    # absorbed by K and V together, and Equation 6 restores the subtracted block means.
    q, k, v = (torch.randn(1, 2, 300, 64, generator=gen, dtype=torch.float64) for _ in range(3))
    v = v + 5 * torch.randn(1, 2, 1, 64, generator=gen, dtype=torch.float64)
    config = VSmoothConfig(order=order, clusters=8, iters=5, block_rows=128, cube=(1, 2, 2))
    out = emulate(q, k, v, exact_plan(config), grid=(3, 10, 10))
    assert torch.allclose(out, reference_attention(q, k, v), rtol=0, atol=1e-12)


def test_permuting_k_and_v_together_leaves_bf16_unchanged(gen):
    import vcbench

    q, k, v = (torch.randn(1, 2, 384, 128, generator=gen).bfloat16() for _ in range(3))
    perm = torch.randperm(384, generator=gen)
    a = vcbench.attention(q, k, v, "bf16").float()
    b = vcbench.attention(q, k[:, :, perm], v[:, :, perm], "bf16").float()
    # Only FP32 summation order changes; both round to the same BF16 up to one unit.
    assert torch.allclose(a, b, rtol=2**-7, atol=1e-3)
    # In float64 with exact formats the identity is exact to rounding.
    q, k, v = q.double(), k.double(), v.double()
    a = emulate(q, k, v, exact_plan())
    b = emulate(q, k[:, :, perm], v[:, :, perm], exact_plan())
    assert torch.allclose(a, b, rtol=0, atol=1e-13)


def test_block_means_exclude_padding_and_energy_identity(gen):
    v = torch.randn(1, 1, 256, 8, generator=gen, dtype=torch.float64)
    v[..., 200:, :] = 0  # padding rows
    mu = block_means(v, 128, 200)
    assert torch.allclose(mu[..., 1, :], v[..., 128:200, :].mean(-2))
    # Equation 5: ||V - 1c^T||^2 = ||R||^2 + B ||c - mu||^2 for any c.
    block = v[0, 0, :128]
    c = torch.randn(8, generator=gen, dtype=torch.float64)
    r = block - mu[0, 0, 0]
    lhs = ((block - c) ** 2).sum()
    assert torch.isclose(lhs, (r**2).sum() + 128 * ((c - mu[0, 0, 0]) ** 2).sum())
    share = block_energy_share(v, 128, 200)[0, 0, 0]
    assert torch.isclose(share, 128 * (mu[0, 0, 0] ** 2).sum() / (block**2).sum())


def test_balanced_clusters_fill_whole_blocks(gen):
    x = torch.randn(1, 2, 640, 16, generator=gen)
    labels = balanced_labels(x, 128, iters=3)
    counts = torch.stack([torch.bincount(labels[0, h], minlength=5) for h in range(2)])
    assert torch.all(counts == 128)


def test_cube_order_keeps_each_block_in_one_cube():
    grid, cube = (4, 16, 16), (2, 8, 8)
    perm = torch.argsort(cube_keys(grid, cube, 4 * 16 * 16), stable=True)
    t, h, w = perm // 256, (perm // 16) % 16, perm % 16
    cube_id = (t // 2) * 4 + (h // 8) * 2 + w // 8
    assert torch.all(cube_id.view(-1, 128).amin(1) == cube_id.view(-1, 128).amax(1))


def test_kmeans_order_is_a_permutation_sorted_by_cluster(gen):
    v = torch.randn(1, 2, 500, 32, generator=gen)
    g = group(v, VSmoothConfig(clusters=8, iters=3))
    assert torch.equal(g.permutation.sort(-1).values, torch.arange(500).expand(1, 2, 500))
    # Tokens sorted by their nearest final centroid: the labels along the order never decrease.
    labels = torch.cdist(v.double(), g.centroids.double()).argmin(-1)
    assert torch.all(torch.gather(labels, -1, g.permutation).diff(dim=-1) >= 0)


def _nearest_centroid_order(v, centroids):
    """Tokens by the index of their nearest centroid (FP64 distances), ties in token order."""
    labels = torch.cdist(v.double(), centroids.double()).argmin(-1)
    return torch.argsort(labels, dim=-1, stable=True)


def test_warm_start_with_zero_iterations_labels_by_the_given_centroids(gen):
    v = torch.randn(1, 2, 500, 32, generator=gen)
    given = 2 * torch.randn(1, 2, 8, 32, generator=gen)
    warm = group(v, VSmoothConfig(clusters=8, iters=3, warm_iters=0), init=given)
    assert torch.equal(warm.permutation, _nearest_centroid_order(v, given))
    assert torch.equal(warm.centroids, given)
    # ...which is not what a cold start reaches: the given centroids really were used.
    cold = group(v, VSmoothConfig(clusters=8, iters=0, warm_iters=0))
    assert not torch.equal(cold.permutation, warm.permutation)


def test_warm_start_iterates_from_the_given_centroids(gen):
    """One warm iteration is one Lloyd step from the given centroids: each centroid moves to
    the mean of the tokens nearest to it (an empty cluster keeps its centroid)."""
    v = torch.randn(1, 1, 400, 16, generator=gen)
    given = 2 * torch.randn(1, 1, 6, 16, generator=gen)
    labels = torch.cdist(v.double(), given.double()).argmin(-1)[0, 0]
    step = given.double().clone()
    for c in range(6):
        if (labels == c).any():
            step[0, 0, c] = v.double()[0, 0, labels == c].mean(0)
    warm = group(v, VSmoothConfig(clusters=6, warm_iters=1), init=given)
    assert torch.allclose(warm.centroids.double(), step, rtol=0, atol=1e-5)
    assert torch.equal(warm.permutation, _nearest_centroid_order(v, warm.centroids))


@pytest.mark.parametrize("steps, window, regroup", [
    (40, 10, (0, 4, 8)),       # Wan2.2 (appendix A)
    (50, 13, (0, 4, 8, 12)),   # LongCat-Video
    (8, 2, (0,)),              # MiniMax-H3, 8-step LoRA
])
def test_leading_schedule_matches_appendix_a(steps, window, regroup):
    s = GroupingSchedule(steps)
    assert s.window == window == math.ceil(steps / 4)
    assert s.regroup_steps() == regroup
    actions = [s.action(i) for i in range(steps)]
    assert [i for i, a in enumerate(actions) if a == "regroup"] == list(regroup)
    assert all(a == "reuse" for i, a in enumerate(actions) if i < window and i not in regroup)
    assert all(a == "plain" for a in actions[window:])


def test_uniform_and_every_schedules():
    u = GroupingSchedule(40, placement="uniform")
    assert u.grouping_steps() == tuple(range(0, 40, 4))
    assert u.regroup_steps() == (0, 16, 32)
    assert u.action(1) == "plain" and u.action(4) == "reuse"
    e = GroupingSchedule(40, placement="every")
    assert e.regroup_steps() == tuple(range(0, 40, 4)) and e.action(39) == "reuse"
    r = GroupingSchedule(40, after_window="reuse")
    assert r.action(30) == "reuse"
    with pytest.raises(ValueError):
        GroupingSchedule(40).action(40)
    with pytest.raises(ValueError):
        GroupingSchedule(0)


def test_constant_blocks_keep_their_means(gen):
    # V constant within every block: every residual is zero, every channel's scale would be
    # zero; the restored means must still give the exact output.
    from conftest import rel_l2

    import vcbench

    q, k = (torch.randn(1, 1, 256, 64, generator=gen) for _ in range(2))
    v = torch.randn(1, 1, 1, 64, generator=gen).expand(1, 1, 256, 64).contiguous()
    out = vcbench.attention(q, k, v, "vc-8bit", vsmooth_order="sequence")
    assert rel_l2(out, reference_attention(q, k, v)) < 1e-3
