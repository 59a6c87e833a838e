"""attnqat-tf: Attn-QAT's FP4 attention run training-free (see docs/methods.md).

Attn-QAT trains a model to tolerate plain NVFP4 attention. Without that training nothing
learned is left, so the forward pass is the format alone: Q, K, V in standard two-level NVFP4
(per-16 E4M3 microscale along the contraction axis under one FP32 scale per batch and head),
no smoothing, and P~ <= 1 microscaled directly with no per-row rescaling.
"""

from vcbench.kernels.spec.formats import E2M1
from vcbench.kernels.spec.granularity import Microscale16, Quantizer
from vcbench.kernels.spec.method import Method, Plan
from vcbench.kernels.spec.probability import NVFP4Probability


def build(opts) -> Plan:
    qk = Quantizer(E2M1, Microscale16(axis=-1, global_scale=True))
    return Plan(q=qk, k=qk, v=Quantizer(E2M1, Microscale16(axis=-2, global_scale=True)),
                p=NVFP4Probability(two_level=False), block_m=opts["block_m"],
                block_n=opts["block_n"])


METHOD = Method(
    name="attnqat-tf",
    summary="Attn-QAT's NVFP4 attention, training-free: plain microscaled NVFP4 everywhere",
    qk_bits=4, pv_bits=4, smoothing="none",
    build=build,
)
