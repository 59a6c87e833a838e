import math
import os

# As `import vcbench` does, and before torch loads (libgomp reads it once): spinning OpenMP
# threads make the suite several times slower on the shared 2-core machine; same arithmetic.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402


def reference_attention(q, k, v):
    """softmax(Q K^T / sqrt(d)) V in float64 (HND), written out independently of vcbench."""
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return torch.softmax(s, dim=-1) @ v


def rel_l2(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


def nvfp4_kernel_tolerance(e):
    """Relative L2 an NVFP4 kernel's FP32 output may sit from the emulation's, given e, the
    emulation's own error against FP64 (derived in tests/test_gpu_nvfp4.py's docstring)."""
    return max(2e-4, 0.2 * e)


def rope_with_junk(n, d, device):
    """spec.rope.Rope of Wan-style tables (n, d) whose entries RoPE never reads (cos at odd
    channels, sin at even ones) hold other values: a kernel that reads the wrong entry of a
    channel pair gives other codes. In Wan's own tables both entries of a pair are equal."""
    from vcbench.kernels.spec.rope import Rope, rope_tables

    cos, sin = rope_tables(n, d, device)
    cos[:, 1::2] = -0.5 * cos[:, 1::2] + 0.25
    sin[:, 0::2] = 0.75 - sin[:, 0::2]
    return Rope(cos, sin)
