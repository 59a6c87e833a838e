"""Runs the NVFP4 Triton kernels under Triton's CPU interpreter against the emulation.

Started by tests/test_nvfp4_interpreter.py in its own process, because TRITON_INTERPRET must be
set before any @triton.jit function is defined. Prints one JSON line per case: for every
quantized operand the number of elements that differ from the emulation's (0 is bit-equal,
NaN matching NaN), then the output distances; then one line per poisoned input (a NaN or an
infinity in one (batch, head)): the operands' differences and where the output is NaN.
"""

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from conftest import reference_attention, rel_l2  # noqa: E402
from nvfp4_cases import CASES, POISON_CASES, POISON_VALUES, case_name, poison_name  # noqa: E402

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
    dtype = {"fp16": torch.float16, "fp32": torch.float32}.get(kind.split()[-1], torch.bfloat16)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    if layout == "nhd":  # same values, (B, N, H, D) memory: strides the kernels must follow
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    return q, k, v


def differing(got, want):
    got, want = got.float().reshape(want.shape), want.float()
    return int(((got != want) & ~(got.isnan() & want.isnan())).sum())


def operand_differences(ops, emu):
    """Elements of each quantized operand that differ from the emulation's (-1: missing). A
    poisoned (batch, head)'s V values are NaN and its codes lost with them, where the
    emulation keeps its codes under NaN scales: codes are compared where the emulation's
    scale is finite (zero elsewhere, as `Nvfp4Operands.codes` gives), values everywhere."""
    diff = {}
    for name in ("q", "k", "v"):
        mine, theirs = getattr(ops, name), getattr(emu, name)
        scale = theirs.expanded_scale()
        diff[f"{name.upper()} codes"] = differing(
            ops.codes(name), torch.where(scale.isfinite(), theirs.codes, 0.0))
        diff[f"{name.upper()} microscales"] = differing(getattr(ops, f"{name}_scale"), theirs.scale)
        diff[f"{name.upper()} values"] = differing(mine, theirs.codes * scale)
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
    return diff


def main():
    for i, case in enumerate(CASES):
        method, opts, b, h, n, d, layout, kind = case
        q, k, v = inputs(b, h, n, d, layout, kind, seed=1000 + i)
        plan = get_method(method).plan(opts)
        emu = prepare(q, k, v, plan)
        ops = nvfp4.prepare(q, k, v, plan, permutation=emu.permutation)
        diff = operand_differences(ops, emu)

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


def poisoned():
    for i, case in enumerate(POISON_CASES):
        method, opts, b, h, n, d = case
        plan = get_method(method).plan(opts)
        clean = inputs(b, h, n, d, "hnd", "bf16", seed=2000 + i)
        perm = prepare(*clean, plan).permutation  # a cached order, the same for every call
        out = {}
        for operand, bad in [(None, None)] + [(o, x) for o in "qkv" for x in POISON_VALUES]:
            q, k, v = (x.clone() for x in clean)
            if operand is not None:
                {"q": q, "k": k, "v": v}[operand][1, 0, 37, 5] = POISON_VALUES[bad]
            emu = prepare(q, k, v, plan, permutation=perm)
            ops = nvfp4.prepare(q, k, v, plan, permutation=perm)
            out[operand] = torch.full((b, h, n, d), float("nan"), dtype=torch.float32)
            nvfp4_attention.launch(ops, plan, out[operand])
            if operand is None:
                continue
            others = torch.ones(b, h, dtype=torch.bool)
            others[1, 0] = False
            emu_out = finish(run(emu, plan)[0], n, plan)
            print(json.dumps({
                "poison": poison_name(case, operand, bad),
                "differing": operand_differences(ops, emu),
                "others_equal": torch.equal(out[operand][others], out[None][others]),
                "head_all_nan": bool(out[operand][1, 0].isnan().all()),
                "emulation_head_all_nan": bool(emu_out[1, 0].isnan().all()),
            }), flush=True)


if __name__ == "__main__":
    sys.exit(main() or poisoned())
