"""The compiled sm_90a kernel on a CPU machine: build bookkeeping, the fallback message, and
the index algebra its CUDA code relies on (the kernel itself runs in test_gpu_compiled.py).

The layout tests mirror, in Python, the index maps written in csrc/sm90/: if one side changes,
the other must, and these tests say whether they still fit together.
"""

import dataclasses
import math
import re
import shutil
import warnings

import numpy as np
import pytest

from vcbench.errors import UserError
from vcbench.kernels import METHODS, backends, get_method
from vcbench.kernels.backends.sm90 import compiled
from vcbench.kernels.backends.triton.operands import kernel_switches
from vcbench.kernels.spec.vsmooth import PLAIN_STEP_OPTIONS

# ---- build bookkeeping -------------------------------------------------------------------


def test_import_needs_no_nvcc_and_status_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("VCBENCH_KERNEL_CACHE", str(tmp_path))
    compiled.status.cache_clear()
    reason = compiled.missing_reason()
    assert reason is not None and "\n" not in reason
    assert "make kernels" in reason and "not built" in reason
    assert compiled.load.__wrapped__  # load is cached, never builds
    compiled.status.cache_clear()


def test_a_build_of_other_sources_is_called_stale(monkeypatch, tmp_path):
    monkeypatch.setenv("VCBENCH_KERNEL_CACHE", str(tmp_path))
    old = tmp_path / "_vc_sm90_0123456789ab"
    old.mkdir()
    (old / "_vc_sm90_0123456789ab.so").write_bytes(b"")
    reason = compiled.missing_reason()
    assert "stale" in reason and "0123456789ab" in reason and "make kernels" in reason
    assert "\n" not in reason
    current = compiled.build_dir()
    current.mkdir()
    compiled.library_path().write_bytes(b"")
    assert compiled.missing_reason() is None


def test_the_sources_and_headers_are_every_file_a_build_reads():
    on_disk = {p.relative_to(compiled.CSRC).as_posix() for p in compiled.CSRC.rglob("*")
               if p.suffix in (".cu", ".cuh", ".cpp", ".h", ".hpp")}
    assert on_disk == set(compiled.SOURCES + compiled.HEADERS)
    assert len(compiled.SOURCES + compiled.HEADERS) == len(on_disk)  # no name twice


def test_the_wgmma_header_is_its_generator_s_output():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen_wgmma", compiled.CSRC / "gen_wgmma.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert (compiled.CSRC / "wgmma.cuh").read_text() == gen.text()


def test_the_instance_table_is_written_from_the_python_instances():
    # compiled.INSTANCES is the one list: launch.cu's table is the header written from it
    from vcbench.kernels.backends.sm90.csrc import gen_instances

    assert (compiled.CSRC / "instances.cuh").read_text() == gen_instances.text()
    launch = (compiled.CSRC / "launch.cu").read_text()
    assert 'constexpr Instance INSTANCES[] = {\n#include "instances.cuh"\n};' in launch


def test_the_source_hash_covers_every_source(monkeypatch, tmp_path):
    for name in compiled.SOURCES + compiled.HEADERS:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((compiled.CSRC / name).read_bytes())
    monkeypatch.setattr(compiled, "CSRC", tmp_path)
    compiled.source_hash.cache_clear()
    try:
        base = compiled.source_hash()
        for name in compiled.SOURCES + compiled.HEADERS:
            text = (tmp_path / name).read_bytes()
            (tmp_path / name).write_bytes(text + b"\n")
            compiled.source_hash.cache_clear()
            assert compiled.source_hash() != base, name
            (tmp_path / name).write_bytes(text)
        compiled.source_hash.cache_clear()
        assert compiled.source_hash() == base
    finally:
        compiled.source_hash.cache_clear()


def test_build_flags_name_the_hopper_a_target_and_leave_std_to_torch():
    flags = compiled.build_flags("abc")
    cuda = flags["extra_cuda_cflags"]
    assert "-gencode=arch=compute_90a,code=sm_90a" in cuda
    assert not any(f.startswith("-std") for f in cuda + flags["extra_cflags"])
    # torch adds its own arch flags unless one names an arch: ours must, or sm_90 rejects wgmma
    assert any("arch" in f for f in cuda)
    assert "-DVC_SOURCE_HASH_ID=habc" in cuda and '"' not in " ".join(cuda)  # ninja runs sh


def test_cli_status_says_why_in_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("VCBENCH_KERNEL_CACHE", str(tmp_path))
    compiled.status.cache_clear()
    try:
        assert compiled.main(["status"]) == 1
    finally:
        compiled.status.cache_clear()
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1


# ---- which plans, and the fallback ---------------------------------------------------------


@pytest.mark.parametrize("method, supported", [("vc-8bit", True), ("vc-8bit-vsmooth", True),
                                               ("sage2-8bit", True), ("fp8-fa4", True),
                                               ("vc-8bit-fp8qk", True), ("vc-4bit", False),
                                               ("bf16", False)])
def test_supported_plans(method, supported):
    assert (compiled.unsupported_reason(get_method(method).plan()) is None) == supported


def test_fp8_scores_run_only_in_the_combinations_compiled():
    # FP8 scores exist for vc-8bit-fp8qk (ExpCast, V-Smooth or not) and fp8-fa4 (exp2, a V
    # scale per tile); other combinations say which instance is missing
    assert compiled.unsupported_reason(get_method("fp8-fa4").plan({"hadamard_qk": True})) is None
    per_channel_v = dataclasses.replace(get_method("fp8-fa4").plan(), v=get_method("vc-8bit").plan().v)
    reason = compiled.unsupported_reason(per_channel_v)
    assert reason == "no compiled instance for exp2, no V-Smooth, FP8, V per channel"
    # every instance listed is a combination some registered plan needs, and each is distinct
    assert len(set(compiled.INSTANCES)) == len(compiled.INSTANCES) == 7


@pytest.mark.parametrize("method", [m for m in METHODS.builtin_names() if get_method(m).uses_vsmooth])
def test_a_v_smooth_methods_plain_steps_run_on_the_backend_of_its_grouping_steps(method):
    # A schedule's plain steps call the method without V-Smooth, another plan; a backend that
    # took the grouping steps but not those would hand them to the next backend unnoticed.
    plain = get_method(method).plan(PLAIN_STEP_OPTIONS)
    assert plain.vsmooth is None
    takes = [b for b in backends.BACKENDS.values() if b.supports(get_method(method).plan(), None) is None]
    assert takes, f"no backend takes {method}"
    assert {b.name: b.supports(plain, None) for b in takes} == dict.fromkeys(b.name for b in takes)


def test_q_per_block_and_options_without_v_smooth_are_supported():
    m = get_method("vc-8bit")
    assert compiled.unsupported_reason(m.build(m.resolve({"q_granularity": "block"}))) is None
    assert compiled.unsupported_reason(m.build(m.resolve({"vsmooth": False}))) is None
    assert compiled.unsupported_reason(m.plan(), head_dim=64) is not None


def test_expcast_beta_past_the_kernels_implicit_clip_is_refused():
    # the kernels reach the emulation's clip at code 120 only through t <= 120 + beta
    m = get_method("vc-8bit")
    for beta, ok in ((-0.35, True), (0.25, True), (0.3, False), (0.6, False)):
        plan = m.build(m.resolve({"expcast_beta": beta}))
        for reason in (backends.TRITON.supports(plan, None), backends.SM90.supports(plan, None)):
            assert (reason is None) == ok
            assert ok or "beta" in reason


def test_kernel_arguments_match_the_triton_switches():
    class Ops:
        n = 1000

    for name in ("vc-8bit", "vc-8bit-vsmooth", "sage2-8bit", "fp8-fa4", "vc-8bit-fp8qk"):
        plan = get_method(name).plan()
        args = compiled.arguments(Ops, plan)
        sw = kernel_switches(plan)
        assert args["expcast"] == sw["expcast"] and args["q_rows"] == sw["q_rows"]
        assert args["v_per_tile"] == sw["v_per_tile"] == (name == "fp8-fa4")
        assert args["expcast_bias"] == pytest.approx(sw["expcast_bias"])
        if not sw["expcast"]:
            assert args["log2_p_scale"] == pytest.approx(math.log2(sw["p_scale"]))
    assert compiled.arguments(Ops, get_method("vc-8bit").plan())["expcast_bias"] == pytest.approx(119.65)


def on_sm90(plan, head_dim=128):
    """Whether the backend list picks the compiled kernel for `plan` on (1, 1, 256, D) inputs."""
    return backends.select(plan, (1, 1, 256, head_dim)) is backends.SM90


def test_by_default_the_compiled_kernel_runs_only_when_built_and_silently_otherwise(monkeypatch):
    monkeypatch.delenv("VCBENCH_KERNEL", raising=False)
    assert backends.preference() is None
    monkeypatch.setattr(compiled, "status", lambda: "compiled kernel not built; run `make kernels`")
    backends._fallback_note.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not on_sm90(get_method("vc-8bit").plan())
    assert caught == []
    monkeypatch.setattr(compiled, "status", lambda: None)
    assert on_sm90(get_method("vc-8bit").plan())
    assert not on_sm90(get_method("vc-8bit").plan(), head_dim=64)  # Triton takes D=64
    # preferring the Triton kernel keeps the compiled one from the plans both take (the
    # Triton kernel runs wherever the compiled one can: it needs Triton's preprocessing)
    monkeypatch.setattr("vcbench.kernels.backends.triton.triton_ready", lambda: True)
    monkeypatch.setenv("VCBENCH_KERNEL", "triton")
    assert backends.preference() is backends.TRITON
    assert backends.select(get_method("vc-8bit").plan(), (1, 1, 256, 128)) is backends.TRITON


def test_sm90_without_a_build_falls_back_with_one_line(monkeypatch):
    monkeypatch.setenv("VCBENCH_KERNEL", "sm90")
    monkeypatch.setattr(compiled, "status", lambda: "compiled kernel not built; run `make kernels`")
    backends._fallback_note.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert not on_sm90(get_method("vc-8bit").plan())
        assert not on_sm90(get_method("vc-8bit").plan())
    notes = [str(w.message) for w in caught]
    assert len(notes) == 1 and "make kernels" in notes[0] and "Triton" in notes[0]
    assert "\n" not in notes[0]
    assert not on_sm90(get_method("vc-4bit").plan())  # not its plan: no note needed
    monkeypatch.setattr(compiled, "status", lambda: None)
    assert on_sm90(get_method("vc-8bit").plan())


def test_a_bad_kernel_choice_is_a_user_error(monkeypatch):
    monkeypatch.setenv("VCBENCH_KERNEL", "cutlass")
    with pytest.raises(UserError, match="VCBENCH_KERNEL must be one of auto, fa4, .*sm90, sm90-nvfp4, triton"):
        backends.preference()
    with pytest.raises(UserError, match="VCBENCH_KERNEL"):
        backends.select(get_method("vc-8bit").plan())


def test_run_without_a_build_raises_the_status_line(monkeypatch):
    monkeypatch.setattr(compiled, "load", lambda: None)
    monkeypatch.setattr(compiled, "status", lambda: "compiled kernel needs a CUDA GPU")
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        compiled.run(None, get_method("vc-8bit").plan(), None)


# ---- the index algebra of the CUDA code ----------------------------------------------------
# Thread t of a consumer warpgroup: warp w = t // 32, lane, g = lane // 4, q = lane % 4.


def smem_key_of_row():
    """K tile rows in shared memory after the two 4-D TMA boxes: map h (starting two keys in)
    over dims (channel, b in 2, q in 4, G in 8) with byte strides (1, 128, 512, 2048) writes
    row 64h + 8G + 2q + b with key 16G + 4q + 2h + b."""
    key = np.empty(128, int)
    for h in range(2):
        for G in range(8):
            for q in range(4):
                for b in range(2):
                    global_byte = 2 * 128 * h + G * 2048 + q * 512 + b * 128
                    key[64 * h + 8 * G + 2 * q + b] = global_byte // 128
    return key


def accumulator(i, w, lane):
    """(row, column) of register i of a wgmma m64nN f32/s32 accumulator (CUTLASS CLayout_64xN)."""
    return 16 * w + lane // 4 + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2


def a_fragment(r, byte, w, lane):
    """(row, k) of byte `byte` of register r of an 8-bit wgmma A fragment, m64 k32
    (CUTLASS ALayout_64x32)."""
    return 16 * w + lane // 4 + 8 * (r % 2), 4 * (lane % 4) + byte + 16 * (r // 2)


def key_of(c, q, b):  # softmax.cuh's key_of
    return 16 * (c & 7) + 4 * q + 2 * (c >> 3) + b


def test_k_rows_are_a_permutation_and_key_of_reads_it():
    key = smem_key_of_row()
    assert sorted(key) == list(range(128))
    for c in range(16):
        for q in range(4):
            for b in range(2):
                assert key_of(c, q, b) == key[8 * c + 2 * q + b]


def test_p_reaches_the_pv_a_fragment_in_natural_key_order_without_shuffles():
    """softmax_tile + pack_p: each thread packs its own accumulator values; the bytes the A
    fragment then presents are P in natural key order, the order of V's rows."""
    key = smem_key_of_row()
    rng = np.random.default_rng(0)
    p_nat = rng.integers(0, 121, size=(64, 128))  # P codes, rows x keys (natural order)
    for w in range(4):
        for lane in range(32):
            q = lane % 4
            s = {}
            for i in range(64):  # the S accumulator holds column n, i.e. key key[n]
                row, n = accumulator(i, w, lane)
                s[i] = int(p_nat[row, key[n]])
            pair = {4 * c + 2 * h: s[4 * c + 2 * h] | s[4 * c + 2 * h + 1] << 8
                    for c in range(16) for h in range(2)}  # prmt(u0, u1, 0x0040)
            for kk in range(4):
                for half in range(2):
                    for h in range(2):
                        ca = 2 * kk + half
                        lo, hi = pair[4 * ca + 2 * h], pair[4 * (ca + 8) + 2 * h]
                        reg = lo | hi << 16  # prmt(lo, hi, 0x5410)
                        r = 2 * half + h
                        for byte in range(4):
                            row, k = a_fragment(r, byte, w, lane)
                            assert (reg >> 8 * byte) & 0xFF == p_nat[row, 32 * kk + k], (w, q, kk)


def test_the_row_sum_column_is_read_by_the_quad_leader():
    """ExpCast's ones column is accumulator column 128 (PV N = 136): registers 64 and 66 of
    lanes with q == 0 hold rows r and r + 8; other lanes hold the zero columns 130..135."""
    for lane in range(32):
        for i, h in ((64, 0), (66, 1)):
            row, col = accumulator(i, 0, lane)
            assert row == lane // 4 + 8 * h
            assert (col == 128) == (lane % 4 == 0)


def test_blocked_means_are_the_k_major_core_matrix_layout_the_mean_descriptor_names():
    """The mean product's wgmma reads a batch's means (16 tiles x 128 channels, fp16) through a
    no-swizzle K-major descriptor: 8 rows x 16 bytes core matrices, LBO bytes apart along k
    (the tile) and SBO bytes apart along n (the channel). Element (k, n) is then at byte
    (n // 8) SBO + (k // 8) LBO + (n % 8) 16 + (k % 8) 2: walk that byte address for every
    element and find it where blocked_means put it; padding tiles are zero."""
    import torch

    src = (compiled.CSRC / "mma.cuh").read_text()
    desc = src[src.index("uint64_t desc_means("):]
    desc = desc[:desc.index("}")]
    lbo, sbo = (int(x) for x in re.findall(r"static_cast<uint64_t>\((\d+) >> 4\)", desc))
    tiles = 21  # one full batch and a partial one
    v_mean = torch.arange(2 * 3 * tiles * 128, dtype=torch.float32).view(2, 3, tiles, 128).half()
    blocked = compiled.blocked_means(v_mean)
    assert blocked.shape == (2, 3, 32, 128)
    flat = blocked.view(2, 3, 2, 16 * 128)  # per batch, in element units
    for b, h, batch in ((0, 0, 0), (1, 2, 1)):
        for k in range(16):
            for n in range(128):
                byte = (n // 8) * sbo + (k // 8) * lbo + (n % 8) * 16 + (k % 8) * 2
                tile = 16 * batch + k
                want = v_mean[b, h, tile, n] if tile < tiles else 0.0
                assert flat[b, h, batch, byte // 2] == want, (k, n)
    header = (compiled.CSRC / "forward.cuh").read_text()
    assert compiled.MEAN_BATCH == int(re.search(r"MEAN_BATCH = (\d+)", header).group(1))


def test_mean_weight_stores_land_where_the_mean_descriptor_reads_a():
    """Each thread stores its four f16x2 words of mean_weights_rows' fragment
    (word 2hk + h: row 16 warp + g + 8h, tiles 8hk + 2q and + 1, the lower tile in the low half)
    at the byte offset store_weights computes; the wgmma reads A through desc_means (K-major, no
    swizzle), element (row m, tile k) at (m // 8) SBO + (k // 8) LBO + (m % 8) 16 + (k % 8) 2.
    The offset expression is read from vsmooth.cuh; every element of the 64 x 16 tile is written
    exactly once, where the descriptor looks for it."""
    src = (compiled.CSRC / "vsmooth.cuh").read_text()
    body = src[src.index("void store_weights("):]
    body = body[:body.index("\n}")]
    offset = re.search(r"wtile \+ (.+?)\) =", body.replace("\n", " ")).group(1)
    src = (compiled.CSRC / "mma.cuh").read_text()
    desc = src[src.index("uint64_t desc_means("):]
    desc = desc[:desc.index("}")]
    lbo, sbo = (int(x) for x in re.findall(r"static_cast<uint64_t>\((\d+) >> 4\)", desc))
    seen = {}
    for warp in range(4):
        for lane in range(32):
            q, g = lane % 4, lane // 4
            for hk in range(2):
                for h in range(2):
                    base = eval(offset, {}, dict(warp=warp, h=h, hk=hk, g=g, q=q))  # noqa: S307
                    for e in range(2):  # the word's low half first
                        m, k = 16 * warp + g + 8 * h, 8 * hk + 2 * q + e
                        assert base + 2 * e == (m // 8) * sbo + (k // 8) * lbo + (m % 8) * 16 + (k % 8) * 2
                        seen[(m, k)] = seen.get((m, k), 0) + 1
    assert len(seen) == 64 * 16 and set(seen.values()) == {1}


# ---- the NVFP4 instances ----------------------------------------------------------------


def test_the_nvfp4_instance_table_is_written_from_the_python_instances():
    from vcbench.kernels.backends.sm90.csrc import gen_instances

    assert (compiled.CSRC / "nvfp4_instances.cuh").read_text() == gen_instances.nvfp4_text()
    launch = (compiled.CSRC / "nvfp4_launch.cu").read_text()
    assert 'constexpr Instance INSTANCES[] = {\n#include "nvfp4_instances.cuh"\n};' in launch
    assert len(set(compiled.NVFP4_INSTANCES)) == len(compiled.NVFP4_INSTANCES)


@pytest.mark.parametrize("method, opts, combination", [
    ("vc-4bit", {}, (True, True, True)), ("vc-4bit", {"vsmooth": False}, (True, False, True)),
    ("vc-4bit", PLAIN_STEP_OPTIONS, (True, False, True)), ("sage3-4bit", {}, (True, False, True)),
    ("attnqat-tf", {}, (False, False, False))])
def test_each_4bit_method_and_its_plain_steps_have_an_nvfp4_instance(method, opts, combination):
    plan = get_method(method).plan(opts)
    assert compiled.nvfp4_combination(plan) == combination
    assert combination in compiled.NVFP4_INSTANCES
    assert backends.SM90_NVFP4.supports(plan, (1, 40, 75600, 128)) is None
    assert backends.SM90_NVFP4.fidelity_only  # NVFP4 on FP16 wgmma: never an FP4 speed claim


def test_the_nvfp4_instances_say_why_they_cannot_take_a_plan_or_shape():
    plan = get_method("vc-4bit").plan()
    assert "head dim 128" in backends.SM90_NVFP4.supports(plan, (1, 2, 1000, 64))
    assert "128-row" in backends.SM90_NVFP4.supports(get_method("vc-4bit").plan({"block_m": 64}))
    # Q smoothing's score term past the limit: one FP32 per (query block, key)
    reason = backends.SM90_NVFP4.supports(plan, (1, 40, 200000, 128))
    assert "GB" in reason and "\n" not in reason
    # without Q smoothing there is no such term, so no such limit
    attnqat = get_method("attnqat-tf").plan()
    assert backends.SM90_NVFP4.supports(attnqat, (1, 40, 200000, 128)) is None
    assert backends.SM90_NVFP4.supports(get_method("vc-8bit").plan()) is not None
    # Q smoothing's term starts the QK accumulator in unscaled units: no outer Q/K scales with it
    sage3 = get_method("sage3-4bit").plan()
    outer = {name: dataclasses.replace(getattr(sage3, name), granularity=dataclasses.replace(
        getattr(sage3, name).granularity, global_scale=True)) for name in ("q", "k")}
    assert "per-tensor" in backends.SM90_NVFP4.supports(dataclasses.replace(sage3, **outer))
    order = list(backends.BACKENDS.values())
    assert order.index(backends.SM90_NVFP4) < order.index(backends.NVFP4)


NVCC = shutil.which("nvcc")


@pytest.mark.skipif(NVCC is None, reason="needs nvcc (the CUDA toolkit)")
@pytest.mark.parametrize("source, kernel, count", [
    ("nvfp4_launch.cu", "nvfp4_attention_kernel", len(compiled.NVFP4_INSTANCES)),
    ("launch.cu", "vc_attention_kernel", len(compiled.INSTANCES))])
def test_the_instances_compile_for_sm90a_without_spills_or_local_memory(source, kernel, count,
                                                                         tmp_path):
    """ptxas's own account of each instance (the device code only: no torch, no GPU)."""
    import subprocess

    done = subprocess.run([NVCC, compiled.ARCH_FLAG, "-O3", "-Xptxas=-v", "-c",
                           str(compiled.CSRC / source), "-o", str(tmp_path / "k.o")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    entries = re.split(r"Compiling entry function '", done.stderr)[1:]
    assert len([e for e in entries if kernel in e.split("'")[0]]) == count
    for entry in entries:
        props = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes "
                          r"spill loads", entry)
        assert props and props.groups() == ("0", "0", "0"), entry[:300]
    # no "Potential Performance Loss" (C75xx): a wgmma serialized, or a register-starved stage
    assert "C75" not in done.stderr, done.stderr[done.stderr.index("C75") - 200:][:600]


def test_mean_steps_are_the_b_operand_the_mean_descriptor_reads():
    """The NVFP4 mean step: per tile a 16 x 128 fp16 B operand in the no-swizzle K-major layout
    desc_means names, rows k = 0 and 1 the tile's mean, the other 14 zero."""
    import torch

    src = (compiled.CSRC / "mma.cuh").read_text()
    desc = src[src.index("uint64_t desc_means("):]
    lbo, sbo = (int(x) for x in re.findall(r"static_cast<uint64_t>\((\d+) >> 4\)",
                                           desc[:desc.index("}")]))
    v_mean = torch.randn(3, 5, 128).half()
    steps = compiled.mean_steps(v_mean)
    assert steps.shape == (3, 5, 2048) and steps.dtype == torch.float16
    for bh, t in ((0, 0), (2, 4)):
        for k in range(16):
            for n in range(128):
                byte = (n // 8) * sbo + (k // 8) * lbo + (n % 8) * 16 + (k % 8) * 2
                want = v_mean[bh, t, n] if k < 2 else 0.0
                assert steps[bh, t, byte // 2] == want, (k, n)


def nvfp4_key_of(c, q, b):  # nvfp4_softmax.cuh's key_of
    return b + 2 * (c & 7) + 16 * q + 64 * (c >> 3)


def test_the_nvfp4_key_order_is_the_preprocessings_and_gives_each_thread_whole_groups():
    """The NVFP4 kernel reads K's and V's tiles as `key_order="sm90"` writes them: S column n
    (row n of the K tile) holds the key stored at row n, which is key_of's key for n = 8c + 2q
    + b; each thread's 32 scores of a row are two whole 16-key microscale groups, blocks c < 8
    one and c >= 8 the other (what lets the softmax take their amax without a shuffle)."""
    from vcbench.kernels.backends.triton.nvfp4 import sm90_rows

    rows = sm90_rows(256).numpy()
    assert sorted(rows) == list(range(256))
    for tile in (0, 128):
        for c in range(16):
            for q in range(4):
                for b in range(2):
                    assert rows[tile + nvfp4_key_of(c, q, b)] == tile + 8 * c + 2 * q + b
    for q in range(4):
        for u in range(2):
            keys = sorted(nvfp4_key_of(c, q, b) for c in range(8 * u, 8 * u + 8) for b in range(2))
            assert keys == list(range(64 * u + 16 * q, 64 * u + 16 * q + 16))
    src = (compiled.CSRC / "nvfp4_softmax.cuh").read_text()
    assert "return b + 2 * (c & 7) + 16 * q + 64 * (c >> 3);" in src
    groups = src[src.index("The 16-key groups"):]
    assert "__shfl" not in groups[:groups.index("\n}\n")]


def test_the_v_tile_as_tma_writes_it_is_the_n_major_operand_the_pv_descriptor_names():
    """V's 128 x 128 fp16 tile, two halves of 64 channels with rows of 128 bytes under the TMA's
    128-byte swizzle (16-byte chunk x of row r at chunk x ^ (r % 8)), read by the PV wgmma as the
    N-major canonical layout ((64, m), (8, k)) : ((1, LBO), (64, SBO)) with the same swizzle on
    the byte address: for every k-step, row and channel, the descriptor's byte is where the copy
    put V[16 kk + k][n]. LBO, SBO and the k-step's advance are read from the kernel's source."""
    mma = (compiled.CSRC / "mma.cuh").read_text()
    body = mma[mma.index("uint64_t desc_sw128_nmajor("):]
    body = body[:body.index("}")]
    sbo = int(re.search(r"static_cast<uint64_t>\((\d+) >> 4\) << 32", body).group(1))
    assert "chunk & 0x3FFFF) >> 4) << 16" in body and "(1) << 62" in body  # LBO; 128B swizzle
    loop = (compiled.CSRC / "nvfp4_mainloop.cuh").read_text()
    assert "desc_sw128_nmajor(s_v, T::HALF)" in loop
    step = int(re.search(r"dv \+ (\d+) \* kk", loop).group(1)) * 16  # 16-byte units
    half = 128 * 128  # T::HALF: a half's 128 rows of 128 bytes
    swizzle = lambda a: a ^ (((a >> 7) & 7) << 4)  # noqa: E731  (Swizzle<3, 4, 3> on bytes)
    for kk in range(8):
        for k in range(16):
            for n in range(128):
                r, x = 16 * kk + k, (n % 64) * 2
                copied = (n // 64) * half + r * 128 + (x ^ ((r % 8) << 4))
                read = kk * step + (n // 64) * half + (k // 8) * sbo + (k % 8) * 128 + x
                assert swizzle(read) == copied, (kk, k, n)


def _kernel_round_e2m1(y):
    """nvfp4_softmax.cuh's round_e2m1 in FP32 numpy: min(y, 6); m = 2^max(e, 0) from y's bits
    (floored at 1.0's, the exponent field kept); then FFMA(m, 1.5 * 2^22, mag) and FFMA(-m,
    1.5 * 2^22, t). The products are exact, so each FFMA is the FP32 add it stands for."""
    mag = np.minimum(y.astype(np.float32), np.float32(6))
    m = (np.maximum(mag.view(np.int32), 0x3F800000) & 0x7F800000).astype(np.int32).view(np.float32)
    magic = m * np.float32(6291456.0)  # exact: a power of two times 1.5 * 2^22
    return (mag + magic) - magic


def test_the_kernels_magic_number_is_the_one_built_from_the_exponent_bits():
    """The magic number of round_e2m1 (1.5 * 2^22 * m) against 1.5 * 2^(22 + max(e, 0)) built
    bit by bit (the Triton quantizers' form), for every FP32 exponent of [0, 6] and the
    subnormals."""
    bits = np.concatenate([np.arange(0, 1 << 23, 4099), (np.arange(0, 130) << 23) + 12345,
                           np.array([0x40C00000])]).astype(np.int32)  # ... and 6.0 itself
    mag = bits.view(np.float32)
    m = (np.maximum(bits, 0x3F800000) & 0x7F800000).astype(np.int32).view(np.float32)
    e = np.maximum(bits >> 23, 127)
    built = (((e + 22) << 23) + 0x400000).astype(np.int32).view(np.float32)
    assert (mag <= 6).all()
    np.testing.assert_array_equal(m * np.float32(6291456.0), built)
    # and these are the kernel's constants (the numpy above transcribes its arithmetic)
    src = (compiled.CSRC / "nvfp4_softmax.cuh").read_text()
    body = src[src.index("float round_e2m1(float y)"):][:400]
    assert "max(__float_as_int(mag), 0x3f800000) & 0x7f800000" in body
    assert body.count("6291456.f") == 2 and "fminf(y, 6.f)" in body


def test_the_kernels_e2m1_rounding_is_the_emulations_on_every_tie_and_between():
    import torch

    from vcbench.kernels.spec.formats import round_e2m1

    grid = np.arange(0, 8 * 256 + 1, dtype=np.float32) / 256  # every tie, and 255 points between
    near = np.nextafter(grid, np.float32(9)), np.nextafter(grid, np.float32(-1))
    for y in (grid, *near):
        y = np.abs(y).astype(np.float32)
        want = round_e2m1(torch.from_numpy(y)).numpy()
        np.testing.assert_array_equal(_kernel_round_e2m1(y), want)


def test_every_e2m1_code_times_every_e4m3_microscale_is_an_fp16_value():
    """The NVFP4 softmax dequantizes P in FP16 (one HMUL2 a pair of E2M1 codes, by the
    microscale read back as FP16, times PSCALE: 1 in the instances that do so today, P_SHIFT
    in the V-Smooth one, which multiplies in FP32): exact only if every product is an FP16
    value, as it is in FP32 (what the emulation multiplies in). Every code, every finite E4M3
    value, both PSCALEs."""
    import torch

    from vcbench.kernels.spec.formats import E2M1_GRID

    e4m3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    e4m3 = e4m3[torch.isfinite(e4m3) & (e4m3 >= 0)].unique()
    assert len(e4m3) == 127  # zero, 7 subnormals, 119 normals
    src = (compiled.CSRC / "nvfp4_traits.cuh").read_text()
    p_shift = float(re.search(r"P_SHIFT = ([0-9.]+)f;", src).group(1))
    codes = torch.tensor(E2M1_GRID, dtype=torch.float64)
    for pscale in (1.0, p_shift):
        factor = e4m3 * pscale
        assert torch.equal(factor.half().double(), factor)  # the factor itself
        product = codes[:, None] * factor[None, :]  # exact in FP64 (at most 6 significant bits)
        assert torch.equal(product.half().double(), product)


def test_the_kernels_p_quantization_matches_the_emulation_on_the_same_p():
    """P's arithmetic as nvfp4_softmax.cuh does it (in FP32 numpy): x = 2688 exp2(s - t) for the
    tile row max t (two-level; the emulation divides p by rowmax(p) / 2688), the microscale
    E4M3(amax * (1/6)), x times the microscale's reciprocal, E2M1, times the microscale. Against
    the emulation's NVFP4Probability.encode on the same scores: the dequantized P agree except
    where a quotient sits within its last ulps of an E2M1 boundary, and never by more than one
    E2M1 step there."""
    import torch

    from vcbench.kernels.spec.formats import round_e4m3
    from vcbench.kernels.spec.probability import NVFP4Probability

    g = torch.Generator().manual_seed(4)
    s = (torch.randn(256, 128, generator=g) * 4).float()  # log2 units, a tile of 256 rows
    m = s.amax(-1, keepdim=True) + torch.rand(256, 1, generator=g) * 3  # a running max above t
    for two_level in (True, False):
        enc = NVFP4Probability(two_level=two_level)
        want, outer, _ = enc.encode(s, m)
        sn = s.numpy()
        t = sn.max(-1, keepdims=True)
        if two_level:  # 2688 exp2(s - t): the kernel's one FFMA and exp2
            x = np.exp2(sn + (np.float32(np.log2(2688.0)) - t)).astype(np.float32)
        else:
            x = np.exp2(sn - m.numpy()).astype(np.float32)
        groups = x.reshape(256, 8, 16)
        amax = groups.max(-1, keepdims=True)
        scale = round_e4m3(torch.from_numpy(amax * np.float32(1 / 6))).numpy()
        inv = np.where(scale > 0, np.float32(1) / np.where(scale > 0, scale, 1), 0).astype(np.float32)
        got = (_kernel_round_e2m1(groups * inv) * scale).reshape(256, 128)
        w = want.numpy()
        differ = got != w
        assert differ.mean() < 1e-3, f"{differ.sum()} of {differ.size} differ"
        # where they differ, by one E2M1 step of that group's scale (at most 2 x scale)
        step = np.broadcast_to(2 * scale, groups.shape).reshape(256, 128)
        assert (np.abs(got - w)[differ] <= step[differ] * (1 + 1e-6)).all()
        if two_level:  # the row scale the merge applies: rowmax(p) / 2688
            s1 = np.exp2(t - m.numpy()) / np.float32(2688)
            np.testing.assert_allclose(s1, outer.numpy(), rtol=1e-6)
