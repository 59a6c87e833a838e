"""The checks of benchmarks/torchrun/torchrun_proof.sh (torchrun_proof_check.py) on run folders made up
here: the script itself needs 2 GPUs (its --cpu rehearsal is in docs/pipelines.md)."""

import hashlib
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
METHODS, PROMPTS, SEEDS = ["bf16", "fp8-fa4"], ["fox", "sea"], [0, 1]


@pytest.fixture(scope="module")
def check():
    spec = importlib.util.spec_from_file_location("torchrun_proof_check", ROOT / "benchmarks/torchrun/torchrun_proof_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(folder: Path, world: int, frames: dict[str, bytes], duplicate: str | None = None):
    rows = []
    for item, data in frames.items():
        clip = folder / "clips" / item
        (clip / "frames").mkdir(parents=True)
        (clip / "frames" / "000000.png").write_bytes(data)
        row = {"item": item, "status": "ok", "frames_dir": f"clips/{item}/frames",
               "sha256": hashlib.sha256(data).hexdigest()}
        (clip / "row.json").write_text(json.dumps(row))
        rows.append(row)
    if duplicate:
        rows.append(next(r for r in rows if r["item"] == duplicate))
    (folder / "manifest.json").write_text(json.dumps({"status": "ok", "config": {"world_size": world},
                                                      "items": rows}))


def _work(tmp_path, mode="cuda", sharded_changes=None, duplicate=None, devices=("cuda:0", "cuda:1")):
    items = [f"{m}/{p}/s{s}" for m in METHODS for p in PROMPTS for s in SEEDS]
    frames = {i: i.encode() for i in items}
    _run(tmp_path / "single", 1, frames)
    _run(tmp_path / "sharded", 2, {**frames, **(sharded_changes or {})}, duplicate)
    for rank, device in enumerate(devices):
        (tmp_path / f"preflight.rank{rank}.json").write_text(json.dumps({
            "rank": rank, "world": 2, "local_rank": rank, "backend": "nccl" if mode == "cuda" else "gloo",
            "device": device, "current_cuda": rank if mode == "cuda" else None, "all_reduce": 3.0}))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"id": p, "prompt": p}) + "\n" for p in PROMPTS))
    return ["--work", str(tmp_path), "--methods", ",".join(METHODS), "--prompts", str(prompts),
            "--seeds", "0,1", "--nproc", "2", "--mode", mode]


def test_equal_runs_pass(check, tmp_path, capsys):
    assert check.main(_work(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "OVERALL: PASS" in out and "FAIL" not in out
    assert "fp8-fa4/sea/s1" in out  # the per-item table


def test_cpu_rehearsal_expects_gloo_on_the_cpu(check, tmp_path):
    assert check.main(_work(tmp_path, mode="cpu", devices=("cpu", "cpu"))) == 0


def test_a_duplicate_or_missing_item_fails(check, tmp_path, capsys):
    assert check.main(_work(tmp_path, duplicate="bf16/fox/s0")) == 1
    assert re.search(r"sharded: every item exactly once \(8\) +FAIL", capsys.readouterr().out)


def test_bf16_frames_must_match_other_methods_only_with_strict(check, tmp_path, capsys):
    args = _work(tmp_path, sharded_changes={"fp8-fa4/sea/s1": b"other"})
    assert check.main(args) == 0
    assert "DIFF" in capsys.readouterr().out
    assert check.main([*args, "--strict"]) == 1
    (tmp_path / "b").mkdir()
    assert check.main(_work(tmp_path / "b", sharded_changes={"bf16/fox/s1": b"other"})) == 1


def test_ranks_sharing_a_gpu_fail(check, tmp_path, capsys):
    assert check.main(_work(tmp_path, devices=("cuda:0", "cuda:0"))) == 1
    assert re.search(r"uses the GPU of its LOCAL_RANK +FAIL", capsys.readouterr().out)


def test_frames_that_do_not_hash_to_the_row_fail(check, tmp_path):
    args = _work(tmp_path)
    (tmp_path / "sharded/clips/bf16/fox/s0/frames/000000.png").write_bytes(b"tampered")
    assert check.main(args) == 1


def test_each_rank_takes_the_gpu_of_its_local_rank(monkeypatch):
    import torch

    from vcbench.errors import UserError
    from vcbench.pipelines import distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.device(None) == "cuda:1" and distributed.device("cpu") == "cpu"
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(UserError, match="local rank 2 has no GPU of its own"):
        distributed.device(None)
    monkeypatch.delenv("LOCAL_RANK")
    assert distributed.device(None) is None  # not under torchrun: the registry's default
