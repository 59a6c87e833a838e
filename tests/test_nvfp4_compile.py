"""The NVFP4 kernels and the 8-bit quantizers compile for sm_90 (Triton's own ptxas), on a
machine without a GPU, as a launch at the Wan2.2 shape builds them, with no register spills
and no local memory.

The interpreter (tests/test_nvfp4_interpreter.py) runs the kernels' Python; it does not see
what only the compiler refuses (a non-constexpr global, a layout it cannot lower), nor what it
makes of the kernel: a spill costs every KV tile of every program a round trip to local
memory, which is why the attention kernel was 5-7x BF16's time.
"""

import re
import shutil
import subprocess

import pytest

triton = pytest.importorskip("triton", reason="needs Triton")
from triton.compiler import ASTSource  # noqa: E402

try:
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
except ImportError:  # pragma: no cover - a Triton without the NVIDIA backend
    pytest.skip("Triton has no NVIDIA backend here", allow_module_level=True)

from vcbench.kernels import get_method  # noqa: E402
from vcbench.kernels.backends.triton import nvfp4, nvfp4_attention  # noqa: E402

if not hasattr(nvfp4._quantize_qk, "cache_key"):  # TRITON_INTERPRET set: nothing to compile
    pytest.skip("Triton runs in its interpreter here (TRITON_INTERPRET)", allow_module_level=True)

POINTERS = {  # argument name -> element type, as prepare / launch pass them
    "Q": "fp16", "K": "fp16", "V": "fp16", "Values": "fp16", "Qs": "fp16", "Ks": "fp16",
    "Vs": "fp16", "Scales": "fp16", "VM": "fp16", "StoredMeans": "fp16", "QO": "fp32",
    "KO": "fp32", "VO": "fp32", "BiasQ": "fp32", "KMean": "fp32", "Mean": "fp32",
    "Outer": "fp32", "QMean": "fp32", "KIn": "bf16", "X": "bf16", "Gathered": "bf16",
    "Sums": "fp64", "Perm": "i32", "Out": "bf16", "BlockAmax": "fp32", "ValuesT": "fp16", "Bad": "i32",
    "Cos": "fp32", "Sin": "fp32"}


# Integer arguments at the Wan2.2 shape (B1 H40 N75600 D128, HND): a launch specializes every
# one divisible by 16 (and every pointer, 16-byte aligned by torch) as divisible, and without
# that the compiler cannot vectorize or pipeline a load.
WAN22_INTS = {"n": 75600, "n_q_pad": 75648, "n_k_pad": 75648, "n_pad": 75648, "H": 40,
              "stride_b": 40 * 75600 * 128, "stride_h": 75600 * 128, "stride_n": 128,
              "stride_ob": 40 * 75600 * 128, "stride_oh": 75600 * 128, "stride_on": 128}


def compile_for_sm90(kernel, constexprs, pointers=None, **options):
    """`kernel` built for sm_90 as a launch at the Wan2.2 shape would build it (`pointers`:
    element types that differ from POINTERS' for this kernel)."""
    types = {**POINTERS, **(pointers or {})}
    signature, attrs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        if name in types:
            signature[name] = "*" + types[name]
        else:
            signature[name] = "fp32" if name in ("multiplier", "norm") else "i32"
        if name in types or WAN22_INTS.get(name, 1) % 16 == 0:
            attrs[(i,)] = [["tt.divisibility", 16]]
    return triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs,
                                    attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)


def cuobjdump() -> str:
    try:
        from triton import knobs

        return knobs.nvidia.cuobjdump.path
    except (ImportError, AttributeError):  # pragma: no cover - an older Triton
        found = shutil.which("cuobjdump")
        if found is None:
            pytest.skip("no cuobjdump (Triton's or CUDA's) to read the cubin with")
        return found


def resources(compiled, tmp_path) -> dict:
    """ptxas's allocation of the kernel (registers, stack frame, local memory) and the local
    loads and stores in its SASS."""
    cubin = tmp_path / "kernel.cubin"
    cubin.write_bytes(compiled.asm["cubin"])
    usage = subprocess.run([cuobjdump(), "-res-usage", str(cubin)], check=True,
                           capture_output=True, text=True).stdout
    sass = subprocess.run([cuobjdump(), "-sass", str(cubin)], check=True, capture_output=True,
                          text=True).stdout
    found = {key: int(re.search(rf"{key}:(\d+)", usage).group(1))
             for key in ("REG", "STACK", "LOCAL")}
    found["LDL/STL"] = len(re.findall(r"\b(?:LDL|STL)\b", sass))
    return found


VARIANTS = {  # every kernel a method's plan selects, vc-4bit's plain steps among them
    "sage3-4bit": ("sage3-4bit", {}), "vc-4bit": ("vc-4bit", {}),
    "vc-4bit-plain": ("vc-4bit", {"vsmooth": False}), "attnqat-tf": ("attnqat-tf", {})}


@pytest.mark.parametrize("variant", VARIANTS)
def test_attention_kernel_uses_wgmma_and_does_not_spill(variant, tmp_path):
    method, opts = VARIANTS[variant]
    plan = get_method(method).plan(opts)
    compiled = compile_for_sm90(nvfp4_attention._nvfp4_attention_fwd,
                                {**nvfp4_attention.switches(plan), "BLOCK_M": plan.block_m,
                                 "BLOCK_N": plan.block_n, "D": 128},
                                num_warps=nvfp4_attention.NUM_WARPS,
                                num_stages=nvfp4_attention.NUM_STAGES)
    assert "wgmma.mma_async" in compiled.asm["ptx"]  # both products on Hopper's tensor cores
    assert "cp.async" in compiled.asm["ptx"]  # K and V tiles streamed into shared memory
    used = resources(compiled, tmp_path)
    assert (used["STACK"], used["LOCAL"], used["LDL/STL"]) == (0, 0, 0), used


QK_PLAIN = dict(HADAMARD=False, LOG2_D=0, AMAX_ONLY=False, ROPE=0)
QK_ROTATED = dict(HADAMARD=True, LOG2_D=7, AMAX_ONLY=False, ROPE=0)
ROPE_BF16 = 1  # quantize.ROUND_BF16: Wan's RoPE fused, bf16 inputs
SMOOTH_TILE = dict(ROWS=128, CHUNK=nvfp4.QK_CHUNK)  # Q smoothing: the query tile, in steps
STEP = dict(ROWS=nvfp4.QK_CHUNK, CHUNK=nvfp4.QK_CHUNK)


def _qk(perm, mean, multiply, smooth, outer, gathered, switches, tile, sm90_order=False):
    return ("_quantize_qk", dict(HAS_PERM=perm, HAS_MEAN=mean, MULTIPLY=multiply, SMOOTH=smooth,
                                 OUTER=outer, GATHER_OUT=gathered, SM90_ORDER=sm90_order,
                                 **switches, **tile))


def _v(perm, demean, outer, sm90_order, rows):
    return ("_quantize_v", dict(HAS_PERM=perm, DEMEAN=demean, OUTER=outer, SM90_ORDER=sm90_order,
                                ROWS=rows, CHUNK=nvfp4.V_CHUNK))


ROTATED_ROPE = {**QK_ROTATED, "ROPE": ROPE_BF16}
# Every preprocessing kernel configuration `nvfp4.prepare` launches for the 4-bit methods, by
# name: (kernel, constexprs); benchmarks/checks/nvfp4_compile_report.py reports this table.
# _qk: (perm, mean, multiply, smooth, outer, gathered rows out, switches, rows a program)
PREPROCESSING = {
    "q-smooth": _qk(False, False, True, True, False, False, QK_PLAIN, SMOOTH_TILE),
    "k-smooth": _qk(True, True, False, False, False, True, QK_PLAIN, STEP),
    "qk-outer": _qk(False, False, True, False, True, False, QK_PLAIN, STEP),
    "q-rotated": _qk(False, False, True, True, False, False, QK_ROTATED, SMOOTH_TILE),
    "k-rotated": _qk(True, True, False, False, False, True, QK_ROTATED, STEP),
    "amax-rotated": _qk(False, False, True, False, False, False,
                        {**QK_ROTATED, "AMAX_ONLY": True}, STEP),
    "q-rotated-rope": _qk(False, False, True, True, False, False, ROTATED_ROPE, SMOOTH_TILE),
    "k-rotated-rope": _qk(True, True, False, False, False, True, ROTATED_ROPE, STEP, True),
    "k-rope": _qk(False, True, False, False, False, True, {**QK_PLAIN, "ROPE": ROPE_BF16}, STEP),
    "amax-rope": _qk(False, False, True, False, False, False,
                     {**QK_PLAIN, "AMAX_ONLY": True, "ROPE": ROPE_BF16}, STEP),
    # V's rows in the compiled kernel's key order; in the natural one, as the Triton kernel's
    "v-vsmooth-sm90": _v(True, True, False, True, 128),
    "v-outer": _v(False, False, True, False, nvfp4.V_CHUNK),
}


@pytest.mark.parametrize("name", PREPROCESSING)
def test_preprocessing_kernels_compile_without_spills(name, tmp_path):
    kernel, constexprs = PREPROCESSING[name]
    warps = {"_quantize_qk": nvfp4.QK_WARPS, "_quantize_v": nvfp4.V_WARPS}
    compiled = compile_for_sm90(getattr(nvfp4, kernel), {**constexprs, "D": 128},
                                num_warps=warps.get(kernel, nvfp4.NUM_WARPS),
                                enable_fp_fusion=False)
    used = resources(compiled, tmp_path)
    assert (used["STACK"], used["LOCAL"], used["LDL/STL"]) == (0, 0, 0), used


def test_the_score_term_runs_on_tf32_tensor_cores_in_shared_memory(tmp_path):
    """Q smoothing's score term (the compiled NVFP4 path's): TF32 wgmmas, and its key tiles
    inside sm_90's 227 KB of shared memory. It spills (128 query blocks' split means take 128
    registers a thread), and is held to no spill-free rule: on the H200 this tile ran in 8.8 ms
    at the Wan2.2 shape, every spill-free tile timed beside it in 11.3 ms or more."""
    compiled = compile_for_sm90(
        nvfp4._score_term, {"D": 128, "BM": nvfp4.SCORE_BLOCK_M, "BN": nvfp4.SCORE_BLOCK_N,
                            "TILES": nvfp4.SCORE_TILES},
        pointers={"Out": "fp32"}, num_warps=nvfp4.SCORE_WARPS, num_stages=nvfp4.SCORE_STAGES)
    assert len(re.findall(r"wgmma\.mma_async\S*\.tf32", compiled.asm["ptx"])) >= 3
    assert compiled.metadata.shared <= 227 * 1024


@pytest.mark.parametrize("k_input", ["bf16", "fp16"])
def test_the_16bit_score_term_runs_two_tf32_products_without_spills(k_input, tmp_path):
    """The uncentered score term for 16-bit K_in (exact in TF32): two TF32 products a key tile
    (a third fewer wgmmas than the centered form's three), at the shipped tile without a
    spill."""
    compiled = compile_for_sm90(
        nvfp4._score_term_16bit, {"D": 128, "BM": nvfp4.SCORE_BLOCK_M, "BN": nvfp4.SCORE_BLOCK_N,
                                  "TILES": nvfp4.SCORE_TILES},
        pointers={"Out": "fp32", "KIn": k_input}, num_warps=nvfp4.SCORE_WARPS,
        num_stages=nvfp4.SCORE_STAGES)
    centered = compile_for_sm90(
        nvfp4._score_term, {"D": 128, "BM": nvfp4.SCORE_BLOCK_M, "BN": nvfp4.SCORE_BLOCK_N,
                            "TILES": nvfp4.SCORE_TILES},
        pointers={"Out": "fp32"}, num_warps=nvfp4.SCORE_WARPS, num_stages=nvfp4.SCORE_STAGES)
    tf32 = [len(re.findall(r"wgmma\.mma_async\S*\.tf32", c.asm["ptx"])) for c in (compiled, centered)]
    assert 3 * tf32[0] == 2 * tf32[1], tf32
    used = resources(compiled, tmp_path)
    assert (used["STACK"], used["LOCAL"], used["LDL/STL"]) == (0, 0, 0), used
    assert compiled.metadata.shared <= 227 * 1024


# The 8-bit Q/K quantizer as the 8-bit methods launch it (operands.prepare_gpu): Q per warp of
# 16 rows or per 128-row block, K per 128-row block with its mean and the permutation, INT8 or
# E4M3 codes, the QK Hadamard and the fused RoPE on or off. Its 128-row K tile with the
# Hadamard spilled 888 bytes a thread while the butterfly's cross-lane stages were layout
# conversions through shared memory.
QUANTIZE_8BIT = {
    "q int8 per-warp rotated rope": (16, 0, False, False, True, True, True),
    "k int8 rotated rope": (128, 0, True, True, False, True, True),
    "k e4m3 rotated": (128, 1, True, True, False, True, False),
    "q e4m3 per-block": (128, 1, False, False, True, False, False),
    "q e4m3 per-block rotated rope": (128, 1, False, False, True, True, True),
    "k int8 plain": (128, 0, False, True, False, False, False),
}


@pytest.mark.parametrize("variant", QUANTIZE_8BIT)
def test_the_8bit_quantizers_compile_without_spills(variant, tmp_path):
    from vcbench.kernels.backends.triton import quantize
    from vcbench.kernels.backends.triton.operands import quantize_warps

    rows, fmt, perm, mean, multiply, rotated, rope = QUANTIZE_8BIT[variant]
    compiled = compile_for_sm90(
        quantize._quantize_rows,
        {"ROWS": rows, "D": 128, "FMT": fmt, "HAS_PERM": perm, "HAS_MEAN": mean,
         "MULTIPLY": multiply, "HADAMARD": rotated, "LOG2_D": 7 if rotated else 0,
         "ROPE": quantize.ROUND_BF16 if rope else quantize.ROUND_NONE},
        pointers={"Out": "i8" if fmt == 0 else "fp8e4nv", "Scale": "fp32", "Mean": "fp32",
                  "Cos": "fp32", "Sin": "fp32"},
        num_warps=quantize_warps(rows, 128, rotated or rope))
    used = resources(compiled, tmp_path)
    assert (used["STACK"], used["LOCAL"], used["LDL/STL"]) == (0, 0, 0), used


@pytest.mark.parametrize("x_type, rope", [("bf16", True), ("fp32", False)],
                         ids=["bf16-rope", "fp32"])
def test_the_token_sums_compile_without_spills(x_type, rope, tmp_path):
    """K's token sums, the 8-bit and the NVFP4 paths' one kernel (`quantize.token_mean_gpu`),
    as they launch it: 16-bit K with the fused RoPE, and FP32 K (which the NVFP4 path takes)."""
    from vcbench.kernels.backends.triton import quantize

    compiled = compile_for_sm90(
        quantize._token_sums,
        {"ROWS": 64, "D": 128, "TILES": 16,
         "ROPE": quantize.ROUND_BF16 if rope else quantize.ROUND_NONE},
        pointers={"X": x_type}, num_warps=4)
    used = resources(compiled, tmp_path)
    assert (used["STACK"], used["LOCAL"], used["LDL/STL"]) == (0, 0, 0), used
