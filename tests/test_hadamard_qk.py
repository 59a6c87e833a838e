"""The QK Hadamard: the butterfly against Sylvester's matrix, every method that takes it
against an independent rotation of its inputs, and each method's default as docs/methods.md
states it (on for the VC methods, off for the baselines, as the paper runs them)."""

import math
import re
from pathlib import Path

import pytest
import scipy.linalg
import torch

import vcbench
from vcbench.kernels import METHODS, get_method
from vcbench.kernels.reference.engine import prepare
from vcbench.kernels.spec.rotation import rotate

ROOT = Path(__file__).resolve().parents[1]
# Every method whose QK path takes the rotation, with the option as the method declares it.
ROTATING = ["fp8-fa4", "sage2-8bit", "sage3-4bit", "vc-8bit", "vc-8bit-vsmooth",
            "vc-8bit-fp8qk", "vc-4bit"]


def sylvester(d: int) -> torch.Tensor:
    return torch.tensor(scipy.linalg.hadamard(d), dtype=torch.float64)


@pytest.mark.parametrize("d", [64, 128])
def test_the_butterfly_is_sylvesters_matrix(d, gen):
    # Integer inputs: every sum is exact in FP64, so the butterfly and the matrix product
    # agree bit for bit, and both then take the same one multiply by 1/sqrt(d).
    x = torch.randint(-1000, 1000, (3, 5, d), generator=gen).double()
    norm = torch.tensor(1 / math.sqrt(d), dtype=torch.float64)
    assert torch.equal(rotate(x), (x @ sylvester(d)) * norm)
    y = torch.randn(7, d, generator=gen, dtype=torch.float64)
    assert torch.allclose(rotate(y), y @ sylvester(d) / math.sqrt(d), rtol=0, atol=1e-13)
    assert torch.allclose(rotate(rotate(y)), y, rtol=0, atol=1e-13)  # H is its own inverse


def dyadic_inputs(gen, n=256, d=64):
    """FP64 q, k, v on a coarse dyadic grid with channel outliers in Q and K and token
    outliers in V: every sum the preprocessing takes (rotation, K's token mean over n = 256
    tokens, Q's block means) is exact, so rotating the inputs by hand and letting the method
    rotate them give the quantizers the same numbers."""
    q, k, v = (torch.randint(-8, 9, (1, 2, n, d), generator=gen).double() / 4 for _ in range(3))
    q[..., 3] += 24
    k[..., 5] -= 40
    k[..., 9] += 16
    v[:, :, 17] += 12
    return q, k, v


# sm_scale with a power-of-two softmax_scale * log2(e) (2^-3): folding it into Q is exact too
EXACT_SM_SCALE = 0.125 * math.log(2)


@pytest.mark.parametrize("method", ROTATING)
def test_the_rotation_equals_rotating_the_inputs_by_hand(method, gen):
    q, k, v = dyadic_inputs(gen)
    assert EXACT_SM_SCALE / math.log(2) == 0.125 and EXACT_SM_SCALE * (1 / math.log(2)) == 0.125
    h = sylvester(q.shape[-1]) / math.sqrt(q.shape[-1])  # 1/8: exact at d = 64
    opts = {"sm_scale": EXACT_SM_SCALE}
    if method.startswith("vc-"):  # one token order for both calls
        opts["permutation"] = torch.randperm(q.shape[-2], generator=gen).expand(1, 2, -1)
    rotated = vcbench.attention(q, k, v, method, hadamard_qk=True, **opts)
    by_hand = vcbench.attention(q @ h, k @ h, v, method, hadamard_qk=False, **opts)
    assert torch.equal(rotated, by_hand)
    plain = vcbench.attention(q, k, v, method, hadamard_qk=False, **opts)
    assert not torch.equal(rotated, plain)  # the outliers make the rotation matter


def test_k_mean_is_rotated_and_subtracted_after_the_rotation(gen):
    # Appendix B's order on real-valued inputs, where the two orders round differently: the
    # K operand is rotate(K) - rotate(mean K), not rotate(K - mean K).
    q, k, v = (torch.randn(1, 1, 200, 128, generator=gen).bfloat16() for _ in range(3))
    plan = get_method("sage2-8bit").plan({"hadamard_qk": True})
    ops = prepare(q, k, v, plan)
    kf = k.float()
    mean = (kf.double().sum(-2, keepdim=True) / 200).float()
    want = plan.k(torch.nn.functional.pad(rotate(kf) - rotate(mean), (0, 0, 0, 56)))
    assert torch.equal(ops.k.codes, want.codes) and torch.equal(ops.k.scale, want.scale)
    other = plan.k(torch.nn.functional.pad(rotate(kf - mean), (0, 0, 0, 56)))
    assert not torch.equal(other.codes, want.codes)  # the order is visible in the codes


def documented_defaults() -> dict[str, str]:
    """The 'QK Hadamard' column of docs/methods.md's methods table, by method."""
    lines = (ROOT / "docs" / "methods.md").read_text().splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| method |"))
    column = [c.strip() for c in lines[head].split("|")].index("QK Hadamard")
    rows = {}
    for line in lines[head + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.split("|")]
        rows[re.sub(r"`", "", cells[1])] = cells[column]
    return rows


def test_each_methods_default_is_the_documented_one():
    documented = documented_defaults()
    assert sorted(documented) == sorted(METHODS.builtin_names())
    for name in METHODS.builtin_names():
        method = get_method(name)
        option = method.all_options().get("hadamard_qk")
        if option is None:
            assert documented[name] == "-", name
            continue
        assert documented[name] == ("on" if option.default else "off"), name
        assert method.plan().hadamard_qk is option.default
        assert method.plan({"hadamard_qk": not option.default}).hadamard_qk is not option.default
    # the paper's split: VC-Attention rotates, the baselines keep their released kernels
    assert [n for n in ROTATING if get_method(n).plan().hadamard_qk] == [
        "vc-8bit", "vc-8bit-vsmooth", "vc-8bit-fp8qk", "vc-4bit"]


@pytest.mark.parametrize("method", ROTATING)
def test_every_gpu_backend_of_a_method_takes_its_rotated_plan(method):
    # vcbench's own kernels (those with a preprocessing of their own; the compiled sm_90a
    # kernel reads the codes the Triton preprocessing makes, rotation and all) take the plan
    # either way: the option must not cost a method its kernels. An external kernel (the
    # official SageAttention) takes only its released configuration.
    from vcbench.kernels.backends import BACKENDS

    own = [b for b in BACKENDS.values() if b.prepare is not None]
    shape = (1, 40, 75600, 128)
    takers = {rotated: [b.name for b in own
                        if b.supports(get_method(method).plan({"hadamard_qk": rotated}), shape) is None]
              for rotated in (False, True)}
    assert takers[True] == takers[False] and takers[True], method
