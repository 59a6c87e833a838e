"""The QK Hadamard's butterfly in Triton, two ways, on the GPU: bit-equality with
`spec.rotation.rotate` and CUPTI time over Q and K of the Wan2.2 shape (2 x 40 x 75600 rows of
128 FP32), each kernel only loading a tile, rotating it and storing it.

  gather       `quantize.hadamard_rows` as the quantizers run it: the first two stages
               (partners in one thread) by split and join, the other five as `tl.gather` of
               the partner column (col ^ h) and one add or subtract, warp shuffles
  conversions  every stage by reshape / permute / split / join, the form before: Triton
               lowers the cross-lane stages as layout conversions through shared memory (per
               thread 16 STS, 16 LDS, 48 SHFL and 39 barriers a 32 x 128 tile on 4 warps,
               sm_90, against the gather's 0, 0, 160 and 0)

Both do the same IEEE additions in the same order, so both must equal `rotate` bit for bit;
the question is only which data movement is cheaper on the card (the static counts favour the
gather). The loser goes: this script with it, once it has run.

    PYTHONPATH=$PWD python3 benchmarks/checks/butterfly_ab.py [--rows N]
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.language as tl

from vcbench.kernels.backends.triton.quantize import _mul_rn, hadamard_norm, hadamard_rows
from vcbench.kernels.spec.rotation import rotate
from vcbench.timing.cupti import time_kernels

ROWS, D, LOG2_D, WARPS = 32, 128, 7, 4


@triton.jit
def _gather(X, Y, norm, ROWS: tl.constexpr, D: tl.constexpr, LOG2_D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, D)
    x = tl.load(X + rows[:, None] * D + cols[None, :])
    tl.store(Y + rows[:, None] * D + cols[None, :], hadamard_rows(x, norm, ROWS, D, LOG2_D))


@triton.jit
def _conversions(X, Y, norm, ROWS: tl.constexpr, D: tl.constexpr, LOG2_D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, D)
    x = tl.load(X + rows[:, None] * D + cols[None, :])
    for s in tl.static_range(LOG2_D):
        pairs = tl.permute(tl.reshape(x, [ROWS, D >> (s + 1), 2, 1 << s]), [0, 1, 3, 2])
        a, b = tl.split(pairs)
        x = tl.reshape(tl.permute(tl.join(a + b, a - b), [0, 1, 3, 2]), [ROWS, D])
    tl.store(Y + rows[:, None] * D + cols[None, :], _mul_rn(x, tl.zeros_like(x) + norm))


KERNELS = {"gather": _gather, "conversions": _conversions}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2 * 40 * 75600, help="rows of 128 (Q and K)")
    args = ap.parse_args()
    n = args.rows // ROWS * ROWS
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(n, D, device="cuda", generator=g) * torch.logspace(-3, 3, D, device="cuda")
    want = rotate(x)
    norm = hadamard_norm(D)
    print(f"{torch.cuda.get_device_name()}; {n} rows of {D} FP32, {ROWS} a program, {WARPS} warps")
    print(f"{'kernel':11s} {'bit-equal':>9s} {'ms':>8s} {'GB/s':>7s}")
    for name, kernel in KERNELS.items():
        y = torch.empty_like(x)
        def launch(kernel=kernel, y=y):
            kernel[(n // ROWS,)](x, y, norm, ROWS=ROWS, D=D, LOG2_D=LOG2_D, num_warps=WARPS)

        launch()
        equal = torch.equal(y.view(torch.int32), want.view(torch.int32))
        t = time_kernels(launch, 1.0, 2.0)
        ms = t.median_ms(t.main_kernel())
        print(f"{name:11s} {str(equal):>9s} {ms:8.3f} {2 * x.numel() * 4 / ms / 1e6:7.0f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
