"""vcbench under torch.compile on the CPU: the attention custom op, a patched transformer
compiled whole, and the grouping schedule's bounded number of graphs."""

import pytest
import torch

import vcbench
from vcbench.errors import UserError
from vcbench.kernels import METHODS, get_method, group, ops


def _qkv(seed=0, n=200, heads=2, dim=128, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    # diffusers' layout: (B, N, H, D) projections viewed as HND, so q, k, v are not contiguous
    return [torch.randn(1, n, heads, dim, generator=g, dtype=dtype).transpose(1, 2) for _ in range(3)]


@pytest.mark.parametrize("method,options", [
    ("bf16", {}), ("sage2-8bit", {"sm_scale": 0.05}), ("fp8-fa4", {}), ("sage3-4bit", {}),
    ("vc-8bit", {}), ("vc-8bit", {"vsmooth": False}), ("vc-4bit", {"vsmooth_order": "cube", "grid": (2, 10, 10)}),
])
def test_op_equals_eager_attention_bit_for_bit(method, options):
    q, k, v = _qkv()
    eager = vcbench.attention(q, k, v, method, **options)
    out = ops.attention(q, k, v, method, **options)
    assert torch.equal(out, eager)
    # the fake's strides: contiguous HND (the eager call may return a view of padded tiles)
    assert out.stride() == q.new_empty(q.shape).stride()


def test_op_takes_the_per_call_tensors():
    q, k, v = _qkv(1)
    grouping = group(v, get_method("vc-8bit").plan().vsmooth)
    perm = torch.flip(grouping.permutation, dims=(-1,))  # an order k-means would not give
    eager = vcbench.attention(q, k, v, "vc-8bit", permutation=perm)
    assert torch.equal(ops.attention(q, k, v, "vc-8bit", permutation=perm), eager)
    assert not torch.equal(eager, vcbench.attention(q, k, v, "vc-8bit"))
    nhd = [x.transpose(1, 2) for x in (q, k, v)]
    assert torch.equal(ops.attention(*nhd, "vc-8bit", tensor_layout="NHD", permutation=perm),
                       eager.transpose(1, 2))


@pytest.mark.parametrize("method", ["sage2-8bit", "sage3-4bit", "vc-8bit"])
def test_opcheck(method):
    q, k, v = _qkv(2, n=128)
    args = (q, k, v, method, ops.serialize_options(method, {}), None, None, None, None, "emulate")
    torch.library.opcheck(torch.ops.vcbench.attention.default, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_op_bad_input_is_a_user_error():
    q, k, v = _qkv(n=128)
    with pytest.raises(UserError, match="no option"):
        ops.attention(q, k, v, "vc-8bit", no_such_option=1)
    with pytest.raises(UserError, match="backend must be"):
        ops.attention(q, k, v, "vc-8bit", backend="tpu")


def test_serialized_options_are_canonical_json():
    import json

    for method in METHODS.builtin_names():
        resolved = get_method(method).resolve({})
        plain = {n: list(x) if isinstance(x, tuple) else x for n, x in resolved.items()
                 if n not in ("permutation", "grid", "centroids", "sm_scale")}
        assert ops.serialize_options(method, {}) == json.dumps(plain, sort_keys=True)
    given = {"expcast_beta": -1e-07, "vsmooth_cube": (1, 4, 4), "vsmooth": False}
    text = ops.serialize_options("vc-8bit", given)
    assert json.loads(text) == {**json.loads(ops.serialize_options("vc-8bit", {})),
                                **given, "vsmooth_cube": [1, 4, 4]}
    with pytest.raises(UserError, match="plain values"):
        ops.serialize_options("vc-8bit", {"expcast_beta": float("nan")})


@pytest.mark.parametrize("method,options", [
    ("sage2-8bit", {"sm_scale": 0.05, "q_granularity": "block"}),
    ("vc-8bit", {"expcast_beta": -0.5, "vsmooth": False}),
])
def test_a_compiled_function_calling_the_op_is_one_graph(method, options):
    q, k, v = _qkv(3, n=128)
    fn = lambda a, b, c: ops.attention(a, b, c, method, **options)  # noqa: E731
    torch._dynamo.reset()
    explained = torch._dynamo.explain(fn)(q, k, v)
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons
    graphs = _Graphs()
    out = torch.compile(fn, backend=graphs, fullgraph=True)(q, k, v)
    torch._dynamo.reset()
    assert torch.equal(out, vcbench.attention(q, k, v, method, **options))
    assert graphs.count(torch.ops.vcbench.attention.default) == 1


# ---- a patched transformer under torch.compile -------------------------------------------

ROUTED = torch.ops.vcbench.patched_attention.default
PLAIN = torch.ops.vcbench.plain_attention.default


@pytest.fixture(scope="module")
def tiny():
    from vcbench.pipelines.registry import load_model

    return load_model("tiny-wan-random", device="cpu")


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    # 2 latent frames of 16x16 -> 2x8x8 = 128 video tokens
    return dict(hidden_states=torch.randn(1, 16, 2, 16, 16, generator=g),
                timestep=torch.tensor([500]), encoder_hidden_states=torch.randn(1, 16, 64, generator=g))


def _call(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


class _Graphs:
    """A compile backend that keeps each graph Dynamo hands it, then runs it as aot_eager."""

    def __init__(self):
        from torch._dynamo.backends.common import aot_autograd

        self.dynamo_graphs, self.aot_graphs = [], []

        def keep(gm, example_inputs):
            self.aot_graphs.append(gm)
            return gm.forward
        self._aot = aot_autograd(fw_compiler=keep)

    def __call__(self, gm, example_inputs):
        self.dynamo_graphs.append(gm)
        return self._aot(gm, example_inputs)

    def count(self, target):
        return sum(n.target is target for gm in self.aot_graphs for n in gm.graph.nodes)


@pytest.mark.parametrize("method", ["bf16", "sage2-8bit"])
def test_compiled_patched_transformer_is_one_graph_equal_to_eager(tiny, method):
    model, inputs = tiny.pipe.transformer, _inputs()
    with vcbench.patch(tiny.pipe, method) as p:
        eager = _call(model, inputs)
        torch._dynamo.reset()
        graphs = _Graphs()
        compiled = torch.compile(model, backend=graphs, fullgraph=True)
        out = _call(compiled, inputs)
        again = _call(compiled, _inputs(1))
    torch._dynamo.reset()  # the compiled code held the patch's hooks
    assert torch.equal(out, eager)  # aot_eager: the same kernels, the op's body is the eager call
    assert not torch.equal(again, out)
    assert len(graphs.dynamo_graphs) == 1  # fullgraph, and no recompile on new values
    # each self-attention layer is one opaque op; cross-attention SDPA in its own op
    assert graphs.count(ROUTED) == 2 and graphs.count(PLAIN) == 2
    # the op's body ran on each call: 1 eager + 2 compiled calls per layer
    assert dict(p.routed) == {"transformer.blocks.0.attn1": 3, "transformer.blocks.1.attn1": 3}
    assert dict(p.plain) == {"transformer.blocks.0.attn2": 3, "transformer.blocks.1.attn2": 3}


class _TensorMethods(torch.nn.Module):
    """An attention module (a processor, as diffusers' have) whose forward also calls Tensor
    methods that torch implements in Python, as diffusers' processors do (unflatten, split)."""

    processor = None

    def set_processor(self, processor):
        self.processor = processor

    def forward(self, x):
        q = x.unflatten(2, (2, -1)).transpose(1, 2)  # (B, N, H*D) -> (B, H, N, D)
        a, b = q.split(q.shape[-1] // 2, dim=-1)
        side = (1 - a, 2 / (b.abs() + 1), 2 ** b, a.norm(dim=-1))
        return torch.nn.functional.scaled_dot_product_attention(q, q, q), side


def test_the_patch_leaves_python_tensor_methods_as_they_are_eager_and_compiled():
    model = torch.nn.Sequential(_TensorMethods())
    x = torch.randn(1, 128, 2 * 128, generator=torch.Generator().manual_seed(4))
    plain_out, plain_side = model(x)
    torch._dynamo.reset()
    with vcbench.patch(model, "sage2-8bit") as p:
        out, side = model(x)
        graphs = _Graphs()
        compiled_out, compiled_side = torch.compile(model, backend=graphs, fullgraph=True)(x)
    torch._dynamo.reset()
    assert dict(p.routed) == {"transformer.0": 2}  # the SDPA call went to the method
    assert not torch.equal(out, plain_out) and torch.equal(compiled_out, out)
    for got, compiled, want in zip(side, compiled_side, plain_side, strict=True):
        assert torch.equal(got, want) and torch.equal(compiled, want)
    assert len(graphs.dynamo_graphs) == 1 and graphs.count(ROUTED) == 1


def test_the_patch_ops_are_not_captured_by_cuda_graphs():
    # their bodies hold the run's state; a replayed graph would skip them
    if not hasattr(torch.Tag, "cudagraph_unsafe"):
        pytest.skip("this torch has no cudagraph_unsafe tag")
    for op in (torch.ops.vcbench.patch_begin, torch.ops.vcbench.patched_attention,
               torch.ops.vcbench.plain_attention):
        assert torch.Tag.cudagraph_unsafe in op.default.tags


@pytest.mark.parametrize("method", ["bf16", "sage2-8bit", "vc-8bit"])
def test_explain_finds_no_graph_break(tiny, method):
    model, inputs = tiny.pipe.transformer, _inputs()
    torch._dynamo.reset()
    with vcbench.patch(tiny.pipe, method), torch.no_grad():
        explained = torch._dynamo.explain(model)(**inputs, return_dict=False)
    torch._dynamo.reset()
    assert explained.graph_break_count == 0 and explained.graph_count == 1, explained.break_reasons


def test_inductor_compiles_the_patched_transformer(tiny):
    model, inputs = tiny.pipe.transformer, _inputs()
    with vcbench.patch(tiny.pipe, "vc-8bit"):
        eager = _call(model, inputs)
        torch._dynamo.reset()
        out = _call(torch.compile(model, backend="inductor", fullgraph=True), inputs)
    torch._dynamo.reset()
    plain = _call(model, inputs)
    # Inductor fuses the rest of the block (float reassociation); attention is the op's bits
    torch.testing.assert_close(out, eager, atol=1e-4, rtol=1e-4)
    assert (out - eager).abs().max() < (plain - eager).abs().max() / 10


def test_restore_after_compile_leaves_the_transformer_as_it_was(tiny):
    model, inputs = tiny.pipe.transformer, _inputs()
    reference = _call(model, inputs)
    with vcbench.patch(tiny.pipe, "sage2-8bit"):
        torch._dynamo.reset()
        patched = _call(torch.compile(model, backend="aot_eager", fullgraph=True), inputs)
    torch._dynamo.reset()
    assert not torch.equal(patched, reference)
    assert not model._forward_pre_hooks and all(
        not m._forward_pre_hooks and not m._forward_hooks for m in model.modules())
    assert torch.equal(_call(model, inputs), reference)


# ---- the grouping schedule under compile -------------------------------------------------

STEPS = 20
# The bound: one graph per compiled transformer (and input shape), whatever the schedule
# does. The step, the action (regroup / reuse / plain), the cached permutation and k-means
# live in the ops' bodies, read and run when the graph runs; nothing of them is a guard.
GRAPHS_PER_TRANSFORMER = 1


def _schedule_run(tiny, model):
    """20 transformer calls, the scheduler's step index advanced before each."""
    scheduler = tiny.pipe.scheduler
    scheduler.set_timesteps(STEPS)
    outs = []
    for step in range(STEPS):
        scheduler._step_index = step
        outs.append(_call(model, _inputs(step)))
    scheduler._step_index = None
    return outs


def test_grouping_schedule_compiles_once_over_a_20_step_run(tiny):
    model = tiny.pipe.transformer
    with vcbench.patch(tiny.pipe, "vc-8bit") as p:
        eager = _schedule_run(tiny, model)
        actions, regroups = dict(p.actions), dict(p.regroups)
    torch._dynamo.reset()
    graphs = _Graphs()
    compiled = torch.compile(model, backend=graphs, fullgraph=True)
    with vcbench.patch(tiny.pipe, "vc-8bit") as p:
        outs = _schedule_run(tiny, compiled)
    torch._dynamo.reset()
    assert set(actions.values()) == {"regroup", "reuse", "plain"}  # every action was taken
    assert p.actions == actions and dict(p.regroups) == regroups == {0: 2, 4: 2}
    assert len(graphs.dynamo_graphs) == GRAPHS_PER_TRANSFORMER
    assert sum(p.routed.values()) == 2 * STEPS
    for got, want in zip(outs, eager, strict=True):
        assert torch.equal(got, want)


# Regional compilation (diffusers' `compile_repeated_blocks`: each block compiled, one graph
# serving all): the block that starts a transformer call holds `patch_begin`, the rest do not,
# so two graphs, whatever the number of blocks or what the schedule does.
GRAPHS_PER_REGIONAL = 2


def test_regional_compile_is_two_graphs_for_every_block_and_step(tiny):
    import types

    config = dict(tiny.pipe.transformer.config)
    torch.manual_seed(0)
    model = type(tiny.pipe.transformer).from_config({**config, "num_layers": 4}).eval()
    pipe = types.SimpleNamespace(transformer=model, scheduler=tiny.pipe.scheduler)
    with vcbench.patch(pipe, "vc-8bit") as p:
        eager = _schedule_run(tiny, model)
        actions = dict(p.actions)
    torch._dynamo.reset()
    graphs = _Graphs()
    model.compile_repeated_blocks(backend=graphs, fullgraph=True)
    with vcbench.patch(pipe, "vc-8bit") as p:
        outs = _schedule_run(tiny, model)
    torch._dynamo.reset()
    assert set(actions.values()) == {"regroup", "reuse", "plain"} and p.actions == actions
    assert len(graphs.dynamo_graphs) == GRAPHS_PER_REGIONAL
    assert dict(p.routed) == {f"transformer.blocks.{i}.attn1": STEPS for i in range(4)}
    assert dict(p.plain) == {f"transformer.blocks.{i}.attn2": STEPS for i in range(4)}
    for got, want in zip(outs, eager, strict=True):
        assert torch.equal(got, want)


# ---- vcbench generate --compile ------------------------------------------------------------

def test_generate_compile_records_compile_time_beside_the_wall(tmp_path):
    import json

    import numpy as np
    from cli_runs import SMALL, prompts_file, run_vcbench

    from vcbench.pipelines.video_io import read_frames

    common = ["generate", "--model", "tiny-wan-random", "--methods", "vc-8bit", "--prompts",
              prompts_file(tmp_path, {"fox": "a fox in snow"}), "--seeds", "0,1", *SMALL]
    rows = {}
    for name, extra in (("eager", []), ("compiled", ["--compile"])):
        done = run_vcbench(*common, *extra, "--out", tmp_path / name)
        assert done.returncode == 0, done.stderr
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        rows[name] = manifest["items"]
        assert manifest["status"] == "ok" and manifest["config"].get("compile") is (extra != [] or None)
    for eager, compiled in zip(rows["eager"], rows["compiled"], strict=True):
        assert compiled["status"] == "ok" and compiled["compile"] is True and "compile" not in eager
        assert "compile_s" not in eager
        assert compiled["grouping_actions"] == eager["grouping_actions"] == {"0": "regroup", "1": "plain"}
        assert compiled["attention_calls"] == eager["attention_calls"] > 0
        a = read_frames(tmp_path / "eager" / eager["frames_dir"]).astype(int)
        b = read_frames(tmp_path / "compiled" / compiled["frames_dir"]).astype(int)
        assert np.abs(a - b).max() <= 2  # Inductor reassociates the rest; attention is the op's
    first, second = rows["compiled"]
    # the first clip of the method compiled both experts; the second reused the graphs
    assert first["compile_s"] > 0 and second["compile_s"] == 0


def test_experiment_key_compile_is_a_bool(tmp_path):
    from vcbench.config import load_experiment

    path = tmp_path / "exp.yaml"
    base = "name: t\ncommand: generate\nmodel: tiny-wan-random\nmethods: [bf16]\n"
    path.write_text(base)
    assert load_experiment(path)["compile"] is False
    path.write_text(base + "compile: true\n")
    assert load_experiment(path)["compile"] is True
    path.write_text(base + "compile: fast\n")
    with pytest.raises(UserError, match="key 'compile' expects bool"):
        load_experiment(path)
