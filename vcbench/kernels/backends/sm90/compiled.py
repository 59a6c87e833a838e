"""The compiled VC-Attention kernel for Hopper (csrc/): build, load, run.

Built on a machine with nvcc and a CUDA torch by `make kernels` (= `python -m
vcbench.kernels.backends.sm90.compiled build`) into a cache folder, one subfolder per hash of the sources,
with torch.utils.cpp_extension (`-gencode=arch=compute_90a,code=sm_90a`: wgmma and setmaxnreg
need the `a` target). Importing this module never compiles anything and never needs nvcc:
`load()` only imports a build that matches the current sources, and `status()` says in one
line why there is none (not built, built from other sources, no CUDA, not Hopper).

It runs the prepared operands of `backends.triton.operands.prepare_gpu` (the same `GpuOperands`
the Triton kernel reads) for plans with INT8 or E4M3 Q/K (Q per 16 or 128 rows, K per 128
keys), E4M3 V per channel or per KV tile, P by ExpCast-FP8 or exp2-then-E4M3, optional
V-Smooth, head dim 128, in the combinations INSTANCES lists: `vc-8bit` (with and without
V-Smooth), `vc-8bit-vsmooth`, `sage2-8bit`, `vc-8bit-fp8qk` and `fp8-fa4`. One schedule for
every plan: three consumer warpgroups that each run QK, softmax and PV in order, a producer
warpgroup feeding them by TMA (csrc/, one file per phase; mainloop.cuh is the kernel).

Its NVFP4 instances (NVFP4_INSTANCES: sage3-4bit, vc-4bit with and without V-Smooth,
attnqat-tf; csrc/nvfp4_*, `run_nvfp4`) run `backends.triton.nvfp4.prepare`'s operands in the
kernel's key order, V-Smooth's mean steps and Q smoothing's score term: NVFP4 on FP16 wgmma, a
fidelity kernel like the Triton one it goes ahead of.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import math
import os
import shutil
import sys
import time
from functools import lru_cache
from pathlib import Path

CSRC = Path(__file__).with_name("csrc")
# What nvcc compiles (the kernel and its host side; the torch binding) and every header they
# include, relative to CSRC: the build's inputs, all of them in the source hash.
SOURCES = ("launch.cu", "nvfp4_launch.cu", "binding.cpp")
HEADERS = ("forward.cuh", "traits.cuh", "pipeline.cuh", "mma.cuh",
           "wgmma.cuh", "softmax.cuh", "vsmooth.cuh", "epilogue.cuh",
           "mainloop.cuh", "instances.cuh", "tensor_maps.cuh", "nvfp4_traits.cuh",
           "nvfp4_softmax.cuh", "nvfp4_mainloop.cuh", "nvfp4_instances.cuh")
MEAN_BATCH = 16  # tiles per V-Smooth mean product (forward.cuh's MEAN_BATCH)
IMPLEMENTATION = "vcbench-sm90"
# The compiled instances, (ExpCast, V-Smooth, FP8 scores, V scale per tile), the one list of
# them: csrc/gen_instances.py writes launch.cu's table (csrc/instances.cuh) from it. INT8
# scores with each P encoding and V-Smooth or not; FP8 scores for vc-8bit-fp8qk (ExpCast,
# V-Smooth or not: its schedule's plain steps run without) and fp8-fa4 (exp2, a V scale per
# tile). A V-Smooth method whose plain plan had no instance would run its plain steps on
# another backend.
INSTANCES = ((True, True, False, False), (False, True, False, False), (True, False, False, False),
             (False, False, False, False), (True, True, True, False), (True, False, True, False),
             (False, False, True, True))
# The NVFP4 instances, (two-level P, V-Smooth, Q smoothing's score bias): vc-4bit (with V-Smooth,
# and without for its schedule's plain steps), sage3-4bit and attnqat-tf.
NVFP4_INSTANCES = ((True, True, True), (True, False, True), (False, False, False))
NVFP4_IMPLEMENTATION = "vcbench-sm90 (nvfp4 on fp16 wgmma)"
# Q smoothing's score term is one FP32 per (query block, key): at most this many bytes of it a
# call (2^33: the Wan2.2 shape's 40 heads x 75600 tokens need 7.2 GB); past it, the Triton kernel
BIAS_BYTES_LIMIT = 2**33
ARCH_FLAG = "-gencode=arch=compute_90a,code=sm_90a"


@lru_cache(maxsize=1)
def source_hash() -> str:
    """12 hex digits over every source and header: a build is current only for this hash."""
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode())
        h.update((CSRC / name).read_bytes())
    return h.hexdigest()[:12]


def cache_dir() -> Path:
    env = os.environ.get("VCBENCH_KERNEL_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "vcbench" / "kernels"


def module_name(digest: str | None = None) -> str:
    return f"_vc_sm90_{digest or source_hash()}"


def build_dir(digest: str | None = None) -> Path:
    return cache_dir() / module_name(digest)


def library_path(digest: str | None = None) -> Path:
    """Where torch.utils.cpp_extension.load leaves the library: <build dir>/<module>.so."""
    return build_dir(digest) / f"{module_name(digest)}.so"


def build_flags(digest: str | None = None) -> dict:
    """The compiler flags `build` hands to torch.utils.cpp_extension.load. An explicit
    -gencode stops torch from adding its own arch flags (a plain sm_90 pass would reject
    wgmma); no -std: torch picks the one its headers need (the .cu does not include torch)."""
    define = f"-DVC_SOURCE_HASH_ID=h{digest or source_hash()}"  # no quotes: ninja runs sh
    return {
        "extra_cuda_cflags": [ARCH_FLAG, "-O3", "-Xptxas=-v", "-lineinfo", define],
        "extra_cflags": ["-O3", define],
    }


def stale_builds() -> list[str]:
    """Hashes of builds in the cache that are not the current sources'."""
    if not cache_dir().is_dir():
        return []
    current = module_name()
    return sorted(p.name.removeprefix("_vc_sm90_") for p in cache_dir().glob("_vc_sm90_*")
                  if p.name != current and (p / f"{p.name}.so").exists())


def missing_reason() -> str | None:
    """Why there is no current build (one line), or None if there is one."""
    if library_path().exists():
        return None
    stale = stale_builds()
    if stale:
        return (f"compiled kernel is stale: {cache_dir()} holds builds of other sources "
                f"({', '.join(stale)}), none of {source_hash()}; run `make kernels`")
    return f"compiled kernel not built (no {library_path()}); run `make kernels`"


def device_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return "compiled kernel needs a CUDA GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return (f"compiled kernel is built for sm_90a (Hopper); this GPU is "
                f"sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
    return None


@lru_cache(maxsize=1)
def status() -> str | None:
    """None when the compiled kernel can run here, else one line saying why not (cached: a
    build in this process clears it)."""
    return device_reason() or missing_reason()


@lru_cache(maxsize=1)
def load():
    """The extension module of the current sources, or None (see `status`). Never builds."""
    if status():
        return None
    import torch  # noqa: F401  (the library links against torch's shared libraries)

    spec = importlib.util.spec_from_file_location(module_name(), library_path())
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(verbose: bool = False, force: bool = False):
    """Compile the extension for the current sources (needs nvcc and a CUDA torch); returns
    the module. Seconds spent are in `build.seconds`."""
    import torch.utils.cpp_extension as cpp

    if shutil.which("nvcc") is None and not os.environ.get("CUDA_HOME"):
        raise RuntimeError("building the compiled kernel needs nvcc (CUDA toolkit) on PATH")
    digest = source_hash()
    out = build_dir(digest)
    if force and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    module = cpp.load(name=module_name(digest), sources=[str(CSRC / s) for s in SOURCES],
                      build_directory=str(out), verbose=verbose, **build_flags(digest))
    build.seconds = time.perf_counter() - start
    status.cache_clear()
    load.cache_clear()
    return module


build.seconds = None


def unsupported_reason(plan, head_dim: int = 128) -> str | None:
    """Why the compiled kernel cannot run this plan, or None if it can. It runs the 8-bit
    Triton kernel's operands (`backends.triton.operands`), so a plan must first be one that
    kernel takes; the sm90 backend checks that, this the kernel's own limits: INT8 or E4M3
    Q/K, Q scales per 16..128 rows, V per channel or per KV tile, head dim 128, and a compiled
    instance for the plan's combination."""
    from vcbench.kernels.spec.formats import E4M3, INT8
    from vcbench.kernels.spec.granularity import PerBlock, PerChannel
    from vcbench.kernels.spec.probability import ExpCast

    if plan.q.fmt not in (INT8, E4M3) or plan.k.fmt is not plan.q.fmt:
        return "the compiled kernel takes INT8 or E4M3 Q/K, both the same"
    v_tile = isinstance(plan.v.granularity, PerBlock) and plan.v.granularity.rows == 128
    if plan.v.fmt is not E4M3 or not (v_tile or isinstance(plan.v.granularity, PerChannel)):
        return "the compiled kernel takes E4M3 V, per channel or per 128-key tile"
    rows = plan.q.granularity.rows if isinstance(plan.q.granularity, PerBlock) else None
    if rows is None or rows < 16 or 128 % rows:
        return "the compiled kernel takes Q scales per 16..128 rows"
    if head_dim != 128:
        return "the compiled kernel takes head dim 128"
    if not isinstance(plan.p, ExpCast) and float(plan.p.scale) <= 0:
        return "P scale must be positive"
    combination = (isinstance(plan.p, ExpCast), plan.vsmooth is not None, plan.q.fmt is E4M3,
                   v_tile)
    if combination not in INSTANCES:
        return f"no compiled instance for {instance_name(combination)}"
    return None


def instance_name(combination: tuple[bool, bool, bool, bool]) -> str:
    """An INSTANCES entry in words: "ExpCast, V-Smooth, INT8, V per channel"."""
    expcast, vsmooth, qk_fp8, v_per_tile = combination
    return ", ".join(("ExpCast" if expcast else "exp2", "V-Smooth" if vsmooth else "no V-Smooth",
                      "FP8" if qk_fp8 else "INT8", "V per tile" if v_per_tile else "V per channel"))


def arguments(ops, plan) -> dict:
    """The kernel's scalar arguments for a plan (the compiled twin of
    backends.triton.operands.kernel_switches)."""
    from vcbench.kernels.spec.granularity import PerBlock
    from vcbench.kernels.spec.probability import ExpCast

    expcast = isinstance(plan.p, ExpCast)
    return dict(n=ops.n, q_rows=plan.q.granularity.rows, expcast=expcast,
                expcast_bias=120.0 + (plan.p.beta if expcast else 0.0),
                log2_p_scale=0.0 if expcast else math.log2(float(plan.p.scale)),
                v_per_tile=isinstance(plan.v.granularity, PerBlock))


def blocked_means(v_mean):
    """V-Smooth's block means (B, H, tiles, 128) fp16 as the kernel reads them: tiles
    zero-padded to whole batches of MEAN_BATCH, and each batch's 16 x 128 block laid out as
    wgmma's K-major B operand without swizzle, 8 x 8 core matrices: element (tile k, channel n)
    of a batch at (n // 8) * 128 + (k // 8) * 64 + (n % 8) * 8 + k % 8 (in elements). Shape
    (B, H, padded tiles, 128)."""
    import torch

    b, h, t, d = v_mean.shape
    padded = -(-t // MEAN_BATCH) * MEAN_BATCH
    x = torch.zeros(b, h, padded, d, dtype=v_mean.dtype, device=v_mean.device)
    x[:, :, :t] = v_mean
    x = x.view(b, h, padded // MEAN_BATCH, 2, 8, d // 8, 8)  # batch, k // 8, k % 8, n // 8, n % 8
    return x.permute(0, 1, 2, 5, 3, 6, 4).contiguous().view(b, h, padded, d)


def run(ops, plan, out):
    """Attention of prepared operands into `out` (B, H, N, D), bf16/fp16, any strides with a
    unit last stride. Raises RuntimeError with `status()` when the kernel cannot run here."""
    module = load()
    if module is None:
        raise RuntimeError(status())
    reason = unsupported_reason(plan, ops.q.shape[-1])
    if reason:
        raise RuntimeError(reason)
    means = ops.v_mean
    if means is not None:
        # the sm90 backend's preprocessing blocks them; operands prepared for the Triton
        # kernel get a small copy per call
        means = ops.v_mean_blocked if ops.v_mean_blocked is not None else blocked_means(means)
    return module.forward(ops.q, ops.q_scale, ops.k, ops.k_scale, ops.v_t, ops.v_scale,
                          means, out, **arguments(ops, plan))


def nvfp4_instance_name(combination: tuple[bool, bool, bool]) -> str:
    """An NVFP4_INSTANCES entry in words: "two-level P, V-Smooth, Q bias"."""
    two_level, vsmooth, bias = combination
    return ", ".join(("two-level P" if two_level else "P microscaled directly",
                      "V-Smooth" if vsmooth else "no V-Smooth",
                      "Q smoothing bias" if bias else "no Q smoothing"))


def nvfp4_combination(plan) -> tuple[bool, bool, bool]:
    return (plan.p.two_level, plan.vsmooth is not None, plan.smooth_q)


def nvfp4_unsupported_reason(plan, shape=None) -> str | None:
    """Why the NVFP4 instances cannot run this plan (on (B, H, N, D) inputs of `shape`), or
    None. They run `triton.nvfp4.prepare`'s operands, so the plan must first be one the NVFP4
    Triton kernel takes (the caller checks); here the kernel's own limits."""
    if plan.block_m != 128 or plan.block_n != 128:
        return "the compiled NVFP4 kernel takes 128-row query and key blocks"
    combination = nvfp4_combination(plan)
    if combination not in NVFP4_INSTANCES:
        return f"no compiled NVFP4 instance for {nvfp4_instance_name(combination)}"
    if shape is not None:
        b, h, n, d = shape
        if d != 128:
            return "the compiled kernel takes head dim 128"
        blocks = -(-n // 128)
        if plan.smooth_q and b * h * blocks * blocks * 128 * 4 > BIAS_BYTES_LIMIT:
            return (f"Q smoothing's score term would take {b * h * blocks * blocks * 512 / 1e9:.1f}"
                    f" GB (the compiled kernel's limit is {BIAS_BYTES_LIMIT / 1e9:.1f})")
    return None


def mean_steps(v_mean):
    """V-Smooth's block means (B*H, tiles, 128) fp16 as the NVFP4 kernel's mean step reads
    them: per tile the 16 x 128 B operand of one more PV k-step, K-major without swizzle (8 x 8
    core matrices: element (k, n) at (n // 8) * 128 + (k // 8) * 64 + (n % 8) * 8 + k % 8), rows
    k = 0 and 1 the mean (times the row sums' head and tail), the rest zero. (B*H, tiles, 2048)."""
    import torch

    bh, t, d = v_mean.shape
    x = torch.zeros(bh, t, d // 8, 2, 8, 8, dtype=torch.float16, device=v_mean.device)
    mu = v_mean.to(torch.float16).view(bh, t, d // 8, 8)
    x[:, :, :, 0, :, 0] = mu
    x[:, :, :, 0, :, 1] = mu
    return x.view(bh, t, 16 * d)


def run_nvfp4(ops, plan, out):
    """NVFP4 attention of `triton.nvfp4.prepare`'s operands (`key_order="sm90"`, with
    `mean_steps` / `score_bias` where the plan has them: `prepare_nvfp4` adds both) into `out`
    (B, H, N, D)."""
    module = load()
    if module is None:
        raise RuntimeError(status())
    reason = nvfp4_unsupported_reason(plan, tuple(out.shape))
    if reason:
        raise RuntimeError(reason)
    if ops.key_order != "sm90":
        raise RuntimeError("the NVFP4 kernel reads operands prepared with key_order='sm90'")
    return module.forward_nvfp4(ops.q, ops.k, ops.v, ops.q_outer, ops.k_outer, ops.v_outer,
                                getattr(ops, "score_bias", None), getattr(ops, "mean_steps", None),
                                out, ops.n, plan.p.two_level)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vcbench.kernels.backends.sm90.compiled",
                                 description="build or inspect the compiled sm_90a kernel")
    ap.add_argument("command", choices=("build", "status", "flags"))
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--force", action="store_true", help="rebuild even if a build exists")
    args = ap.parse_args(argv)
    if args.command == "flags":
        print(module_name(), build_flags())
        return 0
    if args.command == "status":
        reason = status()
        print(reason or f"ready: {library_path()}")
        return 0 if reason is None else 1
    module = build(verbose=args.verbose, force=args.force)
    print(f"built {library_path()} in {build.seconds:.1f} s")
    try:
        print(module.describe(), end="")
    except RuntimeError as e:  # no GPU on the build machine: attributes need a device
        print(f"(no instance attributes: {e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
