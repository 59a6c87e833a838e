"""The CLI as a user meets it: tables, JSON, run folders, one-line errors with exit 2."""

import json
import subprocess
import sys

import pytest


def vcbench(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "vcbench", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600)


def test_methods_lists_the_eight():
    r = vcbench("methods")
    assert r.returncode == 0
    for name in ["bf16", "fp8-fa4", "sage2-8bit", "sage3-4bit", "attnqat-tf", "vc-8bit",
                 "vc-8bit-vsmooth", "vc-4bit"]:
        assert name in r.stdout


@pytest.mark.parametrize("method", ["sage3-4bit", "vc-4bit", "attnqat-tf"])
def test_methods_name_says_which_kernels_run_a_4bit_method_and_what_they_cost(method):
    """The compiled NVFP4 instances first, the Triton kernel after them, each a fidelity
    kernel whose line carries its measured cost."""
    r = vcbench("methods", method, "--json")
    assert r.returncode == 0, r.stderr
    kernels = json.loads(r.stdout)["gpu_kernels"]
    assert [k["backend"] for k in kernels] == ["vcbench-sm90 (nvfp4 on fp16 wgmma)",
                                               "vcbench-triton (nvfp4 on fp16 mma)"]
    assert all("BF16" in k["cost"] for k in kernels)
    text = vcbench("methods", method)
    line = f"GPU kernel vcbench-sm90 (nvfp4 on fp16 wgmma) [{kernels[0]['cost']}]"
    assert " ".join(line.split()) in " ".join(text.stdout.split())
    assert all("H200" in k["cost"] for k in kernels)  # the card it ran on


def test_analyze_expcast_json_and_run_folder(tmp_path):
    r = vcbench("analyze", "expcast", "--beta", "-0.35", "--json", str(tmp_path / "e.json"),
                "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "e.json").read_text())
    assert round(data["byte_agreement"], 3) == 0.796
    assert (tmp_path / "run" / "manifest.json").is_file()
    assert (tmp_path / "run" / "byte_map.parquet").is_file()
    moved = vcbench("analyze", "expcast", "--beta", "-0.1", "--json", str(tmp_path / "f.json"),
                    "--out", str(tmp_path / "run2"))
    assert json.loads((tmp_path / "f.json").read_text())["byte_agreement"] != data["byte_agreement"]
    assert moved.returncode == 0


def test_kernel_error_on_a_tensors_file(tmp_path):
    import torch

    from vcbench.analysis.synthetic import synthetic_qkv
    from vcbench.tensors import save_tensors

    save_tensors(tmp_path / "t.safetensors", synthetic_qkv(0, heads=1, grid=(2, 8, 16)))
    r = vcbench("analyze", "kernel-error", "--tensors", str(tmp_path / "t.safetensors"),
                "--methods", "bf16,sage2-8bit", "--option", "sage2-8bit.accum=fp22",
                "--json", str(tmp_path / "k.json"), "--out", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "k.json").read_text())["rows"]
    assert [row["method"] for row in rows] == ["bf16", "sage2-8bit"]
    for row in rows:
        assert row["prob_term"] >= 0 and row["value_term"] >= 0 and 0.99 < row["cosine"] <= 1
    del torch


@pytest.mark.parametrize("args, message", [
    (["analyze", "kernel-error", "--methods", "nope"], "unknown method 'nope'"),
    (["analyze", "kernel-error", "--tensors", "/no/such.safetensors"], "does not exist"),
    (["analyze", "kernel-error", "--option", "novalue"], "METHOD.KEY=VALUE"),
    (["analyze", "token-order", "--clusters", "0"], "--clusters"),
    (["run", "/no/such.yaml"], "does not exist"),
    (["frobnicate"], "No such command"),
])
def test_user_errors_are_one_line_exit_2(args, message, tmp_path):
    r = vcbench(*args, cwd=tmp_path)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert "Traceback" not in r.stderr


def test_bad_tensors_file_is_one_line(tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"not a safetensors file")
    r = vcbench("analyze", "token-order", "--tensors", str(bad), cwd=tmp_path)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1


def test_debug_keeps_the_traceback(tmp_path):
    r = vcbench("--debug", "analyze", "kernel-error", "--methods", "nope", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_run_experiment_file(tmp_path):
    exp = tmp_path / "e.yaml"
    exp.write_text(f"name: t\ncommand: analyze\nanalysis: expcast\nbeta: -0.3\nout: {tmp_path / 'out'}\n")
    r = vcbench("run", str(exp))
    assert r.returncode == 0, r.stderr
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["beta"] == -0.3


def test_timeit_on_a_cpu_machine_says_it_needs_cuda(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = vcbench("timeit", "--shape", "wan22-720p", "--out", str(tmp_path / "t"), cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: timeit needs a CUDA GPU, and this machine has none"
    assert not (tmp_path / "t").exists()  # refused before any run folder was made


def test_train_tiny_help_quotes_the_defaults_it_uses():
    """The help names --high-noise's and --position-std's defaults as text (the constants live
    behind a lazy torch import); they must be the values train-tiny then uses."""
    from typer.main import get_command

    from vcbench.cli import app
    from vcbench.pipelines.toywan import POSITION_INIT_STD
    from vcbench.pipelines.train_tiny import HIGH_NOISE

    params = {p.name: p for p in get_command(app).commands["train-tiny"].params}
    assert f"(default {HIGH_NOISE:g})" in params["high_noise"].help
    assert f"(default {POSITION_INIT_STD:g})" in params["position_std"].help
