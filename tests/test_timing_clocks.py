"""The clock and power sampler beside every timing window (vcbench.timing.clocks)."""

import math
import threading
import time

import pytest
import torch

from vcbench.timing.clocks import Sampler, nvml_reader


class Counter:
    """A reader whose k-th reading is (k, 10 k), so the medians say which readings were taken."""

    def __init__(self, fail_after: int | None = None):
        self.k, self.fail_after, self.lock = 0, fail_after, threading.Lock()

    def __call__(self):
        with self.lock:
            if self.fail_after is not None and self.k >= self.fail_after:
                raise RuntimeError("NVML went away")
            self.k += 1
            return float(self.k), 10.0 * self.k


def test_a_window_is_read_from_its_start_to_its_end():
    read = Counter()
    with Sampler(read, period_s=0.01) as s:
        time.sleep(0.2)
    taken = read.k
    assert taken >= 4  # every ~10 ms for 200 ms, one more at the end
    assert [r[0] for r in s.readings] == [float(i) for i in range(1, taken + 1)]
    assert s.sm_mhz == (taken + 1) / 2 and s.power_w == 10 * (taken + 1) / 2  # median of 1..k
    time.sleep(0.05)
    assert read.k == taken  # nothing is read after the block


def test_a_window_shorter_than_the_period_has_its_two_end_readings():
    read = Counter()
    with Sampler(read, period_s=60.0) as s:
        pass
    assert [r[0] for r in s.readings] == [1.0, 2.0] and s.sm_mhz == 1.5


def test_a_reader_that_fails_keeps_what_it_read_and_raises_nothing():
    with Sampler(Counter(fail_after=3), period_s=0.01) as s:
        time.sleep(0.1)
    assert [r[1] for r in s.readings] == [10.0, 20.0, 30.0] and s.power_w == 20.0


def test_no_reader_means_no_thread_and_nan():
    before = threading.active_count()
    with Sampler(None) as s:
        assert threading.active_count() == before
    assert math.isnan(s.sm_mhz) and math.isnan(s.power_w) and s.readings == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a GPU")
def test_without_a_gpu_there_is_no_reader():
    assert nvml_reader() is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_timed_window_carries_the_clock_and_power_it_ran_at():
    from vcbench.timing.cupti import time_kernels

    if nvml_reader() is None:
        pytest.skip("NVML cannot be read here (nvidia-ml-py missing?)")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    t = time_kernels(lambda: a @ a, warmup_s=0.5, window_s=1.0)
    assert 100 < t.sm_mhz < 3000 and t.power_w > 10  # a GPU's clock in MHz, a busy card's watts


def test_alternating_launches_are_told_apart_by_name_or_by_their_order():
    from vcbench.timing.cupti import KernelTimes, alternating_medians

    # two kernels of their own names, alternating, with a third kernel between them
    order = (("a", 1.0), ("pad", 9.0), ("b", 2.0), ("a", 3.0), ("b", 4.0), ("a", 5.0), ("b", 60.0))
    two = KernelTimes(3, order)
    assert two.by_kernel == {"a": [1.0, 3.0, 5.0], "pad": [9.0], "b": [2.0, 4.0, 60.0]}
    assert alternating_medians(two, "a", "b") == (3.0, 4.0)
    # one name for both (a Triton kernel's two specialisations): the first launch of each pair
    # is a's, the second b's, whatever their durations
    order = (("k", 10.0), ("k", 1.0), ("k", 30.0), ("k", 2.0), ("k", 20.0), ("k", 3.0))
    one = KernelTimes(3, order)
    assert alternating_medians(one, "k", "k") == (20.0, 2.0)
    with pytest.raises(RuntimeError, match="not pairs"):
        alternating_medians(KernelTimes(1, (("k", 1.0),)), "k", "k")
