"""bf16: BF16 FlashAttention-4, the reference every fidelity and speed number is against.

Q, K, V in BF16; S accumulated in FP32 and scaled after the product; exact FP32 softmax; P~
rounded to BF16 for the PV product (as FlashAttention does); FP32 accumulation.
"""

from vcbench.kernels.spec.formats import BF16
from vcbench.kernels.spec.granularity import Quantizer, Unscaled
from vcbench.kernels.spec.method import Method, Plan
from vcbench.kernels.spec.probability import ExpThenCast

_bf16 = Quantizer(BF16, Unscaled())


def build(opts) -> Plan:
    return Plan(q=_bf16, k=_bf16, v=_bf16, p=ExpThenCast(BF16), fold_scale_into_q=False,
                block_m=opts["block_m"], block_n=opts["block_n"])


METHOD = Method(
    name="bf16",
    summary="BF16 FlashAttention-4 (reference)",
    qk_bits=16, pv_bits=16, smoothing="none",
    build=build,
)
