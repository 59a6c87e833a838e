"""The Triton backend: vcbench's fused preprocessing and 8-bit attention kernel (`operands.py`,
`quantize.py`, `attention.py`) and V-Smooth's k-means (`kmeans.py`). Any shape the emulation
takes; the bit-faithful GPU reference for the 8-bit plans, and the fallback of the compiled
kernel."""

from __future__ import annotations

from vcbench.kernels.backends.common import (
    Backend,
    kernel_preference,
    split_prepared,
    triton_reason,
)
from vcbench.kernels.backends.triton.operands import (
    kernel_switches,
    prepare_gpu,
    unsupported_reason,
)


def run_prepared(ops, plan, out, **launch_config):
    """The 8-bit kernel on prepared operands; `launch_config`: block_m, num_warps, num_stages."""
    from vcbench.kernels.backends.triton.attention import launch

    return launch(ops, out, **kernel_switches(plan), **launch_config)


def _available() -> str | None:
    kernel_preference()  # a bad VCBENCH_KERNEL is an error wherever a kernel is chosen
    return triton_reason()


TRITON = Backend("vcbench-triton", _available, unsupported_reason,
                 split_prepared(prepare_gpu, run_prepared), prepare_gpu, run_prepared)
