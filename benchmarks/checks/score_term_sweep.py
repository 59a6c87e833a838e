"""Device script: Q smoothing's score term (triton/nvfp4.py `score_term`, 8.8 ms a call at the
Wan2.2 shape on the H200) against a keys-major form of the same product, at a few tiles.

The shipped kernel puts the query blocks' split means on the product's M side (A, in
registers: 128 registers a thread at 128 blocks, so the tile spills); `keys_major` puts the
keys there and the means on the B side, which Triton keeps in shared memory for the whole
program (Triton 3.6 for sm_90, 128 blocks x 64 keys on 8 warps: 88 bytes a thread spilled
against 312). Both take the same arguments, so each is swapped into `nvfp4._score_term` and run
through `nvfp4.score_term`; every configuration is first held to the tests' bound
(tests/test_score_term.py `check_direct`) on the GPU, then timed (CUPTI medians) on 40 heads x
591 query blocks x 75600 keys. The winner goes into nvfp4.py and this script is deleted.

    PYTHONPATH=$PWD:$PWD/tests python3 benchmarks/checks/score_term_sweep.py [--seconds 1,2]
    TRITON_INTERPRET=1 PYTHONPATH=$PWD:$PWD/tests python3 benchmarks/checks/score_term_sweep.py --check-only
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from test_score_term import check_direct  # noqa: E402

from vcbench.kernels.backends.triton import nvfp4  # noqa: E402
from vcbench.kernels.backends.triton.nvfp4 import _tf32_halves, centered_keys, score_program  # noqa: E402


@triton.jit
def keys_major(BiasQ, KIn, KMean, Out, n, nk_pad, q_blocks, key_chunks, m_tiles,
               D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, TILES: tl.constexpr):
    """nvfp4._score_term's term, as (BN keys x D) . (D x BM query blocks): the centered keys'
    TF32 halves as A, the means' halves (loaded and split once a program) as B."""
    chunk, bh, blocks, in_m = score_program(key_chunks, m_tiles, q_blocks, BM)
    cols = tl.arange(0, D)
    means_t = tl.load(BiasQ + (bh * q_blocks + blocks)[None, :] * D + cols[:, None],
                      mask=in_m[None, :], other=0.0)
    m_big, m_small = _tf32_halves(means_t)
    k_mean = tl.load(KMean + bh * D + cols)
    for t in range(TILES):
        keys = (chunk * TILES + t) * BN + tl.arange(0, BN)
        k_big, k_small = _tf32_halves(centered_keys(KIn, k_mean, bh, n, keys, D))
        term = tl.dot(k_small, m_big, input_precision="tf32")
        term = tl.dot(k_big, m_small, term, input_precision="tf32")
        term = tl.dot(k_big, m_big, term, input_precision="tf32")
        tl.store(Out + (bh * q_blocks + blocks)[None, :] * nk_pad + keys[:, None], term,
                 mask=in_m[None, :] & (keys < nk_pad)[:, None])


FORMS = {"shipped": nvfp4._score_term, "keys-major": keys_major}
# (query blocks, keys a dot, key tiles a program, warps, stages); the first is shipped's
TILES = [(128, 64, 8, 8, 1), (128, 64, 8, 8, 2), (128, 64, 16, 8, 1), (128, 64, 8, 4, 1),
         (64, 128, 8, 4, 1)]
WAN22 = (40, 75600, 128)


def configure(form, tile):
    nvfp4._score_term = FORMS[form]
    (nvfp4.SCORE_BLOCK_M, nvfp4.SCORE_BLOCK_N, nvfp4.SCORE_TILES, nvfp4.SCORE_WARPS,
     nvfp4.SCORE_STAGES) = tile


def wan22_operands():
    import types

    bh, n, d = WAN22
    q_blocks = -(-n // 128)
    g = torch.Generator(device="cuda").manual_seed(0)
    bias_q = torch.randn(bh, q_blocks, d, device="cuda", generator=g) + 4
    k = (torch.randn(bh, n, d, device="cuda", generator=g) + 8).bfloat16()
    k_mean = k.double().mean(1).float()
    return types.SimpleNamespace(bias_q=bias_q, k_input=k, k_mean=k_mean, n=n), q_blocks * 128


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", default="1,2", help="warm-up,window")
    ap.add_argument("--check-only", action="store_true", help="the bound only (CPU: interpreter)")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.check_only:
        for form in FORMS:
            for tile in TILES[:1] if device == "cpu" else TILES:
                configure(form, tile)
                check_direct(device)
                print(f"{form:10s} {tile}: within the bound", flush=True)
        return 0
    if device != "cuda":
        print("error: needs a CUDA GPU (or --check-only under TRITON_INTERPRET=1)", file=sys.stderr)
        return 2
    from vcbench.timing.cupti import time_kernels

    warmup, window = (float(s) for s in args.seconds.split(","))
    ops, nk_pad = wan22_operands()
    rows = []
    for form in FORMS:
        for tile in TILES:
            configure(form, tile)
            try:
                check_direct("cuda")
                times = time_kernels(lambda: nvfp4.score_term(ops, nk_pad), warmup, window)
                rows.append((form, tile, f"{times.per_call_ms():.2f} ms"))
            except Exception as e:  # a tile past the shared memory: say so, go on
                rows.append((form, tile, f"failed: {str(e).splitlines()[-1][:80]}"))
            print(*rows[-1], flush=True)
    print("\nform        (blocks, keys, tiles, warps, stages)  ms a call (Wan2.2 shape)")
    for form, tile, ms in rows:
        print(f"{form:11s} {str(tile):38s} {ms}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
