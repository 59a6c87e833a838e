"""Runs the NVFP4 Triton kernels under Triton's CPU interpreter against the emulation.

Started by tests/test_nvfp4_interpreter.py in its own process, because TRITON_INTERPRET must be
set before any @triton.jit function is defined. Prints one JSON line per case: for every
quantized operand the number of elements that differ from the emulation's (0 is bit-equal),
then the output distances.
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from conftest import reference_attention, rel_l2  # noqa: E402
from nvfp4_cases import CASES, case_name  # noqa: E402

from vcbench.kernels import get_method  # noqa: E402
from vcbench.kernels.backends.triton import nvfp4, nvfp4_attention  # noqa: E402
from vcbench.kernels.reference.engine import finish, prepare, run  # noqa: E402


def inputs(b, h, n, d, layout, kind, seed):
    """Random inputs with the structure the smoothing is for: shared Q and K channel offsets
    and a few large V tokens. "extreme" adds what the scale rules must get right at their
    edges: all-zero token blocks (zero scales, zero codes), tokens large enough to saturate the
    E4M3 microscale (amax / 6 > 448), tokens small enough for subnormal microscales and smaller
    still (a microscale of zero over nonzero values)."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g) for _ in range(3))
    q = q + 2 * torch.randn(b, h, 1, d, generator=g)
    k = k + 3 * torch.randn(b, h, 1, d, generator=g)
    v[:, :, torch.randperm(n, generator=g)[: n // 40]] += 20 * torch.randn(b, h, 1, d, generator=g)
    if kind.startswith("extreme"):
        for x in (q, k, v):
            if n >= 64:  # a whole zero block of 16 tokens, with real tokens around it
                x[:, :, :16] = 0.0
            x[:, :, 16:32:3] *= 3000.0
            x[..., :16] *= 4e-3  # 16 quiet channels: microscales in E4M3's subnormals
            x[:, :, 32:48] *= 1e-2  # a quiet block of 16 tokens: the same along the tokens
            x[:, :, 49:64:3] *= 1e-6  # microscales that round to zero over nonzero values
    dtype = torch.float16 if kind.endswith("fp16") else torch.bfloat16
    q, k, v = (x.to(dtype) for x in (q, k, v))
    if layout == "nhd":  # same values, (B, N, H, D) memory: strides the kernels must follow
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    return q, k, v


def differing(got, want):
    return int((got.float().reshape(want.shape) != want.float()).sum())


def main():
    for i, case in enumerate(CASES):
        method, opts, b, h, n, d, layout, kind = case
        q, k, v = inputs(b, h, n, d, layout, kind, seed=1000 + i)
        plan = get_method(method).plan(opts)
        emu = prepare(q, k, v, plan)
        ops = nvfp4.prepare(q, k, v, plan, permutation=emu.permutation)
        diff = {
            "Q codes": differing(ops.codes("q"), emu.q.codes),
            "Q microscales": differing(ops.q_scale, emu.q.scale),
            "K codes": differing(ops.codes("k"), emu.k.codes),
            "K microscales": differing(ops.k_scale, emu.k.scale),
            "V codes": differing(ops.codes("v"), emu.v.codes),
            "V microscales": differing(ops.v_scale, emu.v.scale),
        }
        for name in ("q", "k", "v"):
            mine, theirs = getattr(ops, f"{name}_outer"), getattr(emu, name).outer
            if (mine is None) != (theirs is None):
                diff[f"{name.upper()} outer scale"] = -1  # one has it, the other not
            elif theirs is not None:
                diff[f"{name.upper()} outer scale"] = differing(mine, theirs)
        if (ops.v_mean is None) != (emu.v_mean is None):
            diff["V block means"] = -1
        elif emu.v_mean is not None:
            diff["V block means"] = differing(ops.v_mean, emu.v_mean)
        if (ops.q_mean is None) != (emu.q_mean is None):
            diff["Q block means"] = -1
        elif emu.q_mean is not None:
            diff["Q block means"] = differing(ops.q_mean, emu.q_mean)

        # FP32 output buffer, poisoned: what the kernel computes, before any 16-bit rounding.
        out = torch.full((b, h, n, d), float("nan"), dtype=torch.float32)
        nvfp4_attention.launch(ops, plan, out)
        emu_out = finish(run(emu, plan)[0], n, plan)
        ref = reference_attention(q, k, v)
        finite = bool(torch.isfinite(out).all())
        print(json.dumps({
            "case": case_name(case), "differing": diff, "finite": finite,
            "kernel_vs_emulation": rel_l2(out, emu_out) if finite else None,
            "kernel_vs_fp64": rel_l2(out, ref) if finite else None,
            "emulation_vs_fp64": rel_l2(emu_out, ref),
        }), flush=True)


if __name__ == "__main__":
    sys.exit(main())
