"""Device check of the NVFP4 kernels at the lengths the tests do not reach (up to Wan2.2's).

For each variant (sage3-4bit, vc-4bit, each with and without hadamard_qk, attnqat-tf), head
dim 64 and 128, N in {1000, 4133, 16384, 75600}, on fresh random and outlier-carrying inputs
(one head): every quantized operand bit-equal to the emulation's on the same CUDA tensors,
and the FP32 output (poisoned with NaN first) within tests/conftest.py's
nvfp4_kernel_tolerance of the emulation's, e taken on sampled rows against FP64.
Prints one line per case and a verdict; writes nvfp4-check.json into $OUT.

    PYTHONPATH=$PWD:$PWD/tests python3 benchmarks/checks/nvfp4_check.py [--lengths 1000,4133,16384,75600]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import nvfp4_kernel_tolerance, reference_attention, rel_l2  # noqa: E402

from vcbench.kernels import backends, get_method  # noqa: E402
from vcbench.kernels.reference.engine import finish, prepare, run  # noqa: E402

VARIANTS = [("sage3-4bit", {}), ("sage3-4bit", {"hadamard_qk": True}), ("vc-4bit", {}),
            ("vc-4bit", {"hadamard_qk": False}), ("attnqat-tf", {})]
SAMPLE_ROWS = 512


def inputs(kind: str, n: int, d: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(1, 1, n, d, device="cuda", generator=g) for _ in range(3))
    if kind == "outliers":
        q = q + 2 * torch.randn(1, 1, 1, d, device="cuda", generator=g)
        k = k + 3 * torch.randn(1, 1, 1, d, device="cuda", generator=g)
        rows = torch.randperm(n, device="cuda", generator=g)[: n // 50]
        v[:, :, rows] += 20 * torch.randn(1, 1, 1, d, device="cuda", generator=g)
    return tuple(x.bfloat16() for x in (q, k, v))


def differing(got, want) -> int:
    if (got is None) != (want is None):
        return -1
    if want is None:
        return 0
    return int((got.float().reshape(want.shape) != want.float()).sum())


def check(method: str, opts: dict, kind: str, n: int, d: int, seed: int) -> dict:
    q, k, v = inputs(kind, n, d, seed)
    plan = get_method(method).plan(opts)
    emu = prepare(q, k, v, plan)
    ops = backends.NVFP4.prepare(q, k, v, plan, permutation=emu.permutation)
    diff = {"Q codes": differing(ops.codes("q"), emu.q.codes),
            "Q scales": differing(ops.q_scale, emu.q.scale),
            "K codes": differing(ops.codes("k"), emu.k.codes),
            "K scales": differing(ops.k_scale, emu.k.scale),
            "V codes": differing(ops.codes("v"), emu.v.codes),
            "V scales": differing(ops.v_scale, emu.v.scale),
            "outer scales": sum(max(differing(getattr(ops, f"{x}_outer"), getattr(emu, x).outer), 0)
                                for x in "qkv"),
            "V means": differing(ops.v_mean, emu.v_mean),
            "Q means": differing(ops.q_mean, emu.q_mean)}
    out = torch.full(q.shape, float("nan"), dtype=torch.float32, device="cuda")
    backends.NVFP4.run_prepared(ops, plan, out)
    torch.cuda.synchronize()
    finite = bool(torch.isfinite(out).all())
    emu_out = finish(run(emu, plan)[0], n, plan)
    rows = torch.linspace(0, n - 1, min(n, SAMPLE_ROWS), device="cuda").long()
    e = rel_l2(emu_out[:, :, rows], reference_attention(q[:, :, rows], k, v))
    dist = rel_l2(out, emu_out) if finite else float("nan")
    ok = finite and all(x == 0 for x in diff.values()) and dist <= nvfp4_kernel_tolerance(e)
    return {"method": method, "options": opts, "kind": kind, "n": n, "d": d, "ok": ok,
            "differing": diff, "finite": finite, "kernel_vs_emulation": dist,
            "emulation_vs_fp64": e, "tolerance": nvfp4_kernel_tolerance(e)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lengths", default="1000,4133,16384,75600")
    parser.add_argument("--dims", default="64,128")
    args = parser.parse_args()
    if not backends.triton_ready():
        print("needs a CUDA GPU (sm_90+) and Triton")
        return 2
    rows = []
    for n in map(int, args.lengths.split(",")):
        for d in map(int, args.dims.split(",")):
            for kind in ("normal", "outliers"):
                for i, (method, opts) in enumerate(VARIANTS):
                    t0 = time.time()
                    row = check(method, opts, kind, n, d, seed=n * 1009 + d * 13 + i * 7 + len(kind))
                    wrong = {k: v for k, v in row["differing"].items() if v}
                    name = method + "".join(f"+{k}" for k in opts)
                    print(f"{'ok ' if row['ok'] else 'BAD'} {name:24s} {kind:8s} N{n:<6d} D{d:<4d} "
                          f"kernel-emu {row['kernel_vs_emulation']:.2e} (tol {row['tolerance']:.1e}, "
                          f"e {row['emulation_vs_fp64']:.3f}) "
                          f"{'codes bit-equal' if not wrong else f'DIFFER {wrong}'}"
                          f"{'' if row['finite'] else ' NON-FINITE'}  {time.time() - t0:.1f} s",
                          flush=True)
                    rows.append(row)
                    torch.cuda.empty_cache()
    bad = [r for r in rows if not r["ok"]]
    worst = max(r["kernel_vs_emulation"] / r["tolerance"] for r in rows if r["finite"])
    print(f"nvfp4 check: {len(rows) - len(bad)} of {len(rows)} cases ok; worst distance "
          f"{worst:.2f} of its tolerance")
    out = Path(os.environ.get("OUT", "/tmp/out"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "nvfp4-check.json").write_text(json.dumps(rows, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
