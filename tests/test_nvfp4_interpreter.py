"""The NVFP4 Triton kernels on the CPU, under Triton's interpreter, against the emulation.

The interpreter runs every @triton.jit function with numpy on CPU tensors: indexing, masks,
tiling, the (batch, head) strides and every rounding step of the codes (but the divisions,
below) are the GPU kernels' own code. So on inputs that exercise the padding (N not a
multiple of the tiles, and one that is), both tile sizes, both head dims, BF16 and FP16, NHD
strides, Hadamard rotations, V-Smooth, per-tensor scales, and the scale rules' edges (zero
blocks, saturated and subnormal E4M3 microscales, microscales that round to zero):

  - every quantized operand (E2M1 codes, E4M3 microscales, FP32 outer scales, V-Smooth's
    FP16 block means, Q smoothing's block means) is bit-equal to the emulation's;
  - the output (an FP32 buffer filled with NaN first, so an unwritten row fails) is finite and
    within `nvfp4_kernel_tolerance` of the emulation's, and its own error against FP64 within
    1.05 e + 1e-4 (e: the emulation's).

And with a NaN or an infinity in one (batch, head) of Q, K or V: every operand is still the
emulation's (NaN where it has NaN), that (batch, head)'s output is NaN in both, and every
other (batch, head) is the clean call's, bit for bit.

What the interpreter cannot show is left to tests/test_gpu_nvfp4.py: the compiled kernel's
tl.dot on tensor cores, MUFU's exp2, the layouts tl.reshape gets on the GPU, 64-bit offsets
past 2^31 elements, and the divisions by Markstein's correction (the interpreter's tl.fma is
not fused, so there the kernels divide by numpy's IEEE division; tests/test_exact_division.py
holds the correction to it in exact arithmetic).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import nvfp4_kernel_tolerance

pytest.importorskip("triton", reason="needs Triton (its interpreter runs the kernels on CPU)")

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))
from nvfp4_cases import CASES, POISON_CASES, POISON_VALUES, case_name, poison_name  # noqa: E402


@pytest.fixture(scope="module")
def results():
    """All cases in one interpreter process (TRITON_INTERPRET must be set before any kernel is
    defined, so not in this one)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]),
           "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, str(TESTS / "nvfp4_interpreter_driver.py")],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return {row.get("case") or row["poison"]: row for row in rows}


@pytest.mark.parametrize("case", CASES, ids=case_name)
def test_interpreted_kernels_match_the_emulation(case, results):
    row = results[case_name(case)]
    wrong = {what: n for what, n in row["differing"].items() if n != 0}
    assert not wrong, f"not bit-equal to the emulation (differing elements, -1: missing): {wrong}"
    assert {"Q codes", "K codes", "V codes", "V microscales"} <= set(row["differing"])
    assert row["finite"], "rows left unwritten (NaN) or non-finite"
    e = row["emulation_vs_fp64"]
    assert row["kernel_vs_emulation"] <= nvfp4_kernel_tolerance(e)
    assert row["kernel_vs_fp64"] <= 1.05 * e + 1e-4


@pytest.mark.parametrize("name", [poison_name(c, o, x) for c in POISON_CASES for o in "qkv"
                                  for x in POISON_VALUES])
def test_a_non_finite_input_poisons_its_head_as_the_emulation(name, results):
    row = results[name]
    wrong = {what: n for what, n in row["differing"].items() if n != 0}
    assert not wrong, f"not bit-equal to the emulation (differing elements, -1: missing): {wrong}"
    assert row["others_equal"], "another (batch, head) changed"
    assert row["head_all_nan"] and row["emulation_head_all_nan"]


def test_the_triton_kernel_refuses_operands_in_the_compiled_kernels_key_order():
    """K's and V's rows in the compiled kernel's order would still make an attention output, but
    P's microscale groups would span other keys than the emulation's: a difference nothing
    would report, so the Triton kernel refuses them before it launches."""
    import torch

    from vcbench.kernels import get_method
    from vcbench.kernels.backends.triton import nvfp4
    from vcbench.kernels.backends.triton.nvfp4_attention import launch

    x = torch.zeros(2, 128, 64, dtype=torch.float16)
    ops = nvfp4.Nvfp4Operands(q=x, q_scale=x, k=x, k_scale=x, v=x, v_scale=x, n=100,
                              block_m=128, block_n=128, key_order="sm90")
    with pytest.raises(ValueError, match="key_order='natural', got 'sm90'"):
        launch(ops, get_method("sage3-4bit").plan(), torch.empty(1, 2, 100, 64))
