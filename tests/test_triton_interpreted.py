"""The Triton kernels' indexing on a CPU: Triton's interpreter runs them on CPU tensors.

What the interpreter can hold: which element every program reads and writes (strides, the
1-D grids, the (batch, head) bases, masks, padding) and the integer arithmetic. What it cannot:
its FP8 casts do not round as the GPU's `cvt.rn` does, so outputs are compared layout against
layout and head against head within one implementation, never against the emulation (the GPU
tests do that). The checks run in a subprocess because TRITON_INTERPRET must be set before
Triton compiles anything, and other tests may import it first.
"""


import pytest

pytest.importorskip("triton", reason="Triton is not installed")

from interpreted import INTERPRETED, rerun_interpreted  # noqa: E402

if not INTERPRETED:  # the driver: the checks below run in an interpreted subprocess
    def test_triton_kernels_under_the_interpreter():
        rerun_interpreted(__file__, timeout=1200)

else:
    import torch

    from vcbench.kernels import get_method
    from vcbench.kernels.backends.triton.attention import launch
    from vcbench.kernels.backends.triton.kmeans import kmeans_gpu
    from vcbench.kernels.backends.triton.operands import kernel_switches, prepare_gpu
    from vcbench.kernels.reference.engine import prepare
    from vcbench.kernels.reference.vsmooth import group
    from vcbench.kernels.spec.vsmooth import VSmoothConfig

    B, H, N, D = 2, 2, 200, 64  # a full KV tile and a padded one
    TRITON_METHODS = {"fp8-fa4": {}, "fp8-fa4+hadamard": {"hadamard_qk": True},
                      "sage2-8bit": {}, "vc-8bit": {}, "vc-8bit-vsmooth": {}, "vc-8bit-fp8qk": {}}

    def _run(name, q, k, v, permutation=None):
        """HND in (any strides), the Triton path's output (B, H, N, D)."""
        opts = TRITON_METHODS[name]
        plan = get_method(name.split("+")[0]).plan(opts)
        ops = prepare_gpu(q, k, v, plan, permutation=permutation)
        out = torch.empty(q.shape, dtype=q.dtype)
        return launch(ops, out, **kernel_switches(plan))

    def _inputs(dtype, seed=0):
        gen = torch.Generator().manual_seed(seed)
        return [torch.randn(B, H, N, D, generator=gen).to(dtype) for _ in range(3)]

    def _perm(name, v):
        return group(v, VSmoothConfig()).permutation if name.startswith("vc-") else None

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    @pytest.mark.parametrize("name", list(TRITON_METHODS))
    def test_strided_views_read_the_same_elements(name, dtype):
        q, k, v = _inputs(dtype)
        perm = _perm(name, v)
        ref = _run(name, q, k, v, perm)
        assert torch.isfinite(ref).all()
        bnhd = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
        views = [x.transpose(1, 2) for x in bnhd]  # (B, N, H, D) memory, HND view
        assert torch.equal(_run(name, *views, perm), ref)
        fused = torch.stack(bnhd, dim=2).unbind(2)  # fused QKV projection slices
        assert torch.equal(_run(name, *(x.transpose(1, 2) for x in fused), perm), ref)

    @pytest.mark.parametrize("name", list(TRITON_METHODS))
    def test_output_strides_are_honoured(name):
        q, k, v = _inputs(torch.bfloat16)
        perm = _perm(name, v)
        ref = _run(name, q, k, v, perm)
        plan = get_method(name.split("+")[0]).plan(TRITON_METHODS[name])
        ops = prepare_gpu(q, k, v, plan, permutation=perm)
        wide = torch.full((B, N, 3, H, D), float("nan"), dtype=torch.bfloat16)
        out = wide[:, :, 1].transpose(1, 2)  # an NHD slice of a wider buffer
        launch(ops, out, **kernel_switches(plan))
        assert torch.equal(out, ref)
        assert torch.isnan(wide[:, :, 0]).all() and torch.isnan(wide[:, :, 2]).all()

    @pytest.mark.parametrize("name", list(TRITON_METHODS))
    def test_each_batch_and_head_reads_its_own_slice(name):
        # Heads and batch entries of different content, each run alone and all together: the
        # 1-D grid's (batch, head) decode and the bases must pick the same rows.
        q, k, v = _inputs(torch.bfloat16, seed=1)
        perm = _perm(name, v)
        out = _run(name, q, k, v, perm)
        for b in range(B):
            for h in range(H):
                one = [x[b : b + 1, h : h + 1] for x in (q, k, v)]
                p = None if perm is None else perm[b : b + 1, h : h + 1]
                assert torch.equal(_run(name, *one, p), out[b : b + 1, h : h + 1])

    # The QK Hadamard fused in the quantizers (its butterfly in registers) on and off, at both
    # head dims, on inputs with channel outliers in Q and K: what the rotation is for.
    QK_CASES = [("sage2-8bit", {}, 64), ("sage2-8bit", {"hadamard_qk": True}, 64),
                ("sage2-8bit", {"hadamard_qk": True, "q_granularity": "block"}, 128),
                ("vc-8bit", {}, 64), ("vc-8bit", {}, 128), ("vc-8bit", {"hadamard_qk": False}, 64),
                ("vc-8bit-vsmooth", {}, 128), ("vc-8bit-fp8qk", {}, 128),
                ("fp8-fa4", {"hadamard_qk": True}, 128)]

    @pytest.mark.parametrize("name, opts, d", QK_CASES)
    def test_qk_codes_and_scales_equal_the_emulation(name, opts, d):
        # INT8 codes come from integer rounding, which the interpreter does exactly as the GPU;
        # E4M3 codes do not (see above), so for E4M3 only the scales, which are the amax of the
        # rotated, smoothed rows, are compared.
        gen = torch.Generator().manual_seed(2)
        q, k, v = (torch.randn(B, H, N, d, generator=gen) for _ in range(3))
        q[..., 3] *= 12
        k[..., 5] += 20
        q, k, v = (x.bfloat16() for x in (q, k, v))
        plan = get_method(name).plan(opts)
        perm = _perm(name, v)
        g = prepare_gpu(q, k, v, plan, permutation=perm)
        e = prepare(q, k, v, plan, permutation=perm)
        if plan.q.fmt.name == "int8":
            assert torch.equal(g.q.float(), e.q.codes.float())
            assert torch.equal(g.k.float(), e.k.codes.float())
        assert torch.equal(g.q_scale, e.q.scale.float())
        assert torch.equal(g.k_scale, e.k.scale.float())

    BAD = {"nan": float("nan"), "+inf": float("inf"), "-inf": -float("inf")}

    def _same(got, want):
        """Bit-equal, NaN matching NaN."""
        got, want = got.float().reshape(want.shape), want.float()
        return bool(((got == want) | (got.isnan() & want.isnan())).all())

    @pytest.mark.parametrize("name", list(TRITON_METHODS))
    def test_a_non_finite_value_poisons_its_batch_and_head_only(name):
        q, k, v = _inputs(torch.bfloat16, seed=3)
        perm = _perm(name, v)
        plan = get_method(name.split("+")[0]).plan(TRITON_METHODS[name])
        clean = _run(name, q, k, v, perm)
        others = torch.ones(B, H, dtype=torch.bool)
        others[1, 0] = False
        for i in range(3):
            for j, bad in enumerate(BAD.values()):
                poisoned = [x.clone() for x in (q, k, v)]
                poisoned[i][1, 0, 37, 5] = bad
                if i == j:  # the kernel once per operand (NaN in q, +inf in k, -inf in v)
                    out = _run(name, *poisoned, perm)
                    assert torch.equal(out[others], clean[others])
                    assert torch.isnan(out[1, 0]).all(), (i, bad)
                # the scales are the emulation's: NaN in the same places, equal elsewhere
                g = prepare_gpu(*poisoned, plan, permutation=perm)
                e = prepare(*poisoned, plan, permutation=perm)
                assert _same(g.q_scale, e.q.scale) and _same(g.k_scale, e.k.scale), (i, bad)
                assert _same(g.v_scale, e.v.scale) and torch.isnan(g.v_scale[1, 0]).all()
                if plan.vsmooth is not None:
                    assert _same(g.v_mean, e.v_mean), (i, bad)

    def test_kmeans_reads_strided_values():
        v = _inputs(torch.bfloat16, seed=4)[2]
        strided = torch.stack([v.transpose(1, 2).contiguous()] * 3, dim=2).unbind(2)[1]
        labels, centroids = kmeans_gpu(v, 16, 3)
        labels_s, centroids_s = kmeans_gpu(strided.transpose(1, 2), 16, 3)
        assert torch.equal(labels, labels_s) and torch.equal(centroids, centroids_s)
        # each (batch, head) clusters its own tokens: new content in batch entry 0 leaves
        # entry 1's labels as they were (the seeding's draws depend on the row, not on data)
        other = v.clone()
        other[0] = _inputs(torch.bfloat16, seed=5)[2][0]
        labels_o, _ = kmeans_gpu(other, 16, 3)
        assert torch.equal(labels_o[1], labels[1]) and not torch.equal(labels_o[0], labels[0])
