"""Bringing one's own method, kernel and model: the registry idiom, plugins from a file, a
method file and an installed package's entry points, through generate, score and report."""

import hashlib
import json
import os
import subprocess
import sys

import pytest
import torch
from cli_runs import ROOT, prompts_file, run_vcbench

import vcbench
from vcbench.errors import UserError
from vcbench.kernels import METHODS, KernelMethod, attention, get_method
from vcbench.registry import Origin, Registry, registering_as

EXAMPLES = ROOT / "examples"
KERNEL_PLUGIN = EXAMPLES / "plugins" / "reference_kernel.py"
MODEL_PLUGIN = EXAMPLES / "plugins" / "tiny_wan_model.py"
METHOD_FILE = EXAMPLES / "methods" / "int8-pertensor-qk.yaml"


def error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


# --- the registry idiom --------------------------------------------------------------------

class Entry:
    def __init__(self, name):
        self.name = name


def test_a_registry_registers_looks_up_and_refuses_clashes_in_one_line():
    r = Registry("widget", "vcbench.widgets")
    a, b = Entry("a"), Entry("b")
    r.register_builtins([a])
    assert r.register(b) is b
    assert r.names() == ["a", "b"] and list(r) == ["a", "b"] and "a" in r and len(r) == 2
    assert r.get("b") is b and r.origin("a").builtin and r.origin("b").kind == "python"
    assert r.register(a) is a  # the same object again (a module imported twice): no-op
    with registering_as(Origin("file", "/x/plug.py", "sha256:00")):
        with pytest.raises(UserError, match=r"^/x/plug.py \(sha256:00\): widget 'a' is already "
                                            r"registered \(built-in\); pick another name$"):
            r.register(Entry("a"))
        c = r.register(Entry("c"))
    assert r.origin("c") == Origin("file", "/x/plug.py", "sha256:00")
    assert r.get("c") is c
    with pytest.raises(UserError, match=r"^unknown widget 'd' \(known: a, b, c\)$"):
        r.get("d")
    r.register(Entry("vc-8bit"))
    with pytest.raises(UserError, match=r"^unknown widget 'vc-8bt' \(did you mean 'vc-8bit'\? "
                                        r"known: a, b, c, vc-8bit\)$"):
        r.get("vc-8bt")
    with pytest.raises(UserError, match=r"^unknown widget 3 \(known: "):
        r.get(3)
    for bad in ("", " a", "a,b"):
        with pytest.raises(UserError, match="non-empty name"):
            r.register(Entry(bad))


def test_every_kind_registers_through_one_call():
    from vcbench.metrics import METRICS, MetricEntry

    entry = MetricEntry("test-mean-abs", lambda settings: lambda ref, cand: 0.0,
                        higher_is_better=False)
    assert vcbench.register(entry) is entry and METRICS.get("test-mean-abs") is entry
    with pytest.raises(UserError, match="not a method, kernel, backend, model or metric"):
        vcbench.register(object())
    assert METRICS.get("lpips").higher_is_better is False  # direction declared once, here
    assert METRICS.get("psnr").higher_is_better is True


def test_an_external_kernel_runs_its_callable_and_checks_what_it_returns():
    seen = {}

    def kernel(q, k, v, *, sm_scale, tensor_layout, scale_v=1.0):
        seen.update(sm_scale=sm_scale, layout=tensor_layout)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=sm_scale) * scale_v

    from vcbench.kernels.spec.method import Option

    m = vcbench.register_kernel("test-kernel-callable", kernel, devices=("cpu",),
                                options={"scale_v": Option(1.0, "multiply the output")})
    assert isinstance(m, KernelMethod) and get_method(m.name) is m
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 64, generator=g) for _ in range(3))
    out = attention(q, k, v, m.name, scale_v=2.0)
    assert seen == {"sm_scale": 64 ** -0.5, "layout": "HND"}
    want = 2.0 * torch.nn.functional.scaled_dot_product_attention(q, k, v)
    assert torch.equal(out, want)
    with pytest.raises(UserError, match="has no option 'nope'"):
        attention(q, k, v, m.name, nope=1)
    with pytest.raises(UserError, match="one dtype"):
        attention(q, k.double(), v, m.name)
    bad = vcbench.register_kernel("test-kernel-bad-shape", lambda q, k, v, **kw: q[:, :1],
                                  devices=("cpu",))
    with pytest.raises(UserError, match=r"returned \(1, 1, 64, 64\), not a tensor of q's shape"):
        attention(q, k, v, bad.name)
    gpu_only = vcbench.register_kernel("test-kernel-gpu-only", kernel)
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="cannot run on cpu tensors here"):
            attention(q, k, v, gpu_only.name)


def test_check_kernel_tiers_tell_a_kernel_that_computes_its_plan_from_one_that_does_not():
    from vcbench.analysis.check_kernel import check_kernel

    def exact(q, k, v, *, sm_scale, tensor_layout):
        return torch.nn.functional.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), scale=sm_scale).to(q.dtype)

    vcbench.register_kernel("test-exact-claims-bf16", exact, claims="bf16", devices=("cpu",))
    vcbench.register_kernel("test-exact-claims-fp8", exact, claims="fp8-fa4", devices=("cpu",))
    vcbench.register_kernel("test-exact-claims-bf16-noisy",
                            lambda q, k, v, **kw: exact(q, k, v, **kw) * 1.05,
                            claims="bf16", devices=("cpu",))
    good = check_kernel("test-exact-claims-bf16", grid=(2, 8, 8))
    assert good.verdict == "matches the plan" and good.passed
    # exact attention is more accurate than fp8-fa4's plan, but not its arithmetic
    other = check_kernel("test-exact-claims-fp8", grid=(2, 8, 8))
    assert other.verdict == "as accurate as the plan" and not other.passed
    assert other.kernel_vs_fp64 < other.emulation_vs_fp64
    noisy = check_kernel("test-exact-claims-bf16-noisy", grid=(2, 8, 8))
    assert noisy.verdict == "less accurate" and not noisy.passed
    with pytest.raises(UserError, match="is a plan method"):
        check_kernel("vc-8bit")


def test_a_kernel_that_asks_gets_each_calls_place_in_the_generation():
    from vcbench.pipelines.loaded import ClipSettings
    from vcbench.pipelines.tiny import load_tiny_wan

    contexts = []

    def kernel(q, k, v, *, sm_scale, tensor_layout, context):
        contexts.append((context, q.shape[-2]))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=sm_scale)

    vcbench.register_kernel("test-context-kernel", kernel, context=True, devices=("cpu",))
    model = load_tiny_wan(torch.device("cpu"), torch.float32)
    settings = ClipSettings(steps=3, frames=5, height=64, width=64)
    with vcbench.patch(model.pipe, "test-context-kernel") as p:
        model.generate("a red disk", 0, settings)
        routed = dict(p.routed)
    assert len(contexts) == sum(routed.values())
    # two latent frames of 4x4 patches (VAE 4x / 8x, patch 2x2): every self-attention call
    # is the video alone
    assert {c.grid for c, _ in contexts} == {(2, 4, 4)}
    assert all(dict(c.segments) == {"video": 32} and n == 32 for c, n in contexts)
    assert {c.num_steps for c, _ in contexts} == {3}
    per_step = {s: sum(1 for c, _ in contexts if c.step == s) for s in range(3)}
    assert len(set(per_step.values())) == 1 and sum(per_step.values()) == len(contexts)
    assert {c.module for c, _ in contexts} == set(routed)
    assert {c.pass_index for c, _ in contexts} == {0, 1}  # conditional and unconditional


# --- plugins on the command line -------------------------------------------------------------

def test_a_file_plugin_lists_beside_the_built_ins_with_its_kind_and_origin(tmp_path):
    r = run_vcbench("--plugin", KERNEL_PLUGIN, "methods", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["method"]: row for row in json.loads(r.stdout)}
    assert rows["torch-sdpa"]["kind"] == "kernel" and rows["torch-sdpa"]["from"] == "reference_kernel.py"
    assert rows["vc-8bit"]["kind"] == "plan" and rows["vc-8bit"]["from"] == "built-in"
    builtin = [n for n in METHODS.names() if METHODS.origin(n).builtin]
    assert list(rows)[:len(builtin) + 1] == builtin + ["torch-sdpa"]  # built-ins, then the plugin's
    r = run_vcbench("methods", "torch-sdpa", "--json", "--plugin", KERNEL_PLUGIN)  # after it too
    details = json.loads(r.stdout)
    assert details["claims"] == "bf16" and details["runs"]["cpu"] is None
    assert details["origin"].endswith(f"(sha256:{hashlib.sha256(KERNEL_PLUGIN.read_bytes()).hexdigest()})")
    env = {**os.environ, "VCBENCH_PLUGINS": os.pathsep.join([str(KERNEL_PLUGIN), str(METHOD_FILE)])}
    r = run_vcbench("methods", "--json", env=env)
    assert {"torch-sdpa", "int8-pertensor-qk"} <= {row["method"] for row in json.loads(r.stdout)}


def test_a_broken_plugin_is_one_error_line(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    assert "plugin " in error_line(run_vcbench("--plugin", broken, "methods"))
    assert "No module named 'not_a_module_anywhere'" in error_line(run_vcbench("--plugin", broken, "methods"))
    clash = tmp_path / "clash.py"
    clash.write_text("import vcbench\nvcbench.register_kernel('vc-8bit', lambda q, k, v, **kw: q)\n")
    line = error_line(run_vcbench("methods", "--plugin", clash))
    assert "method 'vc-8bit' is already registered (built-in)" in line
    bad_file = tmp_path / "bad.yaml"
    bad_file.write_text("name: x\nq: {format: int9, granularity: per-tensor}\n")
    assert "bad.yaml" in error_line(run_vcbench("--plugin", bad_file, "methods"))
    assert "no module of that name" in error_line(run_vcbench("--plugin", "no_such_plugin_mod", "methods"))
    assert "no such file" in error_line(run_vcbench("--plugin", tmp_path / "missing.py", "methods"))


def test_a_method_file_and_a_callable_go_through_generate_score_and_report(tmp_path):
    prompts = prompts_file(tmp_path, {"p1": "a red disk drifting right over blue stripes"})
    run = tmp_path / "run"
    r = run_vcbench("generate", "--plugin", KERNEL_PLUGIN, "--plugin", METHOD_FILE,
                    "--model", "tiny-wan", "--methods", "bf16,torch-sdpa,int8-pertensor-qk",
                    "--prompts", prompts, "--seeds", "0", "--steps", "3", "--out", run)
    assert r.returncode == 0, r.stderr
    manifest = json.loads((run / "manifest.json").read_text())
    plugins = {p["plugin"]: p for p in manifest["plugins"]}
    assert plugins[str(KERNEL_PLUGIN)]["registered"] == ["method torch-sdpa", "method torch-sdpa-late-steps"]
    assert plugins[str(METHOD_FILE)]["version"] == "sha256:" + hashlib.sha256(METHOD_FILE.read_bytes()).hexdigest()
    rows = {i["method"]: i for i in manifest["items"]}
    assert rows["torch-sdpa"]["implementation"] == "reference_kernel.py:sdpa"
    assert rows["int8-pertensor-qk"]["implementation"] == "emulate"
    assert rows["torch-sdpa"]["attention_calls"] == rows["bf16"]["attention_calls"] > 0
    assert rows["int8-pertensor-qk"]["sha256"] != rows["bf16"]["sha256"]  # the swap took effect
    r = run_vcbench("score", run, "--metrics", "psnr", "--json", run / "score.json",
                    "--plugin", KERNEL_PLUGIN, "--plugin", METHOD_FILE)
    assert r.returncode == 0, r.stderr
    # the report runs without the plugins, from what the run recorded of them
    r = run_vcbench("report", run, "--out", tmp_path / "report")
    assert r.returncode == 0, r.stderr
    report = (tmp_path / "report" / "report.md").read_text()
    for method in ("torch-sdpa", "int8-pertensor-qk"):
        assert any(line.startswith(f"| {method} |") for line in report.splitlines()), report


def test_a_model_plugin_generates(tmp_path):
    prompts = prompts_file(tmp_path, {"p1": "a red disk"})
    r = run_vcbench("--plugin", MODEL_PLUGIN, "generate", "--model", "tiny-wan-1layer",
                    "--methods", "bf16,sage2-8bit", "--prompts", prompts, "--seeds", "0",
                    "--out", tmp_path / "run")
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["config"]["model"] == "tiny-wan-1layer"
    assert [i["status"] for i in manifest["items"]] == ["ok", "ok"]
    assert manifest["plugins"][0]["registered"] == ["model tiny-wan-1layer"]


def test_an_installed_package_registers_through_its_entry_point(tmp_path):
    import shutil

    site, package = tmp_path / "site", tmp_path / "package"  # a copy: the build writes beside it
    shutil.copytree(EXAMPLES / "sageattention-plugin", package)
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                          "--no-build-isolation", "--no-index", "--target", str(site),
                          str(package)], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr
    env = {**os.environ, "PYTHONPATH": str(site)}
    r = run_vcbench("methods", "--json", env=env)
    assert r.returncode == 0, r.stderr
    row = {x["method"]: x for x in json.loads(r.stdout)}["sageattn-1.0.6"]
    assert row["kind"] == "kernel" and row["from"] == "vcbench-sageattention"
    details = json.loads(run_vcbench("methods", "sageattn-1.0.6", "--json", env=env).stdout)
    assert details["origin"] == ("vcbench-sageattention (vcbench.methods sageattn-1-0-6 = "
                                 "vcbench_sageattention:METHOD) (0.1.0)")
    if not torch.cuda.is_available():  # a GPU-only kernel on a CPU machine: one line, no folder
        line = error_line(run_vcbench("generate", "--methods", "bf16,sageattn-1.0.6",
                                      "--out", tmp_path / "run", env=env))
        assert "sageattn-1.0.6" in line and "cuda" in line
        assert not (tmp_path / "run").exists()


def test_docs_extending_shows_the_example_files_as_they_are():
    doc = (ROOT / "docs" / "extending.md").read_text()
    for path in (KERNEL_PLUGIN, MODEL_PLUGIN, EXAMPLES / "sageattention-plugin" /
                 "vcbench_sageattention" / "__init__.py",
                 EXAMPLES / "sageattention-plugin" / "pyproject.toml"):
        assert path.read_text() in doc, f"docs/extending.md lacks {path.relative_to(ROOT)} verbatim"


@pytest.mark.parametrize("path", [KERNEL_PLUGIN, MODEL_PLUGIN])
def test_example_plugins_import_in_a_fresh_process(path):
    r = subprocess.run([sys.executable, "-c", f"import runpy; runpy.run_path({str(path)!r})"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_sageattention_1_never_stands_in_for_sageattention_2():
    # the PyPI package `sageattention` 1.0.6 is SageAttention 1 (FP16 PV): its `sageattn` is a
    # plugin's kernel, not the backend of sage2-8bit's released plan
    from vcbench.kernels.backends.external import sage2_version_reason

    assert sage2_version_reason("1.0.6") == "sageattention 1.0.6 is SageAttention 1, not 2"
    assert sage2_version_reason("unknown") is not None
    assert sage2_version_reason("2.1.1") is None and sage2_version_reason("2.2.0+cu128") is None


def test_an_external_kernel_goes_through_project_clip(tmp_path):
    from vcbench.timing import clip_parts
    from vcbench.timing import clip_projection as cp

    def kernel(q, k, v, *, sm_scale, tensor_layout):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=sm_scale)

    vcbench.register_kernel("test-kernel-projected", kernel, devices=("cpu",))
    req = cp.Request(methods=["test-kernel-projected"], device="cpu", backend="emulate",
                     text_repeats=1)
    table, _ = cp.project_clip(req, tmp_path / "proj", clip_parts.tiny_spec())
    assert list(table.method) == ["bf16", "test-kernel-projected"]
    row = table.set_index("method").loc["test-kernel-projected"]
    assert row.implementation == (f"test_plugins.{test_an_external_kernel_goes_through_project_clip.__name__}"
                                  ".<locals>.kernel") and row.clip_s > 0
    import pandas as pd

    parts = pd.read_csv(tmp_path / "proj" / "parts.csv")
    mine = parts[(parts.method == "test-kernel-projected") & (parts.part == "transformer")]
    assert list(mine.kind) == ["all"]  # no grouping schedule: every step alike
