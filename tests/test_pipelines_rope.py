"""The patch hands Wan's RoPE to the method (pipelines/wan_rope.py), on the real diffusers
WanPipeline (tiny random-weight config, CPU, the emulation): the clip is the one the pipeline's
own RoPE gives, bit for bit; only self-attention takes it over; the capture still sees
post-RoPE tensors; restore() puts back the original processor objects; a run records the path
per transformer; a model whose RoPE is another computation keeps it."""

import json

import numpy as np
import pytest
import torch
from cli_runs import SMALL as SMALL_FLAGS
from cli_runs import prompts_file, run_vcbench
from tiny_video_pipelines import BUILDERS

import vcbench
from vcbench.kernels.spec.rope import Rope, apply_rope
from vcbench.pipelines.loaded import ClipSettings
from vcbench.pipelines.patch import rope_paths
from vcbench.pipelines.registry import load_model
from vcbench.pipelines.wan_rope import WanRopeProcessor

SMALL = ClipSettings(steps=3, frames=5, height=128, width=128)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-wan-random", device="cpu")


def _modules(pipe):
    return {f"{t}.{n}": m for t in ("transformer", "transformer_2")
            for n, m in getattr(pipe, t).named_modules() if hasattr(m, "processor")}


@pytest.mark.parametrize("method", ["vc-8bit-vsmooth", "sage2-8bit"])
def test_fused_rope_makes_the_pipelines_clip(tiny, method):
    with vcbench.patch(tiny.pipe, method) as fused:
        a = tiny.generate("a fox", 0, SMALL)
    with vcbench.patch(tiny.pipe, method, fuse_rope=False) as outside:
        b = tiny.generate("a fox", 0, SMALL)
    np.testing.assert_array_equal(a, b)
    assert not outside.rope_routed and set(outside.rope_paths().values()) == {"outside"}
    modules = _modules(tiny.pipe)
    self_attn = [n for n, m in modules.items() if not m.is_cross_attention]
    assert len(self_attn) == 4
    for name in modules:  # every self-attention call came before RoPE; no cross call did
        assert fused.rope_routed[name] == (fused.routed[name] if name in self_attn else 0)
        assert fused.routed[name] == outside.routed[name] and fused.plain == outside.plain
    assert fused.actions == outside.actions
    assert not fused.rope_unfusable  # Wan's tables are FP32: the fused kernels take them


def test_restore_puts_the_original_processors_back(tiny):
    modules = _modules(tiny.pipe)
    before = {n: m.processor for n, m in modules.items()}
    assert rope_paths(tiny.pipe) == {"transformer": "fused", "transformer_2": "fused"}
    reference = tiny.generate("a fox", 1, SMALL)
    with vcbench.patch(tiny.pipe, "vc-8bit") as p:
        taken = {n for n, m in modules.items() if isinstance(m.processor, WanRopeProcessor)}
        assert taken == {n for n, m in modules.items() if not m.is_cross_attention}
        assert all(modules[n].processor.inner is before[n] for n in taken)
        assert p.rope_paths() == {"transformer": "fused", "transformer_2": "fused"}
    assert all(m.processor is before[n] for n, m in modules.items())
    assert not p.rope_paths() or set(p.rope_paths().values()) == {"outside"}
    assert not any(m._forward_pre_hooks or m._forward_hooks for m in modules.values())
    np.testing.assert_array_equal(tiny.generate("a fox", 1, SMALL), reference)
    # a processor pinned to another backend: the copy pinned to native is wrapped, and the
    # user's object comes back
    attn = tiny.pipe.transformer.blocks[0].attn1
    original = attn.processor
    original._attention_backend = "flash"
    try:
        with vcbench.patch(tiny.pipe, "bf16"):
            inner = attn.processor.inner
            assert inner is not original and inner._attention_backend == "native"
        assert attn.processor is original and original._attention_backend == "flash"
    finally:
        original._attention_backend = None


def test_the_observer_sees_post_rope_tensors(tiny):
    seen = {True: {}, False: {}}
    for fuse in seen:
        def observe(name, step, pass_index, q, k, v, grid, into=seen[fuse]):
            into.setdefault(name, (q.clone(), k.clone()))

        with vcbench.patch(tiny.pipe, "bf16", fuse_rope=fuse) as p:
            p.observe = observe
            tiny.generate("a fox", 0, ClipSettings(1, 5, 128, 128))
    fused, outside = seen[True], seen[False]
    assert fused.keys() == outside.keys() and len(fused) == 2  # one step: one expert's blocks
    for name in fused:
        assert torch.equal(fused[name][0], outside[name][0])
        assert torch.equal(fused[name][1], outside[name][1])


def test_routed_calls_that_fall_back_rotate_first(tiny):
    # a call left on SDPA, given q and k before RoPE, gets them rotated (the plain path)
    q, k, v = (torch.randn(1, 2, 16, 64) for _ in range(3))
    cos, sin = (t.float() for t in (torch.rand(16, 64), torch.rand(16, 64)))
    with vcbench.patch(tiny.pipe, "bf16") as p:
        route = p._route_list[0]
        p._begun = torch.empty(0)
        got = p._sdpa(route, False, q, k, v, is_causal=True,
                      rope=(cos, sin))
    rope = Rope(cos, sin)
    want = torch.nn.functional.scaled_dot_product_attention(apply_rope(q, rope),
                                                            apply_rope(k, rope), v, is_causal=True)
    assert torch.equal(got, want)


def test_a_run_records_where_rope_ran(tmp_path):
    prompts = prompts_file(tmp_path, {"fox": "a fox in snow"})
    out = tmp_path / "run"
    done = run_vcbench("generate", "--model", "tiny-wan-random", "--methods", "vc-8bit",
                       "--prompts", prompts, "--seeds", "0", *SMALL_FLAGS, "--out", out)
    assert done.returncode == 0, done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["rope"] == {"transformer": "fused", "transformer_2": "fused"}
    [row] = manifest["items"]
    # the emulation rotates q and k first (the fused kernels' oracle)
    assert row["rope"] == {"transformer": "eager", "transformer_2": "eager"}


@pytest.mark.parametrize("pipeline", sorted(BUILDERS))
def test_other_rope_forms_stay_outside(tmp_path, pipeline):
    # HunyuanVideo, CogVideoX, LTX-Video, Mochi: RoPE is not Wan's computation there
    from vcbench.pipelines.any_diffusers import load_diffusers

    path, _ = BUILDERS[pipeline](tmp_path / "model")
    pipe = load_diffusers(path, torch.device("cpu"), torch.float32).pipe
    assert set(rope_paths(pipe).values()) == {"outside"}
    with vcbench.patch(pipe, "bf16"):
        assert not any(isinstance(getattr(m, "processor", None), WanRopeProcessor)
                       for m in pipe.transformer.modules())
