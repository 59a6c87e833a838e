"""`vcbench analyze expcast`: ExpCast-FP8 against exp-then-cast over one doubling of the score.

Every unit interval of the log2 score looks the same to both paths, so one is enough: the
fractional part f in [0, 1) of z = u + 8. Both bytes are step functions of f, so everything
here is computed exactly from their breakpoints rather than by sampling:

    byte_agreement  share of the interval on which ExpCast writes exp-then-cast's byte (79.6%)
    max_code_diff   largest difference of the two bytes
    beta_minimax    the shift centring Mitchell's error e(f) = 8 (f - (2^f - 1)) (-0.3443)
    ratio_min/max   range of decoded / exact over the interval (0.9290, 1.0746 at beta -0.35)
    tv_bound        (sqrt(b) - sqrt(a)) / (sqrt(b) + sqrt(a)), Proposition 3.1's row bound
    max_rel_error   largest per-element relative error, max(b - 1, 1 - a)
"""

from __future__ import annotations

import math

import numpy as np
import torch

from vcbench.kernels.spec.expcast import DEFAULT_BETA, ROW_MAX_CODE

# A binade well inside E4M3's normal range: z in [7, 8) decodes to [128, 256).
_BINADE = 7


def _expcast_byte(f: np.ndarray, beta: float) -> np.ndarray:
    # Round half to even, as the kernel; the clip never acts inside this binade.
    return np.clip(np.round(8.0 * (f + _BINADE - 8) + ROW_MAX_CODE + beta), 0, ROW_MAX_CODE)


def _cast_byte(f: np.ndarray) -> np.ndarray:
    values = torch.from_numpy(np.exp2(f + _BINADE)).float()
    return values.to(torch.float8_e4m3fn).view(torch.uint8).numpy().astype(np.float64)


def _decode(byte: np.ndarray) -> np.ndarray:
    return torch.from_numpy(byte.astype(np.uint8)).view(torch.float8_e4m3fn).float().double().numpy()


def _cells(beta: float) -> np.ndarray:
    """Sorted breakpoints in [0, 1] where either byte changes, endpoints included."""
    base = 8.0 * (_BINADE - 8) + ROW_MAX_CODE + beta  # byte = round(8 f + base)
    expcast = (math.floor(base) + np.arange(-2, 11) + 0.5 - base) / 8.0
    cast = np.log2(1.0 + (np.arange(8) + 0.5) / 8.0)  # midpoints of the E4M3 grid in a binade
    points = np.concatenate([[0.0, 1.0], expcast, cast])
    return np.unique(points[(points >= 0.0) & (points <= 1.0)])


def mitchell_error(f: np.ndarray | float) -> np.ndarray | float:
    """e(f) = 8 (f - (2^f - 1)): how far below the straight line the byte sits (Eq. 9)."""
    return 8.0 * (f - (np.exp2(f) - 1.0))


def analyze_expcast(beta: float = DEFAULT_BETA) -> dict[str, float]:
    edges = _cells(beta)
    left, right = edges[:-1], edges[1:]
    mid = (left + right) / 2
    a_byte, c_byte = _expcast_byte(mid, beta), _cast_byte(mid)
    agree = float(np.sum((right - left)[a_byte == c_byte]))

    decoded = _decode(a_byte)
    # 1/2^f falls inside a cell, so its extremes sit at the cell ends (one-sided limits).
    ratio_hi = decoded / np.exp2(left + _BINADE)
    ratio_lo = decoded / np.exp2(right + _BINADE)
    a, b = float(ratio_lo.min()), float(ratio_hi.max())

    f_star = -math.log2(math.log(2.0))  # where e'(f) = 0
    e_max, e_min = float(mitchell_error(f_star)), 0.0  # e(0) = e(1) = 0
    return {
        "beta": beta,
        "byte_agreement": agree,
        "max_code_diff": int(np.max(np.abs(a_byte - c_byte))),
        "beta_minimax": -(e_max + e_min) / 2.0,
        "mitchell_error_max": e_max,
        "ratio_min": a,
        "ratio_max": b,
        "tv_bound": (math.sqrt(b) - math.sqrt(a)) / (math.sqrt(b) + math.sqrt(a)),
        "max_rel_error": max(b - 1.0, 1.0 - a),
    }


def byte_map(beta: float = DEFAULT_BETA, samples: int = 1024) -> dict[str, np.ndarray]:
    """Both bytes and the relative error of ExpCast's decoded value over f in [0, 1), for
    plotting Figure 5."""
    f = (np.arange(samples) + 0.5) / samples
    a_byte, c_byte = _expcast_byte(f, beta), _cast_byte(f)
    rel = _decode(a_byte) / np.exp2(f + _BINADE) - 1.0
    return {"f": f, "expcast_byte": a_byte, "cast_byte": c_byte, "expcast_rel_error": rel}
