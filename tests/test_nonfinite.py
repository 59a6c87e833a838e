"""A NaN or an infinity in q, k or v of one (batch, head) makes that (batch, head)'s output
non-finite, for every method, and leaves every other (batch, head) bit for bit as without it.

A quantized method carries it in its arithmetic: the group holding the value gets a NaN scale
(`granularity.abs_max`), and every scale of V, which the output is multiplied by, then carries
it (`granularity.nonfinite_poison`), so the whole (batch, head) is NaN. BF16 propagates it as
FlashAttention does (a NaN in Q: that row). The GPU backends are held to the same rule in
tests/test_gpu_nonfinite.py, the Triton preprocessing under the interpreter in
test_triton_interpreted.py and test_nvfp4_interpreter.py.
"""

import pytest
import torch

import vcbench
from vcbench.kernels import METHODS, get_method
from vcbench.kernels.reference.engine import prepare
from vcbench.kernels.reference.vsmooth import group
from vcbench.kernels.spec.granularity import Unscaled
from vcbench.kernels.spec.vsmooth import VSmoothConfig

B, H, N, D = 2, 3, 160, 64  # 160 tokens: a full KV tile and a padded one
BAD_HEAD = (1, 1)
BAD_VALUES = {"nan": float("nan"), "+inf": float("inf"), "-inf": -float("inf")}


def _variants():
    """Every built-in method with its defaults; a V-Smooth method also with a given permutation
    (the grouping schedule's cached order) and with vsmooth=False (steps outside the window).
    (An installed plugin's kernel keeps its own behaviour: the rule is vcbench's arithmetic.)"""
    out = []
    for name in METHODS.builtin_names():
        out.append((name, "default"))
        if "vsmooth" in get_method(name).options:
            out += [(name, "permutation"), (name, "vsmooth=False")]
    return out


def _inputs():
    g = torch.Generator().manual_seed(31)
    return [torch.randn(B, H, N, D, generator=g).bfloat16() for _ in range(3)]


def _options(variant, v):
    if variant == "permutation":
        return {"permutation": group(v, VSmoothConfig(block_rows=128)).permutation}
    return {"vsmooth": False} if variant == "vsmooth=False" else {}


@pytest.fixture(scope="module")
def clean():
    q, k, v = _inputs()
    return {(m, var): vcbench.attention(q, k, v, m, **_options(var, v)) for m, var in _variants()}


@pytest.mark.parametrize("method, variant", _variants())
@pytest.mark.parametrize("operand", ["q", "k", "v"])
@pytest.mark.parametrize("bad", list(BAD_VALUES))
def test_a_non_finite_input_makes_its_head_non_finite_and_no_other(method, variant, operand,
                                                                   bad, clean):
    q, k, v = _inputs()
    opts = _options(variant, v)  # the clean order, as a cached permutation would be
    poisoned = {"q": q, "k": k, "v": v}
    poisoned[operand][(*BAD_HEAD, 37, 5)] = BAD_VALUES[bad]
    out = vcbench.attention(poisoned["q"], poisoned["k"], poisoned["v"], method, **opts)
    others = torch.ones(B, H, dtype=torch.bool)
    others[BAD_HEAD] = False
    assert torch.equal(out[others], clean[(method, variant)][others])
    head = out[BAD_HEAD]
    assert not torch.isfinite(head).all()
    if not isinstance(get_method(method).plan(opts).v.granularity, Unscaled):
        assert torch.isnan(head).all()  # V's scales carried it: the whole (batch, head)


@pytest.mark.parametrize("method", METHODS.builtin_names())
def test_only_the_poisoned_heads_scales_are_nan(method):
    q, k, v = _inputs()
    k[(*BAD_HEAD, 37, 5)] = float("inf")
    ops = prepare(q, k, v, get_method(method).plan())
    if isinstance(ops.v.granularity, Unscaled):
        return
    for scale in (ops.v.scale, ops.v.outer):
        if scale is not None:
            assert torch.isnan(scale[BAD_HEAD]).all()
            scale[BAD_HEAD] = 0
            assert torch.isfinite(scale).all()
    # the group that held the value has a NaN scale and zero codes
    assert torch.isnan(ops.k.scale[BAD_HEAD]).any() or torch.isnan(ops.k.outer[BAD_HEAD])
    assert torch.isfinite(ops.k.codes).all()
