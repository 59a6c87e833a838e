"""vcbench under torch.compile on the CPU: the attention custom op, a patched transformer
compiled whole, and the grouping schedule's bounded number of graphs."""

import pytest
import torch

import vcbench
from vcbench.errors import UserError
from vcbench.kernels import get_method, group, ops


def _qkv(seed=0, n=200, heads=2, dim=128, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    # diffusers' layout: (B, N, H, D) projections viewed as HND, so q, k, v are not contiguous
    return [torch.randn(1, n, heads, dim, generator=g, dtype=dtype).transpose(1, 2) for _ in range(3)]


@pytest.mark.parametrize("method,options", [
    ("bf16", {}), ("sage2-8bit", {"sm_scale": 0.05}), ("fp8-fa4", {}), ("sage3-4bit", {}),
    ("vc-8bit", {}), ("vc-8bit", {"vsmooth": False}), ("vc-4bit", {"vsmooth_order": "cube", "grid": (2, 10, 10)}),
])
def test_op_equals_eager_attention_bit_for_bit(method, options):
    q, k, v = _qkv()
    eager = vcbench.attention(q, k, v, method, **options)
    out = ops.attention(q, k, v, method, **options)
    assert torch.equal(out, eager)
    # the fake's strides: contiguous HND (the eager call may return a view of padded tiles)
    assert out.stride() == q.new_empty(q.shape).stride()


def test_op_takes_the_per_call_tensors():
    q, k, v = _qkv(1)
    grouping = group(v, get_method("vc-8bit").plan().vsmooth)
    perm = torch.flip(grouping.permutation, dims=(-1,))  # an order k-means would not give
    eager = vcbench.attention(q, k, v, "vc-8bit", permutation=perm)
    assert torch.equal(ops.attention(q, k, v, "vc-8bit", permutation=perm), eager)
    assert not torch.equal(eager, vcbench.attention(q, k, v, "vc-8bit"))
    nhd = [x.transpose(1, 2) for x in (q, k, v)]
    assert torch.equal(ops.attention(*nhd, "vc-8bit", tensor_layout="NHD", permutation=perm),
                       eager.transpose(1, 2))


@pytest.mark.parametrize("method", ["sage2-8bit", "sage3-4bit", "vc-8bit"])
def test_opcheck(method):
    q, k, v = _qkv(2, n=128)
    args = (q, k, v, method, ops.serialize_options(method, {}), None, None, None, None, "emulate")
    torch.library.opcheck(torch.ops.vcbench.attention.default, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_op_bad_input_is_a_user_error():
    q, k, v = _qkv(n=128)
    with pytest.raises(UserError, match="no option"):
        ops.attention(q, k, v, "vc-8bit", no_such_option=1)
    with pytest.raises(UserError, match="backend must be"):
        ops.attention(q, k, v, "vc-8bit", backend="tpu")
