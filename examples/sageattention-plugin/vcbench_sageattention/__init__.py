"""SageAttention 1.0.6 (`pip install sageattention==1.0.6`: Triton, INT8 QK, FP16 PV) as a vcbench
method: an external kernel, run as it is, with no emulation.

vcbench finds it through the entry point in pyproject.toml; nothing here is imported before a
command looks a method up, and `sageattention` itself only when the kernel first runs, so the
plugin loads (and `vcbench methods` lists it) on a machine without a GPU.
"""

from vcbench.kernels import KernelMethod


def sageattn(q, k, v, *, sm_scale, tensor_layout):
    from sageattention import sageattn as kernel  # the package's one call

    return kernel(q, k, v, tensor_layout=tensor_layout, is_causal=False, sm_scale=sm_scale)


METHOD = KernelMethod(
    name="sageattn-1.0.6",
    fn=sageattn,
    summary="SageAttention 1.0.6: INT8 QK (per-block, smoothed K), FP16 PV; Triton",
    qk_bits=8, pv_bits=16, smoothing="K mean",
    devices=("cuda",),
    label="sageattention 1.0.6 (sageattn)",
)
