"""The emulation holds O(B H N D) plus one KV tile: no tensor with two sequence axes.

SageAttention's Q-smoothing term mean_q . K^T is taken one KV tile at a time; it once was a
(B, H, Nq / block_m, Nk) tensor expanded to every query row, (B, H, Nq, Nk), 89 GiB at the
Wan2.2 length and four heads.
"""

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vcbench.kernels import get_method
from vcbench.kernels.reference.engine import prepare, score_bias_tile, softmax_scale_log2

ROOT = Path(__file__).resolve().parents[1]


def sylvester(d):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


@pytest.mark.parametrize("method", ["sage3-4bit", "vc-4bit"])
@pytest.mark.parametrize("hadamard_qk", [False, True])
def test_tile_bias_equals_the_full_bias_matrix(method, hadamard_qk, gen):
    """Per tile, exactly the columns of the full (Nq, Nk) bias matrix, written out here from
    the inputs. The inputs are chosen so every step is exact in FP64 (quarter-integers,
    sm_scale = ln 2 makes the folded scale 1, means over 64 and 256 rows, the Hadamard matrix
    of order 64 is +-1/8), so the bias has one right value whatever order any BLAS sums in."""
    n, d, bm, bn = 256, 64, 64, 64
    assert softmax_scale_log2(d, math.log(2.0)) == 1.0
    q, k, v = (torch.randint(-16, 17, (1, 2, n, d), generator=gen).double() / 4 for _ in range(3))
    plan = get_method(method).plan({"block_m": bm, "block_n": bn, "hadamard_qk": hadamard_qk})
    ops = prepare(q, k, v, plan, sm_scale=math.log(2.0))

    qs, ks = q, k
    if ops.permutation is not None:  # V-Smooth gathers K (Q keeps its order)
        ks = torch.gather(ks, -2, ops.permutation[..., None].expand_as(ks))
    ks = ks - ks.mean(-2, keepdim=True)
    if hadamard_qk:
        qs, ks = qs @ sylvester(d), ks @ sylvester(d)
    q_mean = qs.unflatten(-2, (n // bm, bm)).mean(-2)
    full = (q_mean @ ks.transpose(-1, -2)).repeat_interleave(bm, dim=-2)  # (B, H, Nq, Nk)
    for j in range(n // bn):
        cols = slice(j * bn, (j + 1) * bn)
        assert torch.equal(score_bias_tile(ops, cols, bm), full[..., cols])


PEAK_SCRIPT = """
import resource, torch, vcbench
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 1, {n}, {d}, generator=g).bfloat16() for _ in range(3))
vcbench.attention(q[:, :, :300], k[:, :, :300], v[:, :, :300], "sage3-4bit")  # code paths warm
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = vcbench.attention(q, k, v, "sage3-4bit")
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert torch.isfinite(out).all()
print((after - before) * 1024)
"""


def test_sage3_emulation_peak_memory_stays_far_below_one_n_by_n_tensor():
    """The growth of the peak resident set over one call at N = 16384, in a fresh process.
    One N x N FP32 tensor is 1 GiB (the expanded bias alone was: measured +1342 MiB over the
    call); one KV tile's score-sized temporaries are 8 MiB each (measured about +300 MiB in
    all, most of it freed blocks the allocator keeps)."""
    n, d = 16384, 64
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run([sys.executable, "-c", PEAK_SCRIPT.format(n=n, d=d)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    grew = int(done.stdout.split()[-1])
    n_by_n = n * n * 4
    assert grew < n_by_n / 2, f"peak grew by {grew / 2**20:.0f} MiB over one call"
