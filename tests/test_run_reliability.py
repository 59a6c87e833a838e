"""`vcbench generate` when things go wrong: a second writer, a killed writer, a clip that runs
out of memory, a clip whose frames hold NaN. All on the real tiny-wan-random pipeline."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from cli_runs import ROOT, SMALL, prompts_file, run_vcbench

from vcbench.runs import WRITER_LOCK


def _prompts(tmp_path):
    return prompts_file(tmp_path, {"fox": "a fox in snow"})


_vcbench = run_vcbench


def _clip_bytes(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted((run / "clips").rglob("*.png"))}


def _wait_for(predicate, proc, what, timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            pytest.fail(f"the first writer ended (rc {proc.returncode}) before {what}")
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def test_one_writer_per_run_folder_and_a_killed_writer_is_taken_over(tmp_path):
    args = ["generate", "--model", "tiny-wan-random", "--methods", "bf16", "--seeds", "0,1,2",
            "--prompts", _prompts(tmp_path), *SMALL]
    reference = tmp_path / "reference"
    assert _vcbench(*args, "--out", reference).returncode == 0

    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "vcbench", *map(str, args), "--out", str(out)],
                             cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        lock = out / WRITER_LOCK
        _wait_for(lambda: lock.is_file() and str(first.pid) in lock.read_text(), first,
                  "it held the lock")
        second = _vcbench(*args, "--out", out)
        assert second.returncode == 2
        err = second.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), second.stderr
        assert str(out) in err[0] and f"pid {first.pid}" in err[0]

        row = out / "clips/bf16/fox/s0/row.json"
        _wait_for(lambda: row.is_file() and json.loads(row.read_text())["status"] == "ok",
                  first, "its first clip was done")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert f'"pid": {first.pid}' in (out / WRITER_LOCK).read_text()  # left by the killed run

    resumed = _vcbench(*args, "--out", out)
    assert resumed.returncode == 0, resumed.stderr
    assert "taking over the writer lock" in resumed.stderr and f"pid {first.pid}" in resumed.stderr
    assert (out / WRITER_LOCK).read_text() == ""  # released
    assert _clip_bytes(out) == _clip_bytes(reference)  # resumed bit for bit
    assert json.loads((out / "manifest.json").read_text())["status"] == "ok"


def _run_in_process(tmp_path, monkeypatch, fault, methods="bf16", seeds="0,1"):
    """generate on the real tiny-wan-random, with `fault(transformer, model)` installed on the
    loaded pipeline's transformers: the way to make one clip fail as a GPU would."""
    from vcbench.cli import main
    from vcbench.pipelines import registry

    real = registry.load_model

    def load(*a, **kw):
        model = real(*a, **kw)
        for name in ("transformer", "transformer_2"):
            if getattr(model.pipe, name, None) is not None:
                fault(getattr(model.pipe, name))
        return model

    monkeypatch.setattr(registry, "load_model", load)
    out = tmp_path / "run"
    try:
        main(["generate", "--model", "tiny-wan-random", "--methods", methods, "--seeds", seeds,
              "--prompts", str(_prompts(tmp_path)), *SMALL, "--out", str(out)])
    except SystemExit as e:
        assert e.code in (0, None)
    return out


def test_a_clip_out_of_gpu_memory_is_recorded_and_retried(tmp_path, monkeypatch):
    calls = {"n": 0}

    def fault(transformer):
        def hook(module, args, kwargs):
            calls["n"] += 1
            # the second clip's second denoising step (each step calls the transformer for
            # the conditional and the unconditional pass)
            if calls["n"] == 7 and not getattr(fault, "off", False):
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB.\n"
                                             "GPU 0 has a total capacity of 139.8 GiB")
        transformer.register_forward_pre_hook(hook, with_kwargs=True)

    out = _run_in_process(tmp_path, monkeypatch, fault)
    manifest = json.loads((out / "manifest.json").read_text())
    rows = {r["item"]: r for r in manifest["items"]}
    assert rows["bf16/fox/s0"]["status"] == "ok"
    failed = rows["bf16/fox/s1"]
    assert failed["status"] == "error" and manifest["status"] == "failed"
    assert failed["error"].startswith("out of GPU memory at step 2 of 2: CUDA out of memory.")
    assert "\n" not in failed["error"]
    first = (out / "clips/bf16/fox/s0/frames/000000.png").stat().st_mtime_ns

    fault.off = True  # a rerun, now with memory to spare, makes only the failed clip
    _run_in_process(tmp_path, monkeypatch, fault)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "ok" and all(r["status"] == "ok" for r in manifest["items"])
    assert (out / "clips/bf16/fox/s0/frames/000000.png").stat().st_mtime_ns == first


def test_a_clip_with_nan_frames_is_recorded_and_scored_on_its_own(tmp_path, monkeypatch):
    from vcbench.scoring import ScoreOptions, score

    def fault(transformer):
        def hook(module, args, kwargs, output):
            # seed 1 of fp8-fa4 only: a kernel that overflowed in one call
            if fault.poison:
                sample = output[0] if isinstance(output, tuple) else output.sample
                sample.view(-1)[0] = float("nan")
            return output
        transformer.register_forward_hook(hook, with_kwargs=True)

    fault.poison = False
    from vcbench.pipelines import generate as gen

    real_make = gen._make_clip

    def make(run, item, *a, **kw):
        fault.poison = item.method == "fp8-fa4" and item.seed == 1
        return real_make(run, item, *a, **kw)

    monkeypatch.setattr(gen, "_make_clip", make)
    out = _run_in_process(tmp_path, monkeypatch, fault, methods="bf16,fp8-fa4")
    rows = {r["item"]: r for r in json.loads((out / "manifest.json").read_text())["items"]}
    broken = rows["fp8-fa4/fox/s1"]
    assert broken["status"] == "ok" and broken["nonfinite_frames"]
    frames = np.load(out / broken["frames_npy"])
    assert frames.shape == (5, 128, 128, 3)
    assert [i for i in range(5) if not np.isfinite(frames[i]).all()] == broken["nonfinite_frames"]
    assert "nonfinite_frames" not in rows["fp8-fa4/fox/s0"]

    result = score(out, None, ScoreOptions(metrics=["psnr"]))
    by_seed = {r["seed"]: r for r in result.rows}
    assert by_seed[1]["nonfinite_frames"] == broken["nonfinite_frames"]
    assert np.isnan(by_seed[1]["psnr"]) and np.isfinite(by_seed[0]["psnr"])
    summary = next(s for s in result.summary if s["metric"] == "psnr")
    assert summary["n"] == 1 and summary["n_nonfinite"] == 1
    assert summary["mean"] == by_seed[0]["psnr"]  # the broken clip is not averaged in


def test_an_inf_reaching_attention_flags_the_clip(tmp_path, monkeypatch):
    # An inf in V of one attention call (a model that overflowed there): the quantized
    # method's output is NaN for that (batch, head) (test_nonfinite.py), not silently finite,
    # so the clip reaches the manifest with its non-finite frames and is not scored.
    def fault(transformer):
        to_v = next(m for name, m in transformer.named_modules() if name.endswith("attn1.to_v"))

        def hook(module, args, output):
            if fault.poison:
                output.view(-1)[5] = float("inf")  # token 0 of batch entry 0, head 0
            return output
        to_v.register_forward_hook(hook)

    fault.poison = False
    from vcbench.pipelines import generate as gen

    real_make = gen._make_clip

    def make(run, item, *a, **kw):
        fault.poison = item.seed == 1
        return real_make(run, item, *a, **kw)

    monkeypatch.setattr(gen, "_make_clip", make)
    out = _run_in_process(tmp_path, monkeypatch, fault, methods="vc-8bit")
    rows = {r["item"]: r for r in json.loads((out / "manifest.json").read_text())["items"]}
    assert rows["vc-8bit/fox/s1"]["status"] == "ok" and rows["vc-8bit/fox/s1"]["nonfinite_frames"]
    assert "nonfinite_frames" not in rows["vc-8bit/fox/s0"]
