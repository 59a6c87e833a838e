"""An external kernel in plain PyTorch (so it runs on a CPU), and the context it can ask for.

    vcbench --plugin examples/plugins/reference_kernel.py methods
    vcbench generate --plugin examples/plugins/reference_kernel.py --methods bf16,torch-sdpa ...
    vcbench check-kernel torch-sdpa --plugin examples/plugins/reference_kernel.py

`torch-sdpa` claims bf16's plan: softmax(QK^T * scale) V, the reference itself, so check-kernel
holds it against bf16's emulation. `torch-sdpa-late-steps` shows the per-call context: it runs
exact attention but counts the calls of each denoising step, as a step-dependent (or sparse)
kernel would read them.
"""

from collections import Counter

import torch.nn.functional as F

import vcbench


def sdpa(q, k, v, *, sm_scale, tensor_layout):
    if tensor_layout == "NHD":  # SDPA takes (B, H, N, D)
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=sm_scale)
    return (out.transpose(1, 2) if tensor_layout == "NHD" else out).to(q.dtype)


CALLS_PER_STEP: Counter = Counter()


def sdpa_with_context(q, k, v, *, sm_scale, tensor_layout, context):
    if context is not None:  # None outside a pipeline (vcbench.attention called directly)
        CALLS_PER_STEP[(context.step, context.num_steps)] += 1
    return sdpa(q, k, v, sm_scale=sm_scale, tensor_layout=tensor_layout)


vcbench.register_kernel("torch-sdpa", sdpa, claims="bf16", devices=("cpu", "cuda"),
                        qk_bits=16, pv_bits=16, smoothing="none",
                        summary="torch SDPA in FP32: exact attention, as a plugin kernel")
vcbench.register_kernel("torch-sdpa-late-steps", sdpa_with_context, context=True,
                        devices=("cpu", "cuda"), qk_bits=16, pv_bits=16, smoothing="none",
                        summary="torch SDPA that reads each call's denoising step")
