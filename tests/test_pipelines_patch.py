"""vcbench.patch on the real diffusers WanPipeline (tiny random-weight config, CPU)."""

import numpy as np
import pytest
import torch

import vcbench
from vcbench.errors import UserError
from vcbench.kernels.spec.vsmooth import GroupingSchedule
from vcbench.pipelines.loaded import ClipSettings
from vcbench.pipelines.registry import load_model

SMALL = ClipSettings(steps=3, frames=5, height=128, width=128)  # 2x8x8 = 128 video tokens


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-wan-random", device="cpu")


def _attention_modules(pipe):
    return {f"{t}.{n}": m for t in ("transformer", "transformer_2")
            for n, m in getattr(pipe, t).named_modules() if hasattr(m, "processor")}


def _forward_counter(pipe):
    counts = {}
    handles = []
    for name in ("transformer", "transformer_2"):
        def hook(module, args, name=name):
            counts[name] = counts.get(name, 0) + 1
        handles.append(getattr(pipe, name).register_forward_pre_hook(hook))
    return counts, handles


def test_patch_routes_every_self_attention_call(tiny):
    counts, handles = _forward_counter(tiny.pipe)
    try:
        with vcbench.patch(tiny.pipe, "sage2-8bit") as p:
            tiny.generate("a fox", 0, SMALL)
    finally:
        for h in handles:
            h.remove()
    modules = _attention_modules(tiny.pipe)
    self_attn = [n for n, m in modules.items() if not m.is_cross_attention]
    cross = [n for n, m in modules.items() if m.is_cross_attention]
    assert len(self_attn) == 4 and len(cross) == 4  # 2 blocks x 2 experts
    # Both experts ran (Wan2.2's boundary switch) and every call of every block was counted.
    assert set(counts) == {"transformer", "transformer_2"}
    assert sum(counts.values()) == 2 * SMALL.steps  # CFG: cond + uncond per step
    for name in self_attn:
        assert p.routed[name] == counts[name.split(".")[0]]
    for name in cross:  # cross-attention stays on SDPA by default
        assert p.routed[name] == 0 and p.plain[name] == counts[name.split(".")[0]]


def test_patch_restores_pipeline_exactly(tiny):
    modules = _attention_modules(tiny.pipe)
    before = {n: (m.processor, dict(m._forward_pre_hooks), dict(m._forward_hooks)) for n, m in modules.items()}
    reference = tiny.generate("a fox", 0, SMALL)
    with vcbench.patch(tiny.pipe, "vc-8bit"):
        patched = tiny.generate("a fox", 0, SMALL)
    after = {n: (m.processor, dict(m._forward_pre_hooks), dict(m._forward_hooks)) for n, m in modules.items()}
    for n in modules:
        assert after[n][0] is before[n][0]
        assert after[n][1:] == before[n][1:]
    assert not tiny.pipe.transformer._forward_pre_hooks
    assert not np.array_equal(patched, reference)  # the method really changed the output
    np.testing.assert_array_equal(tiny.generate("a fox", 0, SMALL), reference)


def test_patch_pins_processors_to_native_and_restores_them(tiny):
    attn = tiny.pipe.transformer.blocks[0].attn1
    original = attn.processor
    original._attention_backend = "flash"  # as if the user had chosen another backend
    try:
        with vcbench.patch(tiny.pipe, "bf16"):
            assert attn.processor is not original and attn.processor._attention_backend == "native"
        assert attn.processor is original and original._attention_backend == "flash"
    finally:
        original._attention_backend = None


def test_grouping_schedule_fires_on_the_right_steps(tiny, monkeypatch):
    """What the schedule does to each attention call, watched at the two calls the patch makes
    (the real `attention` and `group`, wrapped to record their arguments and results):
    a regroup step computes a new order, warm-started from the last grouping's centroids; a
    reuse step hands the method the very permutation tensor of the preceding regroup step; a
    plain step's output is the method's with V-Smooth off."""
    import vcbench.pipelines.patch as patch_module

    calls, groupings, holder = [], [], {}

    def recording_attention(q, k, v, method, **options):
        out = vcbench.attention(q, k, v, method, **options)
        s = holder["patch"].state
        calls.append(dict(step=s.step, key=(holder["route"], s.pass_index), q=q, k=k, v=v,
                          options=options, out=out))
        return out

    real_group = patch_module.group

    def recording_group(v, config, grid=None, init=None):
        g = real_group(v, config, grid=grid, init=init)
        s = holder["patch"].state
        groupings.append(dict(step=s.step, key=(holder["route"], s.pass_index), init=init, result=g))
        return g

    monkeypatch.setattr(patch_module, "attention", recording_attention)
    monkeypatch.setattr(patch_module, "group", recording_group)

    steps = ClipSettings(steps=8, frames=5, height=128, width=128)
    # no warm iterations: a warm-started grouping is then the nearest-centroid order of the
    # centroids it was given, which the test can compute on its own
    p = vcbench.patch(tiny.pipe, "vc-8bit", schedule_fraction=0.5, schedule_refresh_every=2,
                      vsmooth_warm_iters=0)
    holder["patch"] = p
    # the patch's own observer names the module of each routed call before it is computed
    p.observe = lambda name, *rest: holder.update(route=name)
    with p:
        tiny.generate("a fox", 1, steps)
    expected = GroupingSchedule(8, fraction=0.5, refresh_every=2)
    assert p.actions == {s: expected.action(s) for s in range(8)}
    assert p.actions == {0: "regroup", 1: "reuse", 2: "regroup", 3: "reuse",
                         4: "plain", 5: "plain", 6: "plain", 7: "plain"}
    # k-means runs only on regroup steps: once per self-attention layer and CFG pass
    # (2 layers of the high-noise expert x cond/uncond).
    assert dict(p.regroups) == {0: 4, 2: 4}
    assert p.state.grid == (2, 8, 8)

    assert sorted({c["step"] for c in calls}) == list(range(8))
    grouped = {(g["step"], g["key"]): g for g in groupings}
    assert sorted({step for step, _ in grouped}) == [0, 2]
    for (step, key), g in grouped.items():
        assert (g["init"] is None) == (step == 0)
        if step == 2:  # warm start: the centroids step 0 computed for this layer and pass
            assert g["init"] is grouped[(0, key)]["result"].centroids
            v = next(c["v"] for c in calls if c["step"] == 2 and c["key"] == key)
            labels = torch.cdist(v.double(), g["init"].double()).argmin(-1)
            assert torch.equal(g["result"].permutation, torch.argsort(labels, dim=-1, stable=True))
    last = {}
    for c in calls:
        perm = c["options"].get("permutation")
        action = expected.action(c["step"])
        if action == "regroup":
            assert perm is grouped[(c["step"], c["key"])]["result"].permutation
            last[c["key"]] = perm
        elif action == "reuse":
            assert perm is last[c["key"]]
        else:
            assert perm is None
            scale = {k: c["options"][k] for k in ("sm_scale",) if k in c["options"]}
            plain = vcbench.attention(c["q"], c["k"], c["v"], "vc-8bit", vsmooth=False, **scale)
            assert torch.equal(c["out"], plain)
            assert not torch.equal(c["out"], vcbench.attention(c["q"], c["k"], c["v"], "vc-8bit", **scale))


def test_methods_without_vsmooth_take_no_schedule(tiny):
    with vcbench.patch(tiny.pipe, "fp8-fa4") as p:
        tiny.generate("a fox", 0, SMALL)
    assert p.actions == {} and not p.regroups and sum(p.routed.values()) > 0


def test_same_seed_same_noise_for_every_method(tiny):
    seen = {}
    for method in ("bf16", "vc-8bit"):
        def grab(module, args, kwargs, method=method):
            seen.setdefault(method, kwargs.get("hidden_states", args[0] if args else None).clone())
        h = tiny.pipe.transformer.register_forward_pre_hook(grab, with_kwargs=True)
        try:
            with vcbench.patch(tiny.pipe, method):
                tiny.generate("a fox", 3, ClipSettings(1, 5, 128, 128))
        finally:
            h.remove()
    assert torch.equal(seen["bf16"], seen["vc-8bit"])


def test_bad_options_are_user_errors(tiny):
    with pytest.raises(UserError, match="no option"):
        vcbench.patch(tiny.pipe, "vc-8bit", no_such_option=1)
    with pytest.raises(UserError, match="grouping schedule"):
        vcbench.patch(tiny.pipe, "vc-8bit", schedule_fraction=2.0)
    with pytest.raises(UserError, match="unknown method"):
        vcbench.patch(tiny.pipe, "int3")


def test_capture_saves_post_rope_qkv_with_grid(tmp_path):
    from vcbench.pipelines.capture import run_capture
    from vcbench.tensors import load_tensors

    written = run_capture("tiny-wan-random", None, "a fox", 0, [1], [0, 1], tmp_path,
                          {"steps": 2, "frames": 5, "height": 128, "width": 128}, "cpu")
    assert [p.name for p in written] == ["transformer.blocks.1.attn1.step000.safetensors",
                                         "transformer.blocks.1.attn1.step001.safetensors"]
    t = load_tensors(written[0])
    assert t.q.shape == t.k.shape == t.v.shape == (1, 2, 128, 128) and t.grid == (2, 8, 8)


class _Raising(torch.nn.Module):
    """An attention module (it has a processor, as diffusers' do) that can fail after its SDPA
    call, as one that runs out of memory does."""

    processor = None

    def __init__(self):
        super().__init__()
        self.fail = False

    def set_processor(self, processor):
        self.processor = processor

    def forward(self, x):
        out = torch.nn.functional.scaled_dot_product_attention(x, x, x)
        if self.fail:
            raise RuntimeError("out of memory")
        return out


def test_after_an_attention_module_raises_no_other_sdpa_call_is_routed():
    attn = _Raising()
    model = torch.nn.Sequential(attn)
    x = torch.randn(1, 2, 64, 64, generator=torch.Generator().manual_seed(0))
    sdpa = torch.nn.functional.scaled_dot_product_attention(x, x, x)
    with vcbench.patch(model, "sage2-8bit") as p:
        attn.fail = True
        with pytest.raises(RuntimeError, match="out of memory"):
            model(x)
        assert dict(p.routed) == {"transformer.0": 1}
        # an SDPA call after the failed transformer call (a text encoder's) is SDPA's own
        assert torch.equal(torch.nn.functional.scaled_dot_product_attention(x, x, x), sdpa)
        attn.fail = False
        routed = model(x)
        assert dict(p.routed) == {"transformer.0": 2} and not torch.equal(routed, sdpa)
    assert torch.equal(model(x), sdpa)
