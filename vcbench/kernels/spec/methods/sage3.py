"""sage3-4bit: SageAttention3, everything in NVFP4.

Q and K in E2M1 with a per-16 E4M3 microscale along the head dim, V along the tokens; K
smoothed by its token mean and Q by each query tile's mean, whose contribution mean_q . K^T is
added back to the scores in FP32 (SageAttention2/3's Q smoothing). P~ with the two-level
scaling: a per-row FP32 scale to [0, 448*6], then the per-16 microscale. `hadamard_qk`
rotates Q and K first.

`fp4_qk_path` is shared with `vc-4bit`.
"""

from vcbench.kernels.spec.formats import E2M1
from vcbench.kernels.spec.granularity import Microscale16, Quantizer
from vcbench.kernels.spec.method import Method, Option, Plan
from vcbench.kernels.spec.probability import NVFP4Probability

V_FP4 = Quantizer(E2M1, Microscale16(axis=-2))
OPTIONS = {"hadamard_qk": Option(False, "rotate Q and K by a Hadamard matrix", types=(bool,))}


def fp4_qk_path(opts) -> dict:
    return dict(q=Quantizer(E2M1, Microscale16(axis=-1)), k=Quantizer(E2M1, Microscale16(axis=-1)),
                smooth_k=True, smooth_q=True, hadamard_qk=opts["hadamard_qk"],
                block_m=opts["block_m"], block_n=opts["block_n"])


def build(opts) -> Plan:
    return Plan(**fp4_qk_path(opts), v=V_FP4, p=NVFP4Probability(two_level=True))


METHOD = Method(
    name="sage3-4bit",
    summary="SageAttention3: NVFP4 Q/K/V/P, Q and K smoothing, two-level P scaling",
    qk_bits=4, pv_bits=4, smoothing="K mean, Q block mean",
    build=build,
    options=OPTIONS,
)
