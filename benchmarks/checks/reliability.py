"""Device check: every GPU method right past 2^31 elements an operand, in every layout a video
DiT hands it, and with a NaN in one head. One call on the H200 (about 6 minutes):

    PYTHONPATH=. python -m vcbench.kernels.backends.sm90.compiled build     # the compiled kernel, if nvcc
    PYTHONPATH=. python benchmarks/checks/reliability.py --out $OUT   # --quick: a smoke run

(FA4 for the bf16 rows: install it first as ../shared/device/README.md says; cuDNN otherwise.)

1. Large: B1 H40 N680400 D128 (Wan2.2 1080p, 3.5e9 elements an operand), B2 H40 N300000
   (3.1e9) and B1 H2 N1100000 (N past 2^20). Each implementation's output, poisoned with NaN
   first, at the rows whose offsets are largest (the last 128 tokens of the last batch entry's
   last head) and at the first 128 rows of head 0: against FP64 attention of those rows, and
   against the emulation of the same rows' tiles (same quantized operands, same permutation).
   Pass: finite; within max(4e-3, 0.5 e) of the emulation and within 1.25 e + 1e-3 of FP64,
   e the emulation's own error (tests/test_gpu_kernels.py's rule; bf16: 1e-2 of FP64).
2. Layouts: B2 H8 N9000, D128 and D64, bf16 and fp16: NHD, (B, N, H, D) memory seen as HND,
   fused-QKV slices, each bit-equal to the contiguous HND call.
3. NaN in (batch 1, head 0) of q, k or v: that (batch, head)'s output non-finite, every other
   bit-equal to the clean call.
Each implementation the machine has runs: the compiled sm90 kernel where built, the Triton
kernel (VCBENCH_KERNEL=triton), FA4 or cuDNN for bf16. Rows go to stdout and OUT/reliability.csv.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

import vcbench
from vcbench.kernels import backends, get_method, group
from vcbench.kernels.reference.engine import prepare, run
from vcbench.kernels.spec.granularity import Microscale16, PerBlock

METHODS = ["bf16", "fp8-fa4", "sage2-8bit", "vc-8bit-vsmooth", "vc-8bit", "vc-8bit-fp8qk"]
LARGE = [(1, 40, 680400), (2, 40, 300000), (1, 2, 1_100_000)]
QUICK = [(1, 40, 60000), (2, 4, 20000)]


@contextmanager
def kernel(choice: str):
    old = os.environ.get(backends.KERNEL_ENV)
    os.environ[backends.KERNEL_ENV] = choice
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(backends.KERNEL_ENV)
        else:
            os.environ[backends.KERNEL_ENV] = old


def implementations(method: str) -> list[str]:
    """VCBENCH_KERNEL values that run `method` on different kernels here."""
    if method == "bf16":
        return ["auto"]
    with kernel("auto"):
        compiled = backends.select(get_method(method).plan()) is backends.SM90
    return ["auto", "triton"] if compiled else ["triton"]


def rel_l2(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def fp64_rows(q, k, v, b, h, rows):
    s = q[b, h, rows].double() @ k[b, h].double().T / math.sqrt(q.shape[-1])
    return torch.softmax(s, -1) @ v[b, h].double()


def slice_query_rows(x, start: int, stop: int):
    """The query operand's rows start..stop (whole query tiles) with their scales."""
    g, scale = x.granularity, x.scale
    if isinstance(g, PerBlock):  # PerWarp too
        scale = scale[..., start // g.rows : stop // g.rows]
    elif isinstance(g, Microscale16) and g.axis == -1:
        scale = scale[..., start:stop, :]
    return dataclasses.replace(x, codes=x.codes[..., start:stop, :], scale=scale)


def emulated_rows(plan, q, k, v, b, h, rows, permutation):
    """The emulation of one head's query rows `rows`: the whole head prepared (every key and
    value, quantized as the kernel's preprocessing does), the online softmax run for the query
    tiles holding `rows` only (rows are independent)."""
    one = [x[b : b + 1, h : h + 1] for x in (q, k, v)]
    perm = None if permutation is None else permutation[b : b + 1, h : h + 1]
    ops = prepare(*one, plan, permutation=perm)
    start = rows.start // plan.block_m * plan.block_m
    stop = -(-rows.stop // plan.block_m) * plan.block_m
    ops.q = slice_query_rows(ops.q, start, stop)
    if ops.q_mean is not None:  # Q smoothing: the means of these query tiles only
        ops.q_mean = ops.q_mean[..., start // plan.block_m : stop // plan.block_m, :]
    out, _ = run(ops, plan)
    return out[0, 0, rows.start - start : rows.stop - start]


def gpu_call(method, q, k, v):
    """(poisoned-then-written output, the permutation it used)."""
    plan = get_method(method).plan()
    backend = backends.select(plan, tuple(q.shape))
    if backend.prepare is None:  # bf16: FA4 or cuDNN
        return backend.run(q, k, v, plan, {}), None
    ops = backend.prepare(q, k, v, plan)
    out = torch.full_like(q, float("nan"))
    backend.run_prepared(ops, plan, out)
    return out, ops.permutation


def check_large(method, impl, shape, seed=0):
    b_, h_, n = shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(b_, h_, n, 128, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    start = time.perf_counter()
    with kernel(impl):
        out, perm = gpu_call(method, q, k, v)
    torch.cuda.synchronize()
    wall = time.perf_counter() - start
    row = {"check": "large", "method": method, "kernel": impl, "case": f"B{b_} H{h_} N{n}",
           "elements": b_ * h_ * n * 128, "wall_s": round(wall, 2)}
    worst, ok = 0.0, bool(torch.isfinite(out).all())
    for tag, (bb, hh, rows) in {"last": (b_ - 1, h_ - 1, range(n - 128, n)),
                                "first": (0, 0, range(0, 128))}.items():
        ref = fp64_rows(q, k, v, bb, hh, rows)
        got = out[bb, hh, rows.start : rows.stop]
        err = rel_l2(got, ref)
        row[f"{tag}_vs_fp64"] = f"{err:.3e}"
        if method == "bf16":
            ok &= err <= 1e-2
            continue
        emu = emulated_rows(get_method(method).plan(), q, k, v, bb, hh, rows, perm)
        e = rel_l2(emu, ref)
        d = rel_l2(got, emu)
        row[f"{tag}_vs_emulation"] = f"{d:.3e}"
        worst = max(worst, d)
        ok &= d <= max(4e-3, 0.5 * e) and err <= 1.25 * e + 1e-3
    row["worst_vs_emulation"] = f"{worst:.3e}"
    row["ok"] = ok
    del q, k, v, out
    torch.cuda.empty_cache()
    return row


def check_layouts(method, impl, d, dtype, seed=1):
    g = torch.Generator(device="cuda").manual_seed(seed)
    b_, h_, n = 2, 8, 9000
    q, k, v = (torch.randn(b_, h_, n, d, device="cuda", generator=g).to(dtype) for _ in range(3))
    opts = {}
    if method.startswith("vc-"):  # one token order for every layout: the kernels, not k-means
        opts["permutation"] = group(v, get_method(method).plan().vsmooth).permutation
    with kernel(impl):
        def call(*x, **kw):
            return vcbench.attention(*x, method, backend="gpu", **opts, **kw)
        ref = call(q, k, v)
        bnhd = [x.transpose(1, 2).contiguous() for x in (q, k, v)]
        fused = torch.stack(bnhd, dim=2).unbind(2)
        got = {"NHD": call(*bnhd, tensor_layout="NHD").transpose(1, 2),
               "BNHD view": call(*(x.transpose(1, 2) for x in bnhd)),
               "fused QKV NHD": call(*fused, tensor_layout="NHD").transpose(1, 2),
               "fused QKV view": call(*(x.transpose(1, 2) for x in fused))}
        clean = ref
        others = torch.ones(b_, h_, dtype=torch.bool, device="cuda")
        others[1, 0] = False
        nan_ok = True
        for i in range(3):
            poisoned = [x.clone() for x in (q, k, v)]
            poisoned[i][1, 0, 4321, 7] = float("nan")
            out = call(*poisoned)  # the poisoned head non-finite (flagged), the others exact
            nan_ok &= torch.equal(out[others], clean[others])
            nan_ok &= not bool(torch.isfinite(out[1, 0]).all())
    bad = [name for name, out in got.items() if not torch.equal(out, ref)]
    return {"check": "layouts+nan", "method": method, "kernel": impl,
            "case": f"B2 H8 N9000 D{d} {str(dtype).removeprefix('torch.')}",
            "elements": q.numel(), "layouts_not_bit_equal": " ".join(bad) or "-",
            "nan_contained": nan_ok, "ok": not bad and nan_ok}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("results/reliability"))
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--methods", default=",".join(METHODS))
    args = ap.parse_args()
    if not backends.triton_ready():
        print("error: needs a CUDA GPU (sm_90+) with Triton", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for method in args.methods.split(","):
        for impl in implementations(method):
            for d in (128, 64):
                for dtype in (torch.bfloat16, torch.float16):
                    rows.append(check_layouts(method, impl, d, dtype))
                    print(rows[-1], flush=True)
            for shape in QUICK if args.quick else LARGE:
                rows.append(check_large(method, impl, shape))
                print(rows[-1], flush=True)
    keys = sorted({k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k)
                  if k in rows[0] else 99)
    with open(args.out / "reliability.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    print(f"\n{'check':12} {'method':16} {'kernel':7} {'case':28} {'worst':>10} ok")
    for r in rows:
        print(f"{r['check']:12} {r['method']:16} {r['kernel']:7} {r['case']:28} "
              f"{r.get('worst_vs_emulation', r.get('layouts_not_bit_equal', '')):>10} {r['ok']}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
