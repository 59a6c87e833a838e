"""The Triton backends.

TRITON   vcbench's fused preprocessing and 8-bit attention kernel (`operands.py`, `quantize.py`,
         `attention.py`): any shape the emulation takes; the bit-faithful GPU reference for
         the 8-bit plans, and the fallback of the compiled kernel. Its Q and K quantizers
         apply a call's RoPE on load (`fused_rope`).
NVFP4    the NVFP4 plans (`nvfp4.py`, `nvfp4_attention.py`): E2M1 codes and E4M3 microscales
         bit-equal to the emulation's, dequantized exactly to FP16 and multiplied on 16-bit
         tensor cores. A fidelity kernel: its name says NVFP4 on FP16 MMA wherever its times
         or results appear, never an FP4 kernel's speed. Its Q and K quantizers apply a
         call's RoPE on load too.
`kmeans.py` is V-Smooth's k-means on the GPU."""

from __future__ import annotations

from vcbench.kernels.backends.common import Backend, split_prepared, triton_ready, triton_reason
from vcbench.kernels.backends.triton.operands import (
    kernel_switches,
    nvfp4_unsupported_reason,
    prepare_gpu,
    unsupported_reason,
)

NVFP4_IMPLEMENTATION = "vcbench-triton (nvfp4 on fp16 mma)"


def run_prepared(ops, plan, out, **launch_config):
    """The 8-bit kernel on prepared operands; `launch_config`: block_m, num_warps, num_stages."""
    from vcbench.kernels.backends.triton.attention import launch

    return launch(ops, out, **kernel_switches(plan), **launch_config)


def _available() -> str | None:
    return None if triton_ready() else triton_reason()  # asked on every call: cached when ready


TRITON = Backend("vcbench-triton", _available, unsupported_reason,
                 split_prepared(prepare_gpu, run_prepared), prepare_gpu, run_prepared,
                 label="vcbench's Triton kernel (8-bit)", aliases=("triton",), fused_rope=True)


def prepare_nvfp4(q, k, v, plan, **call):
    from vcbench.kernels.backends.triton import nvfp4

    return nvfp4.prepare(q, k, v, plan, **call)


def run_prepared_nvfp4(ops, plan, out, **launch_config):
    from vcbench.kernels.backends.triton.nvfp4_attention import launch

    return launch(ops, plan, out, **launch_config)


NVFP4 = Backend(NVFP4_IMPLEMENTATION, _available, nvfp4_unsupported_reason,
                split_prepared(prepare_nvfp4, run_prepared_nvfp4), prepare_nvfp4,
                run_prepared_nvfp4, label="nvfp4 on fp16 mma", aliases=("nvfp4",),
                fidelity_only=True, fused_rope=True,
                cost="H200, Wan2.2 shape: 2.7-4.0x BF16 FA4's time (docs/perf.md)")
