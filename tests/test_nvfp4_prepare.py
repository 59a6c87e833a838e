"""The NVFP4 preprocessing (triton/nvfp4.py `prepare`) under Triton's CPU interpreter, against
the emulation's `prepare`, operand by operand and bit for bit, for every 4-bit method with the
QK Hadamard on and off: E2M1 codes, E4M3 microscales, FP32 outer scales (a rotated operand's
from the amax pass), V-Smooth's FP16 block means, Q smoothing's block means, and what the bias
reads (the rotated block means, K's token mean, the gathered 16-bit K rows). Inputs: N not a
multiple of the tiles, a given permutation, channel and token outliers ("extreme": zero
blocks, saturating and subnormal microscales), NHD strides; a NaN or an infinity in one
(batch, head) with the rotation on. And `key_order="sm90"` (what the compiled kernel reads):
the same bits, K's and V's rows of each 128-key tile where `sm90_row` puts them.

On a GPU, the compiled kernels against the emulation on CUDA tensors (the comparison of
benchmarks/checks/nvfp4_prep_time.py). The attention kernel is not run here (tests/test_nvfp4_interpreter.py does): these cases stay
small so the interpreter takes seconds a case.
"""

import dataclasses

import pytest

pytest.importorskip("triton", reason="needs Triton (its interpreter runs the kernels on CPU)")

from conftest import rope_with_junk  # noqa: E402
from interpreted import INTERPRETED, rerun_interpreted  # noqa: E402

CASES = [  # (method, options, B, H, N, D, layout, inputs, permuted)
    ("sage3-4bit", {}, 1, 2, 150, 64, "hnd", "bf16", False),
    ("sage3-4bit", {"hadamard_qk": True}, 1, 2, 150, 64, "hnd", "extreme bf16", False),
    ("sage3-4bit", {"hadamard_qk": True}, 2, 1, 130, 128, "nhd", "fp16", False),
    ("vc-4bit", {}, 1, 2, 150, 64, "hnd", "extreme bf16", True),
    ("vc-4bit", {}, 1, 1, 200, 128, "nhd", "bf16", True),
    ("vc-4bit", {"hadamard_qk": False}, 1, 2, 150, 64, "nhd", "extreme fp16", True),
    ("attnqat-tf", {}, 1, 2, 150, 64, "hnd", "extreme fp16", False),
    ("attnqat-tf+hadamard", {}, 1, 2, 150, 64, "hnd", "extreme bf16", False),
    ("attnqat-tf+hadamard", {}, 2, 1, 100, 128, "nhd", "bf16", False),
]


def case_id(case):
    method, opts, b, h, n, d, layout, kind, permuted = case
    extra = ",".join(f"{k}={v}" for k, v in opts.items())
    return f"{method}[{extra}] B{b}H{h}N{n}D{d} {layout} {kind}{' perm' if permuted else ''}"


if not INTERPRETED:  # the driver: the checks below run in an interpreted subprocess
    import sys
    from pathlib import Path

    from vcbench.kernels import backends

    def test_nvfp4_prepare_under_the_interpreter():
        rerun_interpreted(__file__, timeout=1500)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "checks"))
    from nvfp4_prep_time import PLANS, check  # noqa: E402

    @pytest.mark.gpu
    @pytest.mark.skipif(not backends.triton_ready(), reason="needs a CUDA GPU (sm_90+) and Triton")
    @pytest.mark.parametrize("label", list(PLANS))
    def test_compiled_prepare_is_the_emulations_bit_for_bit(label):
        """The compiled kernels (Markstein's divisions, the GPU's layouts) on CUDA tensors, a
        NaN in K included: the device check's own comparison."""
        assert check(label) == 0

else:
    import torch
    from nvfp4_interpreter_driver import differing, inputs, operand_differences

    from vcbench.kernels import get_method
    from vcbench.kernels.backends.triton import nvfp4
    from vcbench.kernels.reference.engine import prepare
    from vcbench.kernels.reference.vsmooth import permute_tokens, token_mean
    from vcbench.kernels.spec.rope import apply_rope
    from vcbench.kernels.spec.rotation import rotate

    def plan_of(method, opts):
        """The method's plan; "+hadamard" rotates Q and K of a plan that has no such option
        (attnqat-tf: outer scales of rotated operands, the amax pass)."""
        name, _, extra = method.partition("+")
        plan = get_method(name).plan(opts)
        return dataclasses.replace(plan, hadamard_qk=True) if extra == "hadamard" else plan

    def permutation(b, h, n, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.stack([torch.randperm(n, generator=g) for _ in range(b * h)]).view(b, h, n)

    def all_differences(q, k, v, plan, perm, rope=None):
        """Elements differing from the emulation, per operand (see operand_differences), and
        of what the bias reads, against their definitions in `Nvfp4Operands`. With `rope`, q
        and k come before RoPE: the emulation applies it first, the quantizers on load."""
        emu = prepare(q, k, v, plan, permutation=perm, rope=rope)
        ops = nvfp4.prepare(q, k, v, plan, permutation=perm, rope=rope)
        diff = operand_differences(ops, emu)
        b, h, n, d = q.shape
        if plan.smooth_q:
            k = k if rope is None else apply_rope(k, rope)
            gathered = k if perm is None else permute_tokens(k, perm.long())
            diff["K input"] = differing(ops.k_input.reshape(b * h, n, d),
                                        gathered.reshape(b * h, n, d))
            assert ops.k_input.dtype == k.dtype
            mean = token_mean(gathered.float()) if plan.smooth_k else torch.zeros(b, h, 1, d)
            diff["K mean"] = differing(ops.k_mean, mean.reshape(b * h, d))
            bias = rotate(emu.q_mean) if plan.hadamard_qk else emu.q_mean
            diff["Q bias means"] = differing(ops.bias_q, bias.reshape(ops.bias_q.shape))
        return diff, ops, emu

    @pytest.mark.parametrize("case", CASES, ids=case_id)
    def test_prepare_is_the_emulations_bit_for_bit(case):
        method, opts, b, h, n, d, layout, kind, permuted = case
        seed = 3000 + CASES.index(case)
        q, k, v = inputs(b, h, n, d, layout, kind, seed)
        plan = plan_of(method, opts)
        perm = permutation(b, h, n, seed) if permuted else None
        diff, ops, _ = all_differences(q, k, v, plan, perm)
        wrong = {what: count for what, count in diff.items() if count != 0}
        assert not wrong, f"differing elements (-1: missing): {wrong}"
        expected = {"Q codes", "K codes", "V codes"}
        if plan.q.granularity.global_scale:
            expected |= {"Q outer scale", "K outer scale", "V outer scale"}
        if plan.smooth_q:
            expected |= {"Q block means", "K input", "K mean", "Q bias means"}
        if plan.vsmooth is not None:
            expected.add("V block means")
        assert expected <= set(diff)
        assert torch.isfinite(ops.v).all() and torch.isfinite(ops.q_scale).all()

    @pytest.mark.parametrize("case", CASES, ids=case_id)
    def test_prepare_with_rope_fused_is_the_emulations_with_rope_first(case):
        """RoPE fused into the Q and K quantizers (and K's token mean, Q's block means, the
        outer scales' amax pass, the K rows the bias reads) against the emulation given the
        same tables, which rotates q and k first as a pipeline does: bit for bit. And the
        tables change the codes (RoPE is not skipped)."""
        method, opts, b, h, n, d, layout, kind, permuted = case
        seed = 6000 + CASES.index(case)
        q, k, v = inputs(b, h, n, d, layout, kind, seed)
        rope = rope_with_junk(n, d, "cpu")
        plan = plan_of(method, opts)
        perm = permutation(b, h, n, seed) if permuted else None
        diff, ops, _ = all_differences(q, k, v, plan, perm, rope)
        wrong = {what: count for what, count in diff.items() if count != 0}
        assert not wrong, f"differing elements (-1: missing): {wrong}"
        plain = nvfp4.prepare(q, k, v, plan, permutation=perm)
        assert differing(ops.codes("k"), plain.codes("k")) > 0

    @pytest.mark.parametrize("case", [
        ("vc-4bit", {}, 1, 2, 150, 64, "hnd", "extreme fp32", True),
        ("sage3-4bit", {"hadamard_qk": True}, 2, 1, 130, 128, "nhd", "fp32", False),
    ], ids=case_id)
    def test_fp32_inputs_are_the_emulations_bit_for_bit(case):
        """FP32 q, k, v (no 16-bit rounding anywhere before the quantizers): K's token mean
        is then an FP64 sum of FP32 values, the path's one token-sum kernel with the 8-bit
        methods' (`quantize.token_mean_gpu`), and the bias reads FP32 K rows."""
        method, opts, b, h, n, d, layout, kind, permuted = case
        q, k, v = inputs(b, h, n, d, layout, kind, seed=7000 + n)
        plan = plan_of(method, opts)
        perm = permutation(b, h, n, 7000) if permuted else None
        diff, ops, _ = all_differences(q, k, v, plan, perm)
        wrong = {what: count for what, count in diff.items() if count != 0}
        assert not wrong, f"differing elements (-1: missing): {wrong}"
        assert {"K mean", "K input"} <= set(diff) and ops.k_input.dtype == torch.float32

    @pytest.mark.parametrize("method,opts", [("vc-4bit", {}), ("sage3-4bit", {"hadamard_qk": True}),
                                             ("attnqat-tf", {})])
    def test_the_kernels_key_order_moves_k_and_v_rows_and_nothing_else(method, opts):
        """`key_order="sm90"` (what the compiled kernel reads): K's and V's values with each
        128-key tile's rows where `sm90_row` puts them, a permutation of the natural order's
        rows within the tile (padding rows too), every other field the same bits; codes and
        `in_key_order` read the natural order back; a NaN head stays NaN."""
        b, h, n, d = 1, 2, 300, 64
        q, k, v = inputs(b, h, n, d, "hnd", "extreme bf16", seed=8000)
        v[0, 1, 77, 3] = float("nan")
        plan = plan_of(method, opts)
        perm = permutation(b, h, n, 8000) if plan.vsmooth is not None else None
        natural = nvfp4.prepare(q, k, v, plan, permutation=perm)
        ordered = nvfp4.prepare(q, k, v, plan, permutation=perm, key_order="sm90")
        n_pad = natural.k.shape[1]
        assert n_pad == 384 and ordered.key_order == "sm90" and natural.key_order == "natural"
        at = nvfp4.sm90_rows(n_pad)
        for name in ("k", "v"):
            mine, theirs = getattr(ordered, name), getattr(natural, name)
            assert mine.shape == theirs.shape
            assert differing(mine[:, at], theirs) == 0, name  # key r lies at row at[r]
            assert differing(ordered.in_key_order(name), theirs) == 0, name
            assert differing(ordered.codes(name), natural.codes(name)) == 0, name
            assert differing(mine, theirs) > 0, name  # the rows did move
        for field in ("q", "q_scale", "k_scale", "v_scale", "v_mean", "v_outer", "q_outer",
                      "k_outer", "bias_q", "k_mean", "k_input"):
            mine, theirs = getattr(ordered, field), getattr(natural, field)
            assert (mine is None) == (theirs is None), field
            if mine is not None:
                assert differing(mine, theirs) == 0, field
        assert ordered.v[1].isnan().all() and not ordered.v[0].isnan().any()
        with pytest.raises(ValueError, match="key_order"):
            nvfp4.prepare(q, k, v, plan, permutation=perm, key_order="columns")

    @pytest.mark.parametrize("method,opts,operand,bad", [
        ("vc-4bit", {}, "k", float("nan")),
        ("sage3-4bit", {"hadamard_qk": True}, "q", float("inf")),
        ("attnqat-tf+hadamard", {}, "q", -float("inf")),
        ("attnqat-tf+hadamard", {}, "v", float("nan")),
    ])
    def test_a_non_finite_input_poisons_its_head_rotated_or_not(method, opts, operand, bad):
        b, h, n, d = 2, 2, 100, 64
        q, k, v = inputs(b, h, n, d, "hnd", "bf16", seed=4000)
        {"q": q, "k": k, "v": v}[operand][1, 0, 37, 5] = bad
        plan = plan_of(method, opts)
        perm = permutation(b, h, n, 4000) if plan.vsmooth is not None else None
        diff, ops, emu = all_differences(q, k, v, plan, perm)
        wrong = {what: count for what, count in diff.items() if count != 0}
        assert not wrong, f"differing elements (-1: missing): {wrong}"
        poisoned = 1 * h + 0
        assert ops.v[poisoned].isnan().all()
        assert ops.v_scale[poisoned].isnan().all()
        clean = torch.ones(b * h, dtype=torch.bool)
        clean[poisoned] = False
        assert not ops.v[clean].isnan().any()

    @pytest.mark.parametrize("steps", [(16, 2, 64, 4), (64, 8, 16, 4)])
    def test_the_quantizers_step_sizes_do_not_change_a_bit(steps, monkeypatch):
        """QK_CHUNK, QK_WARPS, V_CHUNK, V_WARPS (the GPU benchmark sweeps them)."""
        for name, value in zip(("QK_CHUNK", "QK_WARPS", "V_CHUNK", "V_WARPS"), steps, strict=True):
            monkeypatch.setattr(nvfp4, name, value)
        for method, extra in [("vc-4bit", {}), ("attnqat-tf+hadamard", {})]:
            q, k, v = inputs(1, 2, 150, 64, "hnd", "extreme bf16", seed=5000)
            plan = plan_of(method, extra)
            perm = permutation(1, 2, 150, 5000) if plan.vsmooth is not None else None
            diff, _, _ = all_differences(q, k, v, plan, perm)
            wrong = {what: count for what, count in diff.items() if count != 0}
            assert not wrong, f"{method}: differing elements (-1: missing): {wrong}"
