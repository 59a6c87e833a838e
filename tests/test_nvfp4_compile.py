"""The NVFP4 kernels compile for sm_90 (Triton's own ptxas), on a machine without a GPU.

The interpreter (tests/test_nvfp4_interpreter.py) runs the kernels' Python; it does not see
what only the compiler refuses (a non-constexpr global, a layout it cannot lower), which
would otherwise surface first on the device.
"""

import pytest

triton = pytest.importorskip("triton", reason="needs Triton")
from triton.compiler import ASTSource  # noqa: E402

try:
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
except ImportError:  # pragma: no cover - a Triton without the NVIDIA backend
    pytest.skip("Triton has no NVIDIA backend here", allow_module_level=True)

from vcbench.kernels.backends.triton import nvfp4, nvfp4_attention  # noqa: E402

if not hasattr(nvfp4._quantize_qk, "cache_key"):  # TRITON_INTERPRET set: nothing to compile
    pytest.skip("Triton runs in its interpreter here (TRITON_INTERPRET)", allow_module_level=True)

POINTERS = {  # argument name -> element type, as prepare / launch pass them
    "Qc": "i8", "Kc": "i8", "Vc": "i8", "Codes": "i8", "Qs": "fp16", "Ks": "fp16",
    "Vs": "fp16", "Scales": "fp16", "VM": "fp16", "StoredMeans": "fp16", "QO": "fp32",
    "KO": "fp32", "VO": "fp32", "BiasQ": "fp32", "KMean": "fp32", "Mean": "fp32",
    "Outer": "fp32", "QMean": "fp32", "KIn": "bf16", "X": "bf16", "Perm": "i32", "Out": "bf16"}


def compile_for_sm90(kernel, constexprs, **options):
    names = kernel.arg_names
    signature = {}
    for name in names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in POINTERS:
            signature[name] = "*" + POINTERS[name]
        else:
            signature[name] = "fp32" if name == "multiplier" else "i32"
    return triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constexprs),
                          target=GPUTarget("cuda", 90, 32), options=options)


@pytest.mark.parametrize("switches", [
    dict(OUTER_QK=False, OUTER_V=False, BIAS=True, HAS_PERM=False, VSMOOTH=False, TWO_LEVEL=True),
    dict(OUTER_QK=False, OUTER_V=False, BIAS=True, HAS_PERM=True, VSMOOTH=True, TWO_LEVEL=True),
    dict(OUTER_QK=True, OUTER_V=True, BIAS=False, HAS_PERM=False, VSMOOTH=False, TWO_LEVEL=False),
], ids=["sage3-4bit", "vc-4bit", "attnqat-tf"])
def test_attention_kernel_compiles_to_wgmma(switches):
    compiled = compile_for_sm90(nvfp4_attention._nvfp4_attention_fwd,
                                {**switches, "BLOCK_M": 128, "BLOCK_N": 128, "D": 128},
                                num_warps=8, num_stages=2)
    assert "wgmma.mma_async" in compiled.asm["ptx"]  # both products on Hopper's tensor cores


def test_preprocessing_kernels_compile():
    compile_for_sm90(nvfp4._quantize_qk, dict(ROWS=128, D=128, HAS_PERM=True, HAS_MEAN=True,
                                              MULTIPLY=True, SMOOTH=True, OUTER=True),
                     num_warps=4, enable_fp_fusion=False)
    compile_for_sm90(nvfp4._quantize_v, dict(ROWS=128, D=128, HAS_PERM=True, DEMEAN=True,
                                             OUTER=True), num_warps=4, enable_fp_fusion=False)
