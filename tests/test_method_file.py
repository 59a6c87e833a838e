"""Method files (vcbench/kernels/spec/method_file.py): the examples' plans against plans built by
hand from the spec classes, emulated outputs bit for bit, the nine built-ins restated as files,
options, one-line errors for bad files, which backends take the examples, and every snippet of
docs/extending.md's method-file section."""

import hashlib
import re
from pathlib import Path

import pytest
import torch
from conftest import reference_attention, rel_l2

import vcbench
from vcbench.cli import _parse_options
from vcbench.errors import UserError
from vcbench.kernels import backends, get_method
from vcbench.kernels.reference.engine import emulate
from vcbench.kernels.spec.formats import E4M3, INT8
from vcbench.kernels.spec.granularity import PerBlock, PerChannel, PerTensor, PerWarp, Quantizer
from vcbench.kernels.spec.method import Plan
from vcbench.kernels.spec.method_file import load_method_file
from vcbench.kernels.spec.probability import ExpCast

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "methods"
PERTENSOR = EXAMPLES / "int8-pertensor-qk.yaml"
FP8 = EXAMPLES / "fp8-smoothk-expcast.yaml"

# Written out from the recipes the examples' comments describe, not read from the files.
HAND_BUILT = {
    PERTENSOR: Plan(q=Quantizer(INT8, PerTensor()), k=Quantizer(INT8, PerTensor()),
                    v=Quantizer(E4M3, PerChannel()), p=ExpCast(-0.35), smooth_k=True),
    FP8: Plan(q=Quantizer(E4M3, PerBlock(128)), k=Quantizer(E4M3, PerBlock(128)),
              v=Quantizer(E4M3, PerBlock(128)), p=ExpCast(-0.35), smooth_k=True),
}


def qkv(n=300, d=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, d, generator=g) for _ in range(3))
    return q, k + 2 * torch.randn(1, 2, 1, d, generator=g), v  # K with a token mean to smooth


def write(tmp_path, text, name="m.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", [PERTENSOR, FP8], ids=lambda p: p.stem)
def test_example_is_the_hand_built_plan_and_emulates_bit_for_bit(path):
    method = load_method_file(path)
    assert method.plan() == HAND_BUILT[path]
    assert (method.qk_bits, method.pv_bits, method.smoothing) == (8, 8, "K mean")
    q, k, v = qkv()
    out = emulate(q, k, v, method.plan())
    assert torch.equal(out, emulate(q, k, v, HAND_BUILT[path]))
    assert rel_l2(out, reference_attention(q, k, v)) < 0.1  # attention, not noise


def test_provenance_is_the_path_and_the_sha256_of_the_bytes():
    method = load_method_file(PERTENSOR)
    assert method.path == str(PERTENSOR)
    assert method.sha256 == hashlib.sha256(PERTENSOR.read_bytes()).hexdigest()


def test_which_gpu_backends_take_the_examples():
    """From the plans alone (no GPU needed): the per-tensor example is emulation-only; the FP8
    one runs on the Triton kernel (the compiled kernel has no instance for it); overriding the
    per-tensor example's Q and K to per-block scales gives a plan both 8-bit kernels take."""
    def taking(plan):
        return [b.name for b in backends.BACKENDS.values() if b.supports(plan, None) is None]

    pertensor = load_method_file(PERTENSOR)
    assert taking(pertensor.plan()) == []
    assert taking(load_method_file(FP8).plan()) == [backends.TRITON.name]
    blocked = pertensor.plan({"q.granularity": "per-block", "k.granularity": "per-block"})
    assert taking(blocked) == [backends.SM90.name, backends.TRITON.name]
    # ... which is vc-8bit's plain plan with one Q scale per query tile
    assert blocked == get_method("vc-8bit").plan({"vsmooth": False, "q_granularity": "block",
                                                  "hadamard_qk": False})


# sage2-8bit with one Q scale per 64 rows (two warps' worth) instead of per warp: both 8-bit
# kernels take Q scales per 16..128 rows (their tiles stay 128 x 128: block_m: 64 would not run)
SAGE2_Q64 = """\
name: sage2-q64
q: {format: int8, granularity: per-block, rows: 64}
k: {format: int8, granularity: per-block}
v: {format: e4m3, granularity: per-channel}
p: {encoder: exp-then-cast, format: e4m3, scale: 448}
smooth_k: true
"""


def test_a_sage2_variant_with_other_q_blocks_is_taken_by_both_8bit_kernels(tmp_path):
    plan = load_method_file(write(tmp_path, SAGE2_Q64)).plan()
    assert plan.q == Quantizer(INT8, PerBlock(64))
    assert [b.name for b in backends.BACKENDS.values() if b.supports(plan, None) is None] == [
        backends.SM90.name, backends.TRITON.name]
    small_tiles = load_method_file(write(tmp_path, SAGE2_Q64 + "block_m: 64\n")).plan()
    assert all(b.supports(small_tiles, None) for b in backends.BACKENDS.values())


# ---- the built-ins, restated ---------------------------------------------------------------

SAGE2_QK = """\
q: {format: int8, granularity: per-warp, rows: 16}
k: {format: int8, granularity: per-block}
v: {format: e4m3, granularity: per-channel}
smooth_k: true
"""
SAGE3_QK = """\
q: {format: e2m1, granularity: microscale16}
k: {format: e2m1, granularity: microscale16, axis: -1}
v: {format: e2m1, granularity: microscale16, axis: -2}
p: {encoder: nvfp4, two_level: true}
smooth_k: true
smooth_q: true
"""
VSMOOTH = "vsmooth: {order: kmeans, clusters: 32, iters: 10, warm_iters: 5, cube: [2, 8, 8]}\n"
RESTATED = {
    "bf16": """\
q: {format: bf16, granularity: unscaled}
k: {format: bf16, granularity: unscaled}
v: {format: bf16, granularity: unscaled}
p: {encoder: exp-then-cast, format: bf16}
fold_scale_into_q: false
""",
    "fp8-fa4": """\
q: {format: e4m3, granularity: per-block, rows: 128}
k: {format: e4m3, granularity: per-block}
v: {format: e4m3, granularity: per-block}
p: {encoder: exp-then-cast, format: e4m3, scale: 448}
""",
    "sage2-8bit": SAGE2_QK + "p: {encoder: exp-then-cast, format: e4m3, scale: 448.0}\n",
    "sage3-4bit": SAGE3_QK,
    "attnqat-tf": """\
q: {format: e2m1, granularity: microscale16, global_scale: true}
k: {format: e2m1, granularity: microscale16, global_scale: true}
v: {format: e2m1, granularity: microscale16, global_scale: true}
p: {encoder: nvfp4, two_level: false}
""",
    # the VC methods rotate Q and K by default (their QK Hadamard)
    "vc-8bit": SAGE2_QK + "p: {encoder: expcast, beta: -0.35}\nhadamard_qk: true\n" + VSMOOTH,
    "vc-8bit-vsmooth": SAGE2_QK + "p: {encoder: exp-then-cast, format: e4m3, scale: 256}\n"
                       "hadamard_qk: true\nvsmooth: {}\n",
    "vc-4bit": SAGE3_QK + "hadamard_qk: true\nvsmooth: {hadamard_v: false}\n",
    "vc-8bit-fp8qk": SAGE2_QK.replace("int8", "e4m3") + "p: {encoder: expcast}\nhadamard_qk: true\n"
                     + VSMOOTH,
}


def restated(tmp_path, builtin):
    return load_method_file(write(tmp_path, f"name: {builtin}-file\n" + RESTATED[builtin]))


def test_every_builtin_is_restated():
    assert sorted(RESTATED) == sorted(vcbench.kernels.METHODS.builtin_names())


@pytest.mark.parametrize("builtin", list(RESTATED))
def test_a_restated_builtin_is_the_builtin(tmp_path, builtin):
    method, want = restated(tmp_path, builtin), get_method(builtin)
    assert method.plan() == want.plan()
    assert (method.qk_bits, method.pv_bits, method.smoothing) == (want.qk_bits, want.pv_bits,
                                                                  want.smoothing)
    q, k, v = qkv(n=200)
    assert torch.equal(emulate(q, k, v, method.plan()), vcbench.attention(q, k, v, builtin))


@pytest.mark.parametrize("builtin, extra, options", [
    ("fp8-fa4", "hadamard_qk: true\n", {"hadamard_qk": True}),
    ("sage2-8bit", "accum: fp22\n", {"accum": "fp22"}),
    ("sage3-4bit", "hadamard_qk: true\nblock_m: 64\nblock_n: 64\n",
     {"hadamard_qk": True, "block_m": 64, "block_n": 64}),
    ("vc-8bit", "vsmooth: {order: cube, cube: [1, 4, 4], hadamard_v: true}\n",
     {"vsmooth_order": "cube", "vsmooth_cube": (1, 4, 4), "hadamard_v": True}),
])
def test_a_restated_builtin_with_a_field_set_is_the_builtin_with_that_option(
        tmp_path, builtin, extra, options):
    text = "name: b\n" + RESTATED[builtin].replace(VSMOOTH, "") + extra  # extra's vsmooth only
    assert load_method_file(write(tmp_path, text)).plan() == get_method(builtin).plan(options)


def test_restated_sage2_runs_where_the_official_sageattention_does(tmp_path):
    plan = restated(tmp_path, "sage2-8bit").plan()
    assert backends.SAGE2_OFFICIAL.supports(plan, None) is None


def test_a_vsmooth_file_takes_the_vsmooth_options_with_its_values_as_defaults(tmp_path):
    text = f"name: vs\n{SAGE2_QK}p: {{encoder: expcast}}\nvsmooth: {{order: balanced, clusters: 8}}\n"
    method = load_method_file(write(tmp_path, text))
    builtin = get_method("vc-8bit")
    # V-Smooth's options, not vc-8bit's own (its ExpCast beta, Q granularity, accumulation and
    # QK Hadamard)
    own = {"expcast_beta", "q_granularity", "accum", "hadamard_qk"}
    assert set(builtin.options) - own <= set(method.options)
    defaults = {name: opt.default for name, opt in method.options.items()}
    assert defaults["vsmooth_order"] == "balanced" and defaults["vsmooth_clusters"] == 8
    assert defaults["vsmooth"] is True and defaults["permutation"] is None
    same = {"vsmooth_order": "balanced", "vsmooth_clusters": 8, "hadamard_qk": False}
    assert method.plan() == builtin.plan(same)
    for given in ({"vsmooth": False}, {"vsmooth_clusters": 3, "vsmooth_order": "cube"},
                  {"block_m": 64, "block_n": 64}, {"hadamard_v": True}):
        assert method.plan(given) == builtin.plan({**same, **given}), given
    # the per-call options reach the emulation as the built-in's do
    q, k, v = qkv(n=256)
    perm = torch.randperm(256).expand(1, 2, 256).contiguous()
    opts = method.resolve({"permutation": perm})
    assert torch.equal(emulate(q, k, v, method.build(opts), permutation=opts["permutation"]),
                       vcbench.attention(q, k, v, "vc-8bit", permutation=perm, **same))
    with pytest.raises(UserError, match=r"method 'vs': vsmooth_clusters: must be at least 1"):
        method.resolve({"vsmooth_clusters": 0})


# ---- options ---------------------------------------------------------------------------------

def test_declared_options_default_to_the_file_and_override_its_fields():
    method = load_method_file(PERTENSOR)
    declared = {n: o.default for n, o in method.options.items()}
    assert declared == {"block_m": 128, "block_n": 128, "q.granularity": "per-tensor",
                        "k.granularity": "per-tensor", "smooth_k": True, "p.beta": -0.35}
    assert method.plan({"p.beta": -0.3, "smooth_k": False}) == Plan(
        q=Quantizer(INT8, PerTensor()), k=Quantizer(INT8, PerTensor()),
        v=Quantizer(E4M3, PerChannel()), p=ExpCast(-0.3))
    assert method.plan({"q.granularity": "per-warp"}).q == Quantizer(INT8, PerWarp(16))
    assert method.plan({"block_m": 64, "q.granularity": "per-block"}).q == Quantizer(
        INT8, PerBlock(64))
    # the CLI's --option NAME.FIELD=VALUE splits at the first dot: the field keeps its own
    assert _parse_options(["int8-pertensor-qk.q.granularity=per-block"]) == {
        "int8-pertensor-qk": {"q.granularity": "per-block"}}


@pytest.mark.parametrize("given, message", [
    ({"k.rows": 64}, r"method 'int8-pertensor-qk' has no option 'k.rows'"),
    ({"q.granularity": "per-channel"}, r"q.granularity: Q cannot take per-channel"),
    ({"q.granularity": "per-blok"}, r"option q.granularity='per-blok' is not one of"),
    ({"p.beta": 0.6}, r"method 'int8-pertensor-qk': p.beta: must lie in \(-0.5, 0.5\)"),
    ({"smooth_k": "yes"}, r"option smooth_k expects bool"),
])
def test_a_bad_override_is_refused_when_the_options_are_resolved(given, message):
    with pytest.raises(UserError, match=message):
        load_method_file(PERTENSOR).resolve(given)


def test_an_option_on_a_field_the_file_leaves_out_defaults_to_the_schema(tmp_path):
    text = GOOD + "options:\n  q.rows: rows per Q scale\n  p.format: unused by expcast\n"
    method = load_method_file(write(tmp_path, text))
    assert method.options["q.rows"].default is None
    assert method.plan().q == Quantizer(INT8, PerBlock(128))  # rows: the query tile
    assert method.plan({"q.rows": 32}).q == Quantizer(INT8, PerBlock(32))
    with pytest.raises(UserError, match=r"method 'm': p.format: unknown key"):
        method.resolve({"p.format": "e4m3"})


def test_a_tile_override_checks_the_rows_the_file_fixed(tmp_path):
    method = load_method_file(write(tmp_path, "name: m\n" + RESTATED["fp8-fa4"]))
    assert method.plan({"block_n": 64}).k == Quantizer(E4M3, PerBlock(64))  # rows: the tile
    with pytest.raises(UserError, match=r"method 'm': q.rows: 128 does not divide block_m \(64\)"):
        method.resolve({"block_m": 64})


# ---- mistakes --------------------------------------------------------------------------------

GOOD = """\
name: m
q: {format: int8, granularity: per-block}
k: {format: int8, granularity: per-block}
v: {format: e4m3, granularity: per-channel}
p: {encoder: expcast}
"""


def edit(old, new):
    assert old in GOOD
    return GOOD.replace(old, new)


BAD = {
    "unknown key": (GOOD + "smooth_kk: true\n", "smooth_kk: unknown key (did you mean smooth_k?)"),
    "unknown quantizer key": (edit("per-block}\nk", "per-block, rowz: 64}\nk"),
                              "q.rowz: unknown key (did you mean rows?)"),
    "bad format": (edit("{format: int8, granularity: per-block}\nk", "{format: int4, granularity: "
                        "per-block}\nk"),
                   "q.format: 'int4' is not one of int8, e4m3, e2m1, bf16"),
    "bad granularity": (edit("int8, granularity: per-block}\nk", "int8, granularity: per-blok}\nk"),
                        "q.granularity: 'per-blok' is not one of per-tensor, per-block, per-warp, "
                        "per-channel, microscale16, unscaled"),
    "bad rows": (edit("int8, granularity: per-block}\nv", "int8, granularity: per-block, "
                      "rows: 48}\nv"), "k.rows: 48 does not divide block_n (128)"),
    "rows not an int": (edit("per-block}\nk", "per-block, rows: '64'}\nk"),
                        "q.rows: expects an integer, got '64'"),
    "rows on per-tensor": (edit("per-block}\nk", "per-tensor, rows: 64}\nk"),
                           "q.rows: per-tensor takes no parameters"),
    "V rows off the tile": (edit("e4m3, granularity: per-channel}", "e4m3, granularity: "
                                 "per-block, rows: 64}"),
                            "v.rows: per-block V scales cover one KV tile: rows must be block_n"),
    "per-channel K": (edit("int8, granularity: per-block}\nv", "int8, granularity: per-channel}\nv"),
                      "k.granularity: K cannot take per-channel"),
    "per-warp K": (edit("int8, granularity: per-block}\nv", "int8, granularity: per-warp}\nv"),
                   "k.granularity: K cannot take per-warp"),
    "scaled bf16": (edit("e4m3, granularity: per-channel", "bf16, granularity: per-channel"),
                    "v.granularity: bf16 operands are unscaled, and only bf16 operands are"),
    "unscaled int8": (edit("per-block}\nk", "unscaled}\nk"),
                      "q.format: bf16 operands are unscaled, and only bf16 operands are"),
    "e2m1 per channel": (edit("e4m3, granularity: per-channel", "e2m1, granularity: per-channel"),
                         "v.granularity: e2m1 needs microscale16"),
    "mixed QK formats": (edit("int8, granularity: per-block}\nv", "e4m3, granularity: "
                              "per-block}\nv"), "k.format: 'e4m3' differs from q.format 'int8'"),
    "bad axis": (edit("e4m3, granularity: per-channel", "e2m1, granularity: microscale16, axis: 1"),
                 "v.axis: 1 is not one of -1 (head dim), -2 (tokens)"),
    "bad tile": (GOOD + "block_m: 96\n", "block_m: 96 is not one of 64, 128"),
    "bad accum": (GOOD + "accum: fp16\n", "accum: 'fp16' is not one of fp32, fp22"),
    "flag not a bool": (GOOD + "smooth_k: 1\n", "smooth_k: expects true or false, got 1"),
    "bad encoder": (edit("expcast}", "exp}"), "p.encoder: 'exp' is not one of exp-then-cast, "
                                              "expcast, nvfp4"),
    "beta off the code": (edit("expcast}", "expcast, beta: 0.5}"), "p.beta: must lie in (-0.5, 0.5)"),
    "key of another encoder": (edit("expcast}", "expcast, scale: 256}"),
                               "p.scale: unknown key (encoder expcast takes encoder, beta)"),
    "P scale past the format": (edit("{encoder: expcast}", "{encoder: exp-then-cast, format: e4m3, "
                                     "scale: 512}"), "p.scale: must be in (0, 448]"),
    "P format": (edit("{encoder: expcast}", "{encoder: exp-then-cast, format: int8}"),
                 "p.format: 'int8' is not one of e4m3, bf16"),
    "missing p": (edit("p: {encoder: expcast}\n", ""), "p: missing"),
    "missing name": (edit("name: m\n", ""), "name: missing"),
    "bad name": (edit("name: m\n", "name: my.method\n"), "name: 'my.method' must be letters"),
    "bad vsmooth": (GOOD + "vsmooth: true\n", "vsmooth: expects null or a mapping"),
    "bad clusters": (GOOD + "vsmooth: {clusters: 0}\n", "vsmooth.clusters: must be at least 1"),
    "bad cube": (GOOD + "vsmooth: {cube: [2, 8]}\n", "vsmooth.cube: expects three integers"),
    "duplicate key": (GOOD + "name: n\n", "not valid YAML: line 6, column 1: duplicate key 'name'"),
    "bad YAML syntax": (GOOD + "smooth_k: [true\n", "not valid YAML: line 7, column 1:"),
    "not a mapping": ("- name: m\n", "(top): a method file is a mapping"),
    "options naming a non-field": (GOOD + "options:\n  q.rowz: rows\n",
                                   "options.q.rowz: not a plan field (did you mean q.rows?)"),
    "options naming the name": (GOOD + "options:\n  name: the name\n",
                                "options.name: not a plan field"),
    "options naming vsmooth": (GOOD + "vsmooth: {}\noptions:\n  vsmooth.clusters: k\n",
                               "options.vsmooth.clusters: a V-Smooth method takes V-Smooth's "
                               "options already (this one as vsmooth_clusters)"),
    "option without help": (GOOD + "options:\n  smooth_k:\n", "options.smooth_k: expects a help"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_an_invalid_file_is_one_line_naming_the_file_and_the_field(tmp_path, case):
    text, message = BAD[case]
    path = write(tmp_path, text)
    with pytest.raises(UserError) as e:
        load_method_file(path)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"{path}: {message}"), str(e.value)


def test_files_that_are_not_method_files(tmp_path):
    for path, message in [(tmp_path / "absent.yaml", "no such method file"),
                          (write(tmp_path, GOOD, "m.json"), "a method file ends in .yaml"),
                          (write(tmp_path, "", "empty.yaml"), "(top): a method file is a mapping"),
                          (write(tmp_path, 'name = "m"\nq = {', "m.toml"), "not valid TOML")]:
        with pytest.raises(UserError) as e:
            load_method_file(path)
        assert str(e.value).startswith(f"{path}: {message}") and "\n" not in str(e.value)


# ---- docs/extending.md -------------------------------------------------------------------------

def doc_snippets() -> list[tuple[str, str]]:
    text = (ROOT / "docs" / "extending.md").read_text()
    section = text.split("\n## A method as a file\n", 1)[1]
    section = re.split(r"\n## ", section, maxsplit=1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, flags=re.DOTALL)


def test_every_snippet_of_the_docs_section_holds(tmp_path, monkeypatch, capsys):
    snippets = doc_snippets()
    assert [kind for kind, _ in snippets] == ["yaml", "toml", "python", "yaml", "text"]
    (_, example), (_, toml), (_, python), (_, bad), (_, error) = snippets
    assert example == PERTENSOR.read_text()  # the example, verbatim

    as_toml = load_method_file(write(tmp_path, toml, "m.toml"))
    as_yaml = load_method_file(PERTENSOR)
    assert as_toml.plan() == as_yaml.plan() and as_toml.summary == as_yaml.summary
    assert as_toml.options == as_yaml.options and as_toml.name == as_yaml.name

    monkeypatch.chdir(ROOT)
    exec(compile(python, "docs/extending.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("int8-pertensor-qk 8 8 K mean ")
    assert lines[1] == str([backends.SM90.name, backends.TRITON.name])

    monkeypatch.chdir(tmp_path)
    write(tmp_path, bad, "my.yaml")
    with pytest.raises(UserError) as e:
        load_method_file("my.yaml")
    assert f"error: {e.value}" == error.strip()


# ---- on a GPU --------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not backends.triton_ready(), reason="needs a CUDA GPU (sm_90+) and Triton")
@pytest.mark.parametrize("source", ["fp8-smoothk-expcast", "sage2-q64"])
def test_a_method_file_runs_on_the_triton_kernel(monkeypatch, tmp_path, source):
    """The tolerance rule of tests/test_gpu_kernels.py: operands bit-equal, the output within
    max(4e-3, 0.5 e) of the emulation's, e the emulation's own error against FP64."""
    from test_gpu_kernels import assert_bit_equal, inputs

    from vcbench.kernels.backends.triton.operands import prepare_gpu
    from vcbench.kernels.reference.engine import finish, prepare, run

    monkeypatch.setenv("VCBENCH_KERNEL", "triton")
    path = FP8 if source == FP8.stem else write(tmp_path, SAGE2_Q64)
    plan = load_method_file(path).plan()
    assert backends.select(plan) is backends.TRITON
    for kind, n in [("normal", 1000), ("outliers", 4133)]:
        q, k, v = inputs(kind, n, 128, seed=n)
        emu = prepare(q, k, v, plan)
        ops = prepare_gpu(q, k, v, plan)
        for got, want, what in [(ops.q, emu.q.codes, "Q codes"), (ops.q_scale, emu.q.scale, "Q scales"),
                                (ops.k, emu.k.codes, "K codes"), (ops.k_scale, emu.k.scale, "K scales"),
                                (ops.v_t.transpose(-1, -2), emu.v.codes, "V codes"),
                                (ops.v_scale, emu.v.scale, "V scales")]:
            assert_bit_equal(got, want, what)
        out = backends.TRITON.run(q, k, v, plan, {})
        emu_out = finish(run(emu, plan)[0], n, plan)
        e = rel_l2(emu_out, reference_attention(q, k, v))
        assert torch.isfinite(out).all()
        assert rel_l2(out, emu_out) <= max(4e-3, 0.5 * e)

