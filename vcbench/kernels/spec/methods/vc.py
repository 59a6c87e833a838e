"""VC-Attention: V-Smooth on the host method's V path, and ExpCast-FP8 for P at 8 bits.

vc-8bit          SageAttention2's QK path + V-Smooth + ExpCast-FP8 (datacenter config)
vc-8bit-vsmooth  the same with P from exp2 then cast (scaled by 2^8, as ExpCast is, so the
                 pair is an A/B of the P encoding alone)
vc-8bit-fp8qk    vc-8bit with Q and K in E4M3 instead of INT8 (paper 4.5, Table 4: the
                 configuration for cards without an INT8 QK product); only the score format
                 differs from vc-8bit, so the pair is an A/B of INT8 against FP8 scores
vc-4bit          SageAttention3 + V-Smooth, block means added unscaled (workstation config)

Every VC method rotates Q and K by the QK Hadamard (`hadamard_qk`, on by default: the paper's
VC-Attention fuses it into the Q and K quantizers, section 3.4 and appendix B); the host
baselines keep it off, as released, with `hadamard_qk=True` their "+Hadamard" variants.

Per-call options: `permutation` (B, H, N) reuses a cached token order (the grouping schedule
drives this), `centroids` warm-starts k-means, `grid` (T, H, W) feeds the `cube` order, and
`vsmooth=False` runs the host kernel without V-Smooth (steps outside the grouping window).
"""

import torch

from vcbench.kernels.spec.expcast import DEFAULT_BETA, P_SCALE
from vcbench.kernels.spec.formats import E4M3
from vcbench.kernels.spec.method import Method, Option, Plan
from vcbench.kernels.spec.methods import sage2, sage3
from vcbench.kernels.spec.probability import ExpCast, ExpThenCast, NVFP4Probability
from vcbench.kernels.spec.vsmooth import ORDERS, VSmoothConfig

VSMOOTH_OPTIONS = {
    "vsmooth": Option(True, "apply V-Smooth (False: the host kernel, as outside the window)",
                      types=(bool,)),
    "vsmooth_order": Option("kmeans", "token order before block demeaning", choices=ORDERS),
    "vsmooth_clusters": Option(32, "k of the k-means", types=(int,)),
    "vsmooth_iters": Option(10, "k-means iterations", types=(int,)),
    "vsmooth_warm_iters": Option(5, "k-means iterations when warm-started from cached centroids",
                                 types=(int,)),
    "vsmooth_cube": Option((2, 8, 8), "cube (t, h, w) of the `cube` order", types=(tuple, list)),
    "hadamard_v": Option(False, "rotate V by a Hadamard matrix (Table 1 ablation)", types=(bool,)),
    "permutation": Option(None, "cached token order (B, H, N) to reuse", types=(torch.Tensor,)),
    "centroids": Option(None, "k-means warm start (B, H, k, D)", types=(torch.Tensor,)),
    "grid": Option(None, "latent grid (T, H, W) for the cube order", types=(tuple, list)),
}


# The QK Hadamard, on: it overrides the host method's option of the same name (off there).
HADAMARD_QK = {"hadamard_qk": Option(True, "rotate Q and K by a Hadamard matrix (the paper's "
                                           "VC-Attention does)", types=(bool,))}


def vsmooth_config(opts) -> VSmoothConfig | None:
    if not opts["vsmooth"]:
        return None
    if opts["vsmooth_clusters"] < 1 or min(opts["vsmooth_iters"], opts["vsmooth_warm_iters"]) < 0:
        from vcbench.errors import UserError

        raise UserError("vsmooth_clusters must be >= 1, vsmooth_iters and vsmooth_warm_iters >= 0")
    return VSmoothConfig(order=opts["vsmooth_order"], clusters=opts["vsmooth_clusters"],
                         iters=opts["vsmooth_iters"], warm_iters=opts["vsmooth_warm_iters"],
                         cube=tuple(opts["vsmooth_cube"]),
                         hadamard_v=opts["hadamard_v"], block_rows=opts["block_n"])


def build_8bit(opts) -> Plan:
    return Plan(**sage2.qk_path(opts), v=sage2.V_PER_CHANNEL, p=ExpCast(opts["expcast_beta"]),
                vsmooth=vsmooth_config(opts))


def build_8bit_fp8qk(opts) -> Plan:
    return Plan(**sage2.qk_path(opts, fmt=E4M3), v=sage2.V_PER_CHANNEL,
                p=ExpCast(opts["expcast_beta"]), vsmooth=vsmooth_config(opts))


def build_8bit_vsmooth(opts) -> Plan:
    return Plan(**sage2.qk_path(opts), v=sage2.V_PER_CHANNEL, p=ExpThenCast(E4M3, P_SCALE),
                vsmooth=vsmooth_config(opts))


def build_4bit(opts) -> Plan:
    return Plan(**sage3.fp4_qk_path(opts), v=sage3.V_FP4, p=NVFP4Probability(two_level=True),
                vsmooth=vsmooth_config(opts))


VC_8BIT = Method(
    name="vc-8bit",
    summary="VC-Attention 8-bit: SageAttention2 QK + V-Smooth + ExpCast-FP8",
    qk_bits=8, pv_bits=8, smoothing="K mean + V-Smooth",
    build=build_8bit,
    options={**sage2.OPTIONS, **VSMOOTH_OPTIONS, **HADAMARD_QK,
             "expcast_beta": Option(DEFAULT_BETA, "ExpCast centering constant", types=(int, float))},
)
VC_8BIT_FP8QK = Method(
    name="vc-8bit-fp8qk",
    summary="VC-Attention 8-bit with FP8 scores: E4M3 QK (smoothed K) + V-Smooth + ExpCast-FP8",
    qk_bits=8, pv_bits=8, smoothing="K mean + V-Smooth",
    build=build_8bit_fp8qk,
    options=VC_8BIT.options,
)
VC_8BIT_VSMOOTH = Method(
    name="vc-8bit-vsmooth",
    summary="VC-Attention 8-bit without ExpCast: SageAttention2 QK + V-Smooth, exp then cast",
    qk_bits=8, pv_bits=8, smoothing="K mean + V-Smooth",
    build=build_8bit_vsmooth,
    options={**sage2.OPTIONS, **VSMOOTH_OPTIONS, **HADAMARD_QK},
)
VC_4BIT = Method(
    name="vc-4bit",
    summary="VC-Attention 4-bit: SageAttention3 + V-Smooth",
    qk_bits=4, pv_bits=4, smoothing="K mean, Q block mean + V-Smooth",
    build=build_4bit,
    options={**sage3.OPTIONS, **VSMOOTH_OPTIONS, **HADAMARD_QK},
)
