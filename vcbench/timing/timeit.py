"""`vcbench timeit`: attention kernels timed side by side with BF16 in one run.

For each method: the attention kernel alone (preprocessing outside the timer, as the paper
times it) by its per-launch median, TFLOPS = 4 B H N^2 D / t, the fused preprocessing timed
separately (GPU time per call, every kernel it launches), the V-Smooth grouping (k-means)
separately again (warm-started from the last centroids, as the schedule's regroups are, and
cold), the median SM clock and power of the attention window (the card's power limit sets the
clock, so a time is read with them), and the speedup over `bf16` measured in the same run. A
V-Smooth method also gets its schedule's plain-step kernel and preprocessing timed (`plain_ms`,
`plain_preprocess_ms`, its clock `plain_sm_mhz`, and what runs it, `plain_implementation`): the
method without V-Smooth, another plan, which runs most of a clip's steps (30 of Wan2.2's 40)
and which a backend may not take. Then the two kernels launched alternately in one window
(`plain_over_method`, the plain median over the method's): the plain window comes second, on
a warmer card, and only launches that share a clock can say which of two kernels a few
percent apart is faster. An external kernel (a plugin's callable) is timed as one call: its main kernel's
median is `attention_ms`, the rest of its launches `preprocess_ms`.

A preset's q and k are taken as coming before Wan's RoPE (random tables of its form,
spec.rope), and `preprocess_ms` prices RoPE with the rest, as a patched Wan pipeline runs it
(`rope` says where): "quantizers" (the backend's Q and K quantizers rotate on load), "eager"
(q and k rotated by PyTorch first: the emulation's order, for a backend without the fusion or
an external kernel, whose rotation is timed apart and added). Captured tensors (`--tensors`)
are post-RoPE: `rope` is "none" and no RoPE is priced. So the preprocessing figures compare
across methods, and with `project-clip`, whose transformer calls hold RoPE too.

What runs each row is asked of `vcbench.kernels.chosen`, the same choice `attention` makes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch

from vcbench.errors import UserError
from vcbench.kernels import REFERENCE_METHOD, get_method
from vcbench.kernels.spec.rope import Rope, apply_rope, rope_tables
from vcbench.kernels.spec.vsmooth import PLAIN_STEP_OPTIONS

PRESETS = {  # (B, H, N, D), paper appendix A
    "wan22-720p": (1, 40, 75600, 128),
    "longcat-480p": (1, 32, 37440, 128),
    "hunyuan15-720p": (1, 16, 111600, 128),
}


@dataclass(frozen=True)
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    grid: tuple[int, int, int] | None
    label: str
    rope: Rope | None = None  # q and k come before this RoPE (None: they are post-RoPE)


def make_inputs(shape: str | None, tensors: str | None, seed: int = 0) -> Inputs:
    if tensors is not None:
        from vcbench.tensors import load_tensors

        t = load_tensors(tensors)
        q, k, v = (x.cuda().to(torch.bfloat16) for x in (t.q, t.k, t.v))
        return Inputs(q, k, v, t.grid, f"tensors {tensors}")
    b, h, n, d = PRESETS[shape]  # check_request has refused unknown shapes
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    return Inputs(q, k, v, None, f"{shape} random normal (B{b} H{h} N{n} D{d}), "
                  "preprocessing with Wan's RoPE", Rope(*rope_tables(n, d, "cuda")))


def attention_flops(q: torch.Tensor) -> float:
    b, h, n, d = q.shape
    return 4.0 * b * h * n * n * d


@dataclass(frozen=True)
class Launch:
    """A timed plan's attention kernel, ready to launch again on its prepared operands."""

    call: Callable[[], object]
    kernel: str  # its CUPTI name


def time_method(name: str, x: Inputs, warmup_s: float, window_s: float) -> dict:
    method = get_method(name)
    timed, launch = time_plan(name, {}, x, warmup_s, window_s)
    row = {"method": name, **timed}
    if method.uses_vsmooth:  # right after the method's window: the card is warm already
        plain, plain_launch = time_plan(name, PLAIN_STEP_OPTIONS, x, min(warmup_s, 2.0), window_s)
        row.update(plain_ms=plain["attention_ms"], plain_preprocess_ms=plain["preprocess_ms"],
                   plain_implementation=plain["implementation"], plain_sm_mhz=plain["sm_mhz"])
        if launch is not None and plain_launch is not None:
            row["plain_over_method"] = alternated_ratio(launch, plain_launch, window_s)
    return row


def alternated_ratio(method: Launch, plain: Launch, window_s: float) -> float:
    """The plain kernel's median over the method's, the two launched alternately in one
    window: both at the same clock, power and temperature. The plain step's own window comes
    second, on a card the method's window has heated, so its time alone cannot say which
    kernel is faster when they differ by a few percent."""
    from vcbench.timing.cupti import alternating_medians, time_kernels

    def both():
        method.call()
        plain.call()

    times = time_kernels(both, 1.0, window_s)
    t_method, t_plain = alternating_medians(times, method.kernel, plain.kernel)
    return t_plain / t_method


def time_plan(name: str, options: dict, x: Inputs, warmup_s: float,
              window_s: float) -> tuple[dict, Launch | None]:
    """One method's kernel, with `options`, on what `attention` would choose: a row's columns,
    and the kernel to launch again (None for an external kernel, whose call prepares too)."""
    from vcbench.kernels import chosen, group
    from vcbench.timing.cupti import time_kernels

    impl = chosen(name, options, tuple(x.q.shape))
    plan = impl.plan
    rope = x.rope
    fused = rope is not None and impl.fuses_rope
    row: dict = {"implementation": impl.implementation,
                 "rope": "none" if rope is None else "quantizers" if fused else "eager"}
    if impl.prepare is None:  # an external kernel: its preprocessing is inside the call
        whole = time_kernels(lambda: impl.run(x.q, x.k, x.v), warmup_s, window_s)
        row["attention_ms"] = whole.median_ms(whole.main_kernel())
        row["preprocess_ms"] = max(whole.per_call_ms() - row["attention_ms"], 0.0)
        if rope is not None:  # the rotation the kernel's q and k get first, timed apart
            rotate = time_kernels(lambda: (apply_rope(x.q, rope), apply_rope(x.k, rope)),
                                  min(warmup_s, 2.0), min(window_s, 2.0), min_calls=3)
            row["preprocess_ms"] += rotate.per_call_ms()
        attn = whole
        launch = None
    else:
        perm = None
        if plan.vsmooth is not None:
            cold = time_kernels(lambda: group(x.v, plan.vsmooth, grid=x.grid),
                                min(warmup_s, 2.0), min(window_s, 2.0), min_calls=3)
            first = group(x.v, plan.vsmooth, grid=x.grid)
            # The schedule's later regroups start from the cached centroids (warm start).
            warm = time_kernels(lambda: group(x.v, plan.vsmooth, grid=x.grid, init=first.centroids),
                                min(warmup_s, 2.0), min(window_s, 2.0), min_calls=3)
            row["grouping_cold_ms"] = cold.per_call_ms()
            row["grouping_ms"] = warm.per_call_ms()
            perm = first.permutation
        prep = preprocessing(impl, x, perm)
        pre = time_kernels(prep, min(warmup_s, 2.0), min(window_s, 2.0), min_calls=3)
        row["preprocess_ms"] = pre.per_call_ms()
        ops = prep()
        out = torch.empty_like(x.q)
        call = lambda: impl.kernel(ops, out)  # noqa: E731
        attn = time_kernels(call, warmup_s, window_s)
        launch = Launch(call, attn.main_kernel())
        row["attention_ms"] = attn.median_ms(launch.kernel)
    row["tflops"] = attention_flops(x.q) / (row["attention_ms"] * 1e-3) / 1e12
    # the attention window's clock and power: under the card's power limit, time follows them
    row["sm_mhz"], row["power_w"] = attn.sm_mhz, attn.power_w
    return row, launch


def preprocessing(impl, x: Inputs, permutation=None) -> Callable[[], object]:
    """The preprocessing of `impl` (a `chosen` implementation with a prepare) on x as timeit
    prices it: Wan's RoPE inside the quantizers where the backend fuses it, applied eagerly
    first where not. Without a permutation, a V-Smooth plan's prepare groups too."""
    rope = x.rope
    if rope is not None and impl.fuses_rope:
        return lambda: impl.prepare(x.q, x.k, x.v, permutation=permutation, rope=rope)
    if rope is not None:
        return lambda: impl.prepare(apply_rope(x.q, rope), apply_rope(x.k, rope), x.v,
                                    permutation=permutation)
    return lambda: impl.prepare(x.q, x.k, x.v, permutation=permutation)


def check_request(methods: list[str], shape: str | None, tensors: str | None) -> None:
    """Everything that can be refused before any work: no GPU, unknown names."""
    if not torch.cuda.is_available():
        raise UserError("timeit needs a CUDA GPU, and this machine has none")
    for m in methods:
        get_method(m)
    if tensors is None and shape not in PRESETS:
        raise UserError(f"unknown shape {shape!r} (presets: {', '.join(PRESETS)})")


def timeit(methods: list[str], shape: str | None = None, tensors: str | None = None,
           warmup_s: float = 20.0, window_s: float = 10.0, progress=None) -> tuple[pd.DataFrame, str]:
    check_request(methods, shape, tensors)
    if REFERENCE_METHOD not in methods:  # every speedup is against BF16 measured in this run
        methods = [REFERENCE_METHOD, *methods]
    x = make_inputs(shape, tensors)
    rows = []
    for m in methods:
        rows.append(time_method(m, x, warmup_s, window_s))
        if progress is not None:
            progress()
    table = pd.DataFrame(rows)
    base = table.loc[table.method == REFERENCE_METHOD, "attention_ms"].iloc[0]
    table["speedup_vs_bf16"] = base / table.attention_ms
    device = torch.cuda.get_device_name()
    return table, f"{x.label}; {device}; warm-up {warmup_s:g} s, window {window_s:g} s"
