"""fp8-fa4: the paper's naive 8-bit FlashAttention-4 baseline.

Q, K, V in E4M3 with one scale per tile block (round to nearest, no smoothing); P~ from the
FP32 exponential, scaled by 448 and cast to E4M3. `hadamard_qk` rotates Q and K first (the
paper's strongest training-free treatment of the score product).
"""

from vcbench.kernels.spec.formats import E4M3
from vcbench.kernels.spec.granularity import PerBlock, Quantizer
from vcbench.kernels.spec.method import Method, Option, Plan
from vcbench.kernels.spec.probability import ExpThenCast

P_SCALE = 448.0


def build(opts) -> Plan:
    bm, bn = opts["block_m"], opts["block_n"]
    return Plan(q=Quantizer(E4M3, PerBlock(bm)), k=Quantizer(E4M3, PerBlock(bn)),
                v=Quantizer(E4M3, PerBlock(bn)), p=ExpThenCast(E4M3, P_SCALE),
                hadamard_qk=opts["hadamard_qk"], block_m=bm, block_n=bn)


METHOD = Method(
    name="fp8-fa4",
    summary="8-bit FlashAttention-4: per-block E4M3 Q/K/V, round to nearest, exp then cast",
    qk_bits=8, pv_bits=8, smoothing="none",
    build=build,
    options={"hadamard_qk": Option(False, "rotate Q and K by a Hadamard matrix", types=(bool,))},
)
