"""`vcbench generate` refuses a mistaken request before anything heavy starts: one `error:`
line, exit status 2, no traceback, and no run folder left behind."""

import json

import pytest
import torch
from cli_runs import SMALL, run_vcbench

from vcbench.pipelines.registry import MODELS, load_model


def _empty(tmp_path):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


def _half_wan(tmp_path):
    """A folder with the index but not the experts it names."""
    folder = tmp_path / "half"
    (folder / "vae").mkdir(parents=True)
    (folder / "model_index.json").write_text(json.dumps(
        {"_class_name": "WanPipeline", "transformer": ["diffusers", "WanTransformer3DModel"],
         "vae": ["diffusers", "AutoencoderKLWan"], "text_encoder": [None, None]}))
    return folder


def _lora(tmp_path):
    (tmp_path / "lora.safetensors").write_bytes(b"")
    return tmp_path / "lora.safetensors"


no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")

CASES = [
    pytest.param(lambda t: ["--device", "cuda"], "--device cuda: no CUDA GPU", marks=no_gpu,
                 id="cuda-without-gpu"),
    pytest.param(lambda t: ["--device", "tpu"], "is not a device (cpu, cuda", id="device"),
    pytest.param(lambda t: ["--model", "wan22-t2v-a14b", "--model-path", _empty(t)],
                 "no model_index.json", id="empty-model-folder"),
    pytest.param(lambda t: ["--model", "wan22-t2v-a14b", "--model-path", _half_wan(t)],
                 "missing transformer/, transformer_2/", id="model-folder-layout"),
    pytest.param(lambda t: ["--steps", "0"], "--steps must be at least 1, got 0", id="steps-0"),
    pytest.param(lambda t: ["--frames", "0"], "--frames must be at least 1", id="frames-0"),
    pytest.param(lambda t: ["--height", "-16"], "--height must be at least 1", id="height-neg"),
    pytest.param(lambda t: ["--width", "0"], "--width must be at least 1", id="width-0"),
    pytest.param(lambda t: ["--methods", "bf16,bf16"], "--methods lists 'bf16' twice",
                 id="duplicate-method"),
    pytest.param(lambda t: ["--seeds", "0,0"], "--seeds lists 0 twice", id="duplicate-seed"),
    pytest.param(lambda t: ["--model", "tiny-wan", "--model-path", _empty(t)],
                 "built in and loads no folder", id="path-ignored"),
    pytest.param(lambda t: ["--lora-path", _lora(t)], "takes no --lora-path (only minimax-h3",
                 id="lora-ignored"),
    pytest.param(lambda t: ["--frames", "3"], "4k+1", id="frames-4k+1"),
    pytest.param(lambda t: ["--height", "60"], "divisible by 16", id="height-16"),
    pytest.param(lambda t: ["--model", "wan9"], "unknown model 'wan9'", id="unknown-model"),
]


@pytest.mark.parametrize("extra, message", CASES)
def test_a_mistake_is_one_line_before_anything_starts(tmp_path, extra, message):
    out = tmp_path / "run"
    r = run_vcbench("generate", "--model", "tiny-wan", "--methods", "bf16", *SMALL,
                    *map(str, extra(tmp_path)), "--out", out, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert message in lines[0]
    assert not out.exists()  # not even the writer lock


def test_debug_keeps_the_traceback(tmp_path):
    r = run_vcbench("--debug", "generate", "--steps", "0", "--out", tmp_path / "run")
    assert r.returncode != 0 and "Traceback" in r.stderr and "UserError" in r.stderr


@pytest.mark.parametrize("name", ["tiny-wan", "tiny-wan-random"])
def test_an_entrys_defaults_are_what_its_model_loads_with(name):
    """Settings are resolved from the entry before loading: they must be the loaded ones."""
    assert load_model(name, None, "cpu").defaults == MODELS[name].defaults
