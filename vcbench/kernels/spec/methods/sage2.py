"""sage2-8bit: SageAttention2's released INT8 QK / FP8 PV configuration.

K smoothed by its token mean; Q and K INT8 with per-block scales (Q per warp, 16 rows, as the
sm90 kernel does; `q_granularity="block"` for one scale per query tile); V E4M3 with one scale
per channel (applied in the epilogue); P~ from exp2, scaled by 448, cast to E4M3; FP32
accumulation, or `accum="fp22"` for SageAttention2's two-level scheme (each tile's product
held at FP22 precision, then added into FP32). `hadamard_qk` (off, as released) rotates Q and
K first.

`qk_path` and `v_per_channel` are shared with VC-Attention's 8-bit methods, which keep this
exact QK path.
"""

from vcbench.kernels.spec.formats import E4M3, INT8
from vcbench.kernels.spec.granularity import PerBlock, PerChannel, PerWarp, Quantizer
from vcbench.kernels.spec.method import Method, Option, Plan
from vcbench.kernels.spec.probability import ExpThenCast

P_SCALE = 448.0
V_PER_CHANNEL = Quantizer(E4M3, PerChannel())

OPTIONS = {
    "q_granularity": Option("warp", "INT8 Q scale per warp (16 rows) or per query tile",
                            choices=("warp", "block")),
    "accum": Option("fp32", "PV accumulation: fp32, or fp22 two-level as on Hopper",
                    choices=("fp32", "fp22")),
    "hadamard_qk": Option(False, "rotate Q and K by a Hadamard matrix", types=(bool,)),
}


def qk_path(opts, fmt=INT8) -> dict:
    """Q per warp (or per query tile) and K per KV tile in `fmt`, K smoothed by its token
    mean, the softmax scale folded into Q, Q and K rotated when `hadamard_qk` is on. `fmt=E4M3`
    is VC-Attention's FP8-QK configuration: the same path with only the score format changed."""
    q_gran = PerWarp(16) if opts["q_granularity"] == "warp" else PerBlock(opts["block_m"])
    return dict(q=Quantizer(fmt, q_gran), k=Quantizer(fmt, PerBlock(opts["block_n"])),
                smooth_k=True, hadamard_qk=opts["hadamard_qk"], accum=opts["accum"],
                block_m=opts["block_m"], block_n=opts["block_n"])


def build(opts) -> Plan:
    return Plan(**qk_path(opts), v=V_PER_CHANNEL, p=ExpThenCast(E4M3, P_SCALE))


METHOD = Method(
    name="sage2-8bit",
    summary="SageAttention2: INT8 QK with smoothed K, FP8 PV with per-channel V scale",
    qk_bits=8, pv_bits=8, smoothing="K mean",
    build=build,
    options=OPTIONS,
)
