"""Device check: the NVFP4 methods' preprocessing (`triton.nvfp4.prepare`), timed and checked.

1. Bit-equality on the GPU, at a small shape (N not a multiple of the tiles, a V-Smooth
   permutation): every operand of every 4-bit plan (the QK Hadamard on and off, attnqat-tf's
   outer scales rotated too) against the emulation's `prepare` on the same CUDA tensors,
   compiled kernels with their Markstein divisions. A NaN in one (batch, head) once a plan.
2. GPU time per call at the Wan2.2 shape (B1 H40 N75600 D128, BF16 random normal): every
   kernel the call launches, by CUPTI (`vcbench.timing.cupti`), and torch.cuda.Event over
   warm calls (host gaps included); vc-4bit's permutation from one k-means grouping, outside
   the timer. With `--sweep`, the quantizers' step sizes and warps too (module constants).

Prints a table last; exits 1 if an operand differs.

    PYTHONPATH=$PWD python3 benchmarks/checks/nvfp4_prep_time.py [--sweep] [--seconds 1,2]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import torch

from vcbench.kernels import get_method, group
from vcbench.kernels.backends.triton import nvfp4
from vcbench.kernels.reference.engine import prepare as emulate_prepare
from vcbench.kernels.reference.vsmooth import permute_tokens, token_mean
from vcbench.kernels.spec.rotation import rotate
from vcbench.timing.cupti import time_kernels

PLANS = {  # label -> (method, options, rotate a plan without the option)
    "sage3-4bit": ("sage3-4bit", {}, False),
    "sage3-4bit+hadamard": ("sage3-4bit", {"hadamard_qk": True}, False),
    "vc-4bit": ("vc-4bit", {}, False),
    "vc-4bit-no-hadamard": ("vc-4bit", {"hadamard_qk": False}, False),
    "vc-4bit-plain": ("vc-4bit", {"vsmooth": False}, False),
    "attnqat-tf": ("attnqat-tf", {}, False),
    "attnqat-tf+hadamard": ("attnqat-tf", {}, True),
}
WAN22 = (1, 40, 75600, 128)
# (QK_CHUNK, QK_WARPS, V_CHUNK, V_WARPS): the default first
SWEEP = [(32, 4, 32, 4), (16, 4, 16, 4), (32, 8, 32, 8), (64, 8, 64, 8), (16, 2, 32, 4)]


def plan_of(label):
    method, opts, rotated = PLANS[label]
    plan = get_method(method).plan(opts)
    return dataclasses.replace(plan, hadamard_qk=True) if rotated else plan


def differing(got, want) -> int:
    got, want = got.float().reshape(want.shape), want.float()
    return int(((got != want) & ~(got.isnan() & want.isnan())).sum())


def differences(q, k, v, plan, perm) -> dict:
    """Elements of each operand that differ from the emulation's (codes where its scales are
    finite, microscales, values, outer scales, block means, what the bias reads), and the
    compiled kernel's key order against the natural one's rows."""
    emu = emulate_prepare(q, k, v, plan, permutation=perm)
    ops = nvfp4.prepare(q, k, v, plan, permutation=perm)
    diff = {}
    for name in "qkv":
        theirs = getattr(emu, name)
        scale = theirs.expanded_scale()
        diff[f"{name} codes"] = differing(ops.codes(name),
                                          torch.where(scale.isfinite(), theirs.codes, 0.0))
        diff[f"{name} microscales"] = differing(getattr(ops, f"{name}_scale"), theirs.scale)
        diff[f"{name} values"] = differing(getattr(ops, name), theirs.codes * scale)
        if theirs.outer is not None:
            diff[f"{name} outer"] = differing(getattr(ops, f"{name}_outer"), theirs.outer)
    if emu.v_mean is not None:
        diff["v means"] = differing(ops.v_mean, emu.v_mean)
    if emu.q_mean is not None:
        b, h, n, d = q.shape
        diff["q means"] = differing(ops.q_mean, emu.q_mean)
        bias = rotate(emu.q_mean) if plan.hadamard_qk else emu.q_mean
        diff["bias q"] = differing(ops.bias_q, bias)
        gathered = k if perm is None else permute_tokens(k, perm.long())
        diff["k input"] = differing(ops.k_input, gathered)
        mean = token_mean(gathered.float()) if plan.smooth_k else torch.zeros_like(k[:, :, :1]).float()
        diff["k mean"] = differing(ops.k_mean, mean)
    ordered = nvfp4.prepare(q, k, v, plan, permutation=perm, key_order="sm90")
    for name in "kv":
        diff[f"{name} in the kernel's key order"] = differing(ordered.in_key_order(name),
                                                              getattr(ops, name))
    return diff


def inputs(b, h, n, d, seed, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, device=device, generator=g) for _ in range(3))
    q = q + 2 * torch.randn(b, h, 1, d, device=device, generator=g)
    k = k + 3 * torch.randn(b, h, 1, d, device=device, generator=g)
    k[..., :8] *= 40.0  # channel outliers: what the rotation spreads
    v[:, :, ::97] *= 30.0
    return tuple(x.to(torch.bfloat16) for x in (q, k, v))


def check(label, shape=(2, 3, 1000, 128), device="cuda") -> int:
    """Prints whether `label`'s operands are the emulation's, clean and with a NaN in K; returns
    how many operands differ."""
    plan = plan_of(label)
    b, h, n, d = shape
    q, k, v = inputs(b, h, n, d, seed=7, device=device)
    perm = None
    if plan.vsmooth is not None:
        g = torch.Generator(device=device).manual_seed(8)
        perm = torch.argsort(torch.rand(b, h, n, device=device, generator=g), -1)
    bad = {key: c for key, c in differences(q, k, v, plan, perm).items() if c}
    k[b - 1, h - 1, n // 3, 3] = float("nan")
    bad.update({f"{key} (a NaN in k)": c
                for key, c in differences(q, k, v, plan, perm).items() if c})
    print(f"{label:22s} {'bit-equal' if not bad else bad}", flush=True)
    return len(bad)


def timed(label, x, perm, warmup_s, window_s, key_order="natural"):
    plan = plan_of(label)
    perm = perm if plan.vsmooth is not None else None

    def call():
        return nvfp4.prepare(*x, plan, permutation=perm, key_order=key_order)

    cupti = time_kernels(call, warmup_s, window_s, min_calls=5).per_call_ms()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    call()
    start.record()
    for _ in range(10):
        call()
    end.record()
    torch.cuda.synchronize()
    return cupti, start.elapsed_time(end) / 10


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sweep", action="store_true", help="also other step sizes and warps")
    parser.add_argument("--seconds", default="1,2", help="warm-up,window in seconds")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU (sm_90 or newer)", file=sys.stderr)
        return 2
    warmup, window = (float(s) for s in args.seconds.split(","))
    print(torch.cuda.get_device_name())
    wrong = 0
    x = inputs(*WAN22, seed=0)
    vsmooth = get_method("vc-4bit").plan({}).vsmooth
    perm = group(x[2], vsmooth).permutation
    rows = []
    for config in SWEEP if args.sweep else SWEEP[:1]:
        nvfp4.QK_CHUNK, nvfp4.QK_WARPS, nvfp4.V_CHUNK, nvfp4.V_WARPS = config
        print(f"steps {config}:")
        wrong += sum(check(label) for label in PLANS)
        for label in PLANS:
            cupti, events = timed(label, x, perm, warmup, window)
            rows.append((label, config, cupti, events))
            print(f"{label:22s} {config} {cupti:7.3f} ms (CUPTI) {events:7.3f} ms (events)",
                  flush=True)
        cupti, events = timed("vc-4bit", x, perm, warmup, window, key_order="sm90")
        rows.append(("vc-4bit sm90 order", config, cupti, events))
    nvfp4.QK_CHUNK, nvfp4.QK_WARPS, nvfp4.V_CHUNK, nvfp4.V_WARPS = SWEEP[0]

    b, h, n, d = WAN22
    print(f"\nnvfp4.prepare at B{b} H{h} N{n} D{d} bf16, GPU ms a call "
          f"(steps: QK_CHUNK, QK_WARPS, V_CHUNK, V_WARPS)")
    print(f"{'plan':24s} {'steps':16s} {'CUPTI':>7s} {'events':>7s}")
    for label, config, cupti, events in rows:
        print(f"{label:24s} {str(config):16s} {cupti:7.3f} {events:7.3f}")
    print("bit-equal to the emulation" if not wrong else f"{wrong} operands differ")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
