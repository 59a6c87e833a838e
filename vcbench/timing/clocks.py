"""The SM clock and power draw a timing window ran at.

An H200 running an 8-bit attention kernel at the Wan2.2 shape sits at its 700 W limit and
lowers its SM clock to stay there: two kernels that take the same number of cycles can differ
in time by the clock the energy of their tiles allows (docs/perf.md, "What binds"). So every
timed window also records the clock and the power, read from NVML (torch.cuda.clock_rate and
power_draw, which need nvidia-ml-py) on a thread while the window runs. Where NVML cannot be
read, the figures are NaN and nothing else changes.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections.abc import Callable

Reading = tuple[float, float]  # (SM clock MHz, power W)


def nvml_reader(device: int | None = None) -> Callable[[], Reading] | None:
    """A function reading (SM MHz, W) of `device` now, or None where NVML cannot be read."""
    import torch

    def read() -> Reading:
        return float(torch.cuda.clock_rate(device)), torch.cuda.power_draw(device) / 1e3

    try:
        read()
    except Exception:  # no nvidia-ml-py, no driver, a device NVML does not see: no figures
        return None
    return read


class Sampler:
    """Calls `read` every `period_s` on a thread, from entering the block to leaving it (once
    at each end too, so a window shorter than the period still has two readings).

        with Sampler(read) as s:
            ...                    # the timed work
        s.sm_mhz, s.power_w        # medians of the readings; NaN if read is None
    """

    def __init__(self, read: Callable[[], Reading] | None, period_s: float = 0.1):
        self.read, self.period_s = read, period_s
        self.readings: list[Reading] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> bool:
        try:
            self.readings.append(self.read())
            return True
        except Exception:  # NVML went away mid-window: keep what was read
            return False

    def _loop(self) -> None:
        while self._sample() and not self._stop.wait(self.period_s):
            pass

    def __enter__(self) -> Sampler:
        if self.read is not None:
            self._thread = threading.Thread(target=self._loop, name="vcbench-clocks", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._sample()

    def _median(self, i: int) -> float:
        return statistics.median(r[i] for r in self.readings) if self.readings else math.nan

    @property
    def sm_mhz(self) -> float:
        return self._median(0)

    @property
    def power_w(self) -> float:
        return self._median(1)
