"""Kernel durations from CUPTI activity records.

The paper's protocol (appendix A): isolated launches, a warm-up (default 20 s) then a
measurement window (default 10 s), summarised by the per-launch median. The records come
from torch.profiler, whose Kineto backend reads CUPTI's kernel activity: device-side start
and end of every kernel, with no host timing or launch gaps in them.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class KernelTimes:
    """Every kernel launched in the window as (name, ms), in the order the launches started,
    and the median SM clock (MHz) and power (W) the card ran the window at (NaN where NVML
    cannot be read)."""

    calls: int
    in_order: tuple[tuple[str, float], ...]
    sm_mhz: float = math.nan
    power_w: float = math.nan

    @property
    def by_kernel(self) -> dict[str, list[float]]:
        """The durations by kernel name, each name's in launch order."""
        found: dict[str, list[float]] = defaultdict(list)
        for name, ms in self.in_order:
            found[name].append(ms)
        return dict(found)

    def median_ms(self, name: str) -> float:
        return statistics.median(self.by_kernel[name])

    def main_kernel(self) -> str:
        """The kernel that takes the most time in total: the attention kernel of a call."""
        return max(self.by_kernel, key=lambda k: sum(self.by_kernel[k]))

    def per_call_ms(self) -> float:
        """All kernels' time divided by the number of calls (for multi-kernel stages)."""
        return sum(sum(v) for v in self.by_kernel.values()) / max(self.calls, 1)


def _run_for(fn: Callable[[], object], seconds: float, min_calls: int) -> int:
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < seconds:
        fn()
        calls += 1
        if calls % 8 == 0:  # keep the launch queue short so the window means wall time
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return calls


def time_kernels(fn: Callable[[], object], warmup_s: float = 20.0, window_s: float = 10.0,
                 min_calls: int = 5) -> KernelTimes:
    """Warm up for `warmup_s`, then record every kernel `fn` launches for `window_s`, and the
    clock and power the window ran at."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from vcbench.timing.clocks import Sampler, nvml_reader

    _run_for(fn, warmup_s, 1)
    with profile(activities=[ProfilerActivity.CUDA]) as prof, Sampler(nvml_reader()) as clocks:
        calls = _run_for(fn, window_s, min_calls)
    launches = []
    for event in prof.profiler.kineto_results.events():
        if event.device_type() == DeviceType.CUDA and event.duration_ns() > 0:
            name = event.name()
            if name.startswith("Memcpy") or name.startswith("Memset"):
                continue
            launches.append((event.start_ns(), name, event.duration_ns() / 1e6))
    launches.sort()
    return KernelTimes(calls, tuple((name, ms) for _, name, ms in launches), clocks.sm_mhz,
                       clocks.power_w)


def alternating_medians(times: KernelTimes, name_a: str, name_b: str) -> tuple[float, float]:
    """The per-launch medians of two kernels launched alternately (a, b, a, b, ...) in one
    window. Kernels of different names are told apart by name; one kernel under one name (a
    Triton kernel's two specialisations) by the order its launches started in."""
    if name_a != name_b:
        return times.median_ms(name_a), times.median_ms(name_b)
    same = [ms for name, ms in times.in_order if name == name_a]
    if len(same) < 2 or len(same) % 2:
        raise RuntimeError(f"{name_a}: {len(same)} launches, not pairs of alternate calls")
    return statistics.median(same[0::2]), statistics.median(same[1::2])
