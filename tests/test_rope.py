"""RoPE given to the attention call (spec.rope): the result is exactly that of rotating q and
k as diffusers' WanAttnProcessor does, then calling the method.

On the emulation (every method) and for an external kernel, by identity with the eager
rotation. For the Triton 8-bit quantizers, which rotate on load: codes, scales and means
bit-equal to quantizing the eagerly rotated tensors, under Triton's CPU interpreter (a
subprocess: TRITON_INTERPRET must be set before Triton compiles anything), on tensors with
token and channel outliers, for the VC methods with and without the QK Hadamard, with the
V-Smooth gather, in BF16 and FP16. Both sides there run the interpreter's own FP8 cast, so
the E4M3 codes compare too; against the emulation itself, the INT8 codes and every scale.
"""

import pytest
import torch
from conftest import rope_with_junk
from interpreted import INTERPRETED, rerun_interpreted

from vcbench.errors import UserError
from vcbench.kernels import METHODS, attention, register_kernel
from vcbench.kernels.spec.rope import Rope, apply_rope

B, H, N, D = 1, 2, 200, 64  # a full 128-token tile and a padded one


def inputs(dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(3))
    k[..., 7] += 8.0  # a channel outlier (the Hadamard spreads it, K's mean takes it)
    q[:, :, 11] *= 40.0  # a token outlier (its block's scale)
    k[:, 1, 150] *= 60.0
    return q.to(dtype), k.to(dtype), v.to(dtype), rope_with_junk(N, D, "cpu")


def wan_rotation(x, rope):
    """diffusers' WanAttnProcessor.apply_rotary_emb, verbatim, on its (B, N, H, D) layout with
    its (1, N, 1, D) tables: the golden the spec must equal."""
    x = x.transpose(1, 2)
    freqs_cos, freqs_sin = rope.cos[None, :, None, :], rope.sin[None, :, None, :]
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x).transpose(1, 2)


if not INTERPRETED:
    def test_fused_rope_quantizers_under_the_interpreter():
        pytest.importorskip("triton", reason="Triton is not installed")
        rerun_interpreted(__file__, timeout=900)

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    def test_apply_rope_is_diffusers_rotation(dtype):
        q, _, _, rope = inputs(dtype)
        assert torch.equal(apply_rope(q, rope), wan_rotation(q, rope))
        assert not torch.equal(apply_rope(q, rope), q)

    @pytest.mark.parametrize("method", METHODS.builtin_names())
    def test_every_method_with_rope_is_rotate_then_run(method):
        q, k, v, rope = inputs(seed=1)
        want = attention(apply_rope(q, rope), apply_rope(k, rope), v, method)
        got = attention(q, k, v, method, rope=(rope.cos, rope.sin))
        assert torch.equal(got, want)

    def test_layouts_and_table_shapes():
        q, k, v, rope = inputs(seed=2)
        want = attention(apply_rope(q, rope), apply_rope(k, rope), v, "vc-8bit")
        nhd = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
        wan = (rope.cos[None, :, None], rope.sin[None, :, None])  # diffusers' (1, N, 1, D)
        got = attention(*nhd, "vc-8bit", tensor_layout="NHD", rope=wan)
        assert torch.equal(got.transpose(1, 2), want)
        hnd = (rope.cos[None, None], rope.sin[None, None])
        assert torch.equal(attention(q, k, v, "vc-8bit", rope=hnd), want)
        with pytest.raises(UserError, match=r"rope's cos table has shape \(1, 200, 1, 64\)"):
            attention(q, k, v, "vc-8bit", rope=wan)  # NHD tables for HND q
        with pytest.raises(UserError, match="rope must be"):
            attention(q, k, v, "vc-8bit", rope=rope.cos)

    def test_the_custom_op_carries_the_tables_eager_and_compiled():
        from vcbench.kernels import ops

        q, k, v, rope = inputs(seed=7)
        want = attention(q, k, v, "vc-8bit", rope=(rope.cos, rope.sin))
        assert torch.equal(ops.attention(q, k, v, "vc-8bit", rope=(rope.cos, rope.sin)), want)
        nhd = [x.transpose(1, 2) for x in (q, k, v)]
        wan = (rope.cos[None, :, None], rope.sin[None, :, None])
        got = ops.attention(*nhd, "vc-8bit", tensor_layout="NHD", rope=wan)
        assert torch.equal(got.transpose(1, 2), want)
        compiled = torch.compile(lambda a, b, c, cos, sin: ops.attention(a, b, c, "vc-8bit",
                                                                          rope=(cos, sin)),
                                 backend="eager", fullgraph=True)
        assert torch.equal(compiled(q, k, v, rope.cos, rope.sin), want)

    def test_an_external_kernel_gets_rotated_q_and_k():
        seen = {}

        def kernel(q, k, v, *, sm_scale, tensor_layout):
            seen["q"], seen["k"] = q, k
            return v.clone()

        register_kernel("test-rope-probe", kernel, devices=("cpu",))
        q, k, v, rope = inputs(seed=3)
        attention(q, k, v, "test-rope-probe", rope=rope)
        assert torch.equal(seen["q"], apply_rope(q, rope))
        assert torch.equal(seen["k"], apply_rope(k, rope))

    @pytest.mark.parametrize("kernel", ["_quantize_rows", "_token_sums"])
    def test_the_fused_rope_compiles_for_sm90_without_an_fma(kernel):
        # what the interpreter cannot see: the kernels build for the GPU, and the rotation's
        # products stay rounded on their own (no FMA beyond the kernel's without RoPE)
        import re

        triton = pytest.importorskip("triton", reason="Triton is not installed")
        from triton.compiler import ASTSource

        try:
            from triton.backends.compiler import GPUTarget
        except ImportError:  # pragma: no cover - a Triton without the NVIDIA backend
            pytest.skip("Triton has no NVIDIA backend here")
        from vcbench.kernels.backends.triton import quantize as tq

        fn = getattr(tq, kernel)
        pointers = {"X": "bf16", "Perm": "i32", "Mean": "fp32", "Out": "i8", "Scale": "fp32",
                    "Cos": "fp32", "Sin": "fp32", "Sums": "fp64"}
        base = (dict(ROWS=16, D=128, FMT=0, HAS_PERM=True, HAS_MEAN=True, MULTIPLY=True,
                     HADAMARD=True, LOG2_D=7) if kernel == "_quantize_rows"
                else dict(ROWS=64, D=128, TILES=16))

        def fmas(rope):
            constexprs = {**base, "ROPE": rope}
            signature = {n: "constexpr" if n in constexprs else "*" + pointers[n] if n in pointers
                         else "fp32" if n in ("multiplier", "norm") else "i32"
                         for n in fn.arg_names}
            ptx = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs),
                                 target=GPUTarget("cuda", 90, 32)).asm["ptx"]
            return len(re.findall(r"\bfma\.", ptx))

        assert fmas(tq.ROUND_BF16) == fmas(tq.ROUND_FP16) == fmas(tq.ROUND_NONE)

    def test_every_backend_on_the_triton_quantizers_fuses_rope():
        # The compiled sm_90 kernels read the codes of the same Triton quantizers (8-bit and
        # NVFP4), so they fuse RoPE too (tests/test_nvfp4_prepare.py holds the NVFP4 codes).
        from vcbench.kernels import fuses_rope, rope_placement
        from vcbench.kernels.backends import BACKENDS

        assert sorted(b.name for b in BACKENDS.values() if fuses_rope(b)) == [
            "vcbench-sm90", "vcbench-sm90 (nvfp4 on fp16 wgmma)", "vcbench-triton",
            "vcbench-triton (nvfp4 on fp16 mma)"]
        triton = BACKENDS.get("vcbench-triton")
        rope = inputs()[3]
        assert fuses_rope(triton, rope)
        assert not fuses_rope(triton, Rope(rope.cos.double(), rope.sin.double()))  # FP32 only
        assert not fuses_rope(None)  # the emulation rotates first
        assert rope_placement("vc-8bit", {}, "gpu", on_cuda=False) == "eager"

else:
    import triton
    import triton.language as tl

    from vcbench.kernels import get_method
    from vcbench.kernels.backends.triton.operands import prepare_gpu
    from vcbench.kernels.backends.triton.quantize import _round_bf16
    from vcbench.kernels.reference.engine import prepare
    from vcbench.kernels.reference.vsmooth import group

    CASES = {"vc-8bit": {}, "vc-8bit, no hadamard": {"hadamard_qk": False},
             "vc-8bit-vsmooth": {}, "vc-8bit-vsmooth, no hadamard": {"hadamard_qk": False},
             "vc-8bit-fp8qk": {}, "sage2-8bit": {}}
    FIELDS = ("q", "q_scale", "k", "k_scale", "v_t", "v_scale", "v_mean")

    @pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
    @pytest.mark.parametrize("case", list(CASES))
    def test_fused_rope_codes_equal_eager_rope_codes(case, dtype):
        q, k, v, rope = inputs(dtype, seed=4)
        plan = get_method(case.split(",")[0]).plan(CASES[case])
        perm = None if plan.vsmooth is None else group(v, plan.vsmooth).permutation
        fused = prepare_gpu(q, k, v, plan, permutation=perm, rope=rope)
        eager = prepare_gpu(apply_rope(q, rope), apply_rope(k, rope), v, plan, permutation=perm)
        plain = prepare_gpu(q, k, v, plan, permutation=perm)
        for name in FIELDS:
            a, b = getattr(fused, name), getattr(eager, name)
            if a is None:
                assert b is None
                continue
            assert torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                               b.view(torch.uint8) if b.element_size() == 1 else b), name
        assert not torch.equal(fused.k.view(torch.uint8), plain.k.view(torch.uint8))

    @pytest.mark.parametrize("case", [c for c in CASES if "fp8qk" not in c])
    def test_fused_rope_int8_codes_and_scales_equal_the_emulations(case):
        # against the oracle itself (torch's eager rotation, then the emulation's quantizers):
        # INT8 Q/K codes and every scale; E4M3 codes go through the interpreter's own FP8 cast
        q, k, v, rope = inputs(seed=6)
        plan = get_method(case.split(",")[0]).plan(CASES[case])
        emu = prepare(q, k, v, plan, rope=rope)
        ops = prepare_gpu(q, k, v, plan, permutation=emu.permutation, rope=rope)
        for got, want in ((ops.q, emu.q.codes), (ops.k, emu.k.codes), (ops.q_scale, emu.q.scale),
                          (ops.k_scale, emu.k.scale), (ops.v_scale, emu.v.scale)):
            assert torch.equal(got.float(), want.float())

    def test_a_strided_nhd_view_rotates_the_same_rows():
        q, k, v, rope = inputs(seed=5)
        plan = get_method("vc-8bit-vsmooth").plan()
        perm = group(v, plan.vsmooth).permutation
        views = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
        a = prepare_gpu(*views, plan, permutation=perm, rope=rope)
        b = prepare_gpu(q, k, v, plan, permutation=perm, rope=rope)
        assert torch.equal(a.k, b.k) and torch.equal(a.q, b.q) and torch.equal(a.k_scale, b.k_scale)

    @triton.jit
    def _round_bf16_kernel(X, Y, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(Y + i, _round_bf16(tl.load(X + i, mask=i < n)), mask=i < n)

    def test_rounding_to_bf16_on_the_bits_is_torchs():
        # ties, both parities, subnormals, the largest finite values, infinities and NaN
        bits = torch.tensor([0x3F808000, 0x3F818000, 0x3F807FFF, 0x3F808001, 0x00008000,
                             0x00018000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000, 0x7FC00000,
                             0x7F800001, 0x80000000], dtype=torch.int64).to(torch.int32)
        x = torch.cat([bits.view(torch.float32), torch.randn(500) * 1e3])
        y = torch.empty_like(x)
        _round_bf16_kernel[(1,)](x, y, x.numel(), BLOCK=1024)
        want = x.to(torch.bfloat16).float()
        assert torch.equal(y.isnan(), want.isnan())
        assert torch.equal(y[~y.isnan()], want[~want.isnan()])
