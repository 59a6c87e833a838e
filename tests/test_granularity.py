"""Scale shapes, the round-trip error bound, and the placement of each granularity's scale."""

import pytest
import torch

from vcbench.kernels.spec.formats import E2M1, E4M3, INT8, round_e4m3
from vcbench.kernels.spec.granularity import (
    Microscale16,
    PerBlock,
    PerChannel,
    PerTensor,
    PerWarp,
    Quantizer,
)

B, H, N, D = 2, 3, 256, 64


@pytest.mark.parametrize("gran, shape", [
    (PerTensor(), (B, H)),
    (PerBlock(128), (B, H, N // 128)),
    (PerWarp(16), (B, H, N // 16)),
    (PerChannel(), (B, H, D)),
    (Microscale16(axis=-1), (B, H, N, D // 16)),
    (Microscale16(axis=-2), (B, H, N // 16, D)),
])
def test_scale_shapes(gran, shape, gen):
    x = torch.randn(B, H, N, D, generator=gen)
    fmt = E2M1 if isinstance(gran, Microscale16) else INT8
    q = Quantizer(fmt, gran)(x)
    assert q.scale.shape == shape
    assert q.codes.shape == x.shape


def test_int8_per_block_error_bound_and_amax_on_top_code(gen):
    x = torch.randn(B, H, N, D, generator=gen) * torch.linspace(0.1, 10, N)[:, None]
    q = Quantizer(INT8, PerBlock(128))(x)
    step = q.expanded_scale()
    assert torch.all((q.dequantize() - x).abs() <= step / 2 + 1e-6)
    assert torch.all(q.codes.abs().unflatten(-2, (2, 128)).amax((-2, -1)) == 127)


def test_per_channel_e4m3_relative_error(gen):
    x = torch.randn(B, H, N, D, generator=gen)
    q = Quantizer(E4M3, PerChannel())(x)
    # E4M3 has 3 mantissa bits: normal values are within 2^-4 relative; subnormals within
    # half a subnormal step of the scale.
    err = (q.dequantize() - x).abs()
    bound = torch.maximum(x.abs() * 2.0**-4, q.expanded_scale() * 2.0**-10)
    assert torch.all(err <= bound * (1 + 1e-6))


def test_microscale_scales_are_e4m3_and_codes_in_range(gen):
    x = torch.randn(B, H, N, D, generator=gen) * 3
    q = Quantizer(E2M1, Microscale16(axis=-1))(x)
    assert torch.equal(round_e4m3(q.scale), q.scale)
    assert q.codes.abs().max() <= 6
    # Each group's reconstruction error is at most half the largest E2M1 gap (1) times scale,
    # plus the saturation of the group max when the E4M3 scale rounded down.
    err = (q.dequantize() - x).abs().unflatten(-1, (D // 16, 16)).amax(-1)
    amax = x.abs().unflatten(-1, (D // 16, 16)).amax(-1)
    assert torch.all(err <= torch.maximum(q.scale, amax - 6 * q.scale) + 1e-6)


def test_two_level_nvfp4_keeps_tiny_tensors_representable():
    x = torch.full((1, 1, 16, 16), 1e-5)
    plain = Quantizer(E2M1, Microscale16(axis=-1))(x)
    two_level = Quantizer(E2M1, Microscale16(axis=-1, global_scale=True))(x)
    assert torch.all(plain.dequantize() == 0)  # the microscale underflows E4M3
    assert torch.allclose(two_level.dequantize(), x, rtol=1e-6)


def test_zero_groups_give_zero_codes_and_given_scale_is_used(gen):
    x = torch.zeros(1, 1, 128, 64)
    q = Quantizer(INT8, PerBlock(128))(x)
    assert torch.all(q.codes == 0) and not torch.isnan(q.codes).any()
    y = torch.randn(1, 1, 128, 64, generator=gen)
    fixed = torch.full((1, 1, 64), 0.5)
    q = Quantizer(E4M3, PerChannel())(y, scale=fixed)
    assert torch.equal(q.scale, fixed)
    assert torch.equal(q.codes, round_e4m3(y / 0.5))
