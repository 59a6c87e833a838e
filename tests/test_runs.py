"""Run folders: manifest contents, atomic writes, tables as CSV and Parquet."""

import json
import math

import pandas as pd
import pytest

from vcbench.errors import UserError
from vcbench.runs import RunFolder, atomic_write_text, read_manifest, write_json, write_table


def test_manifest_records_config_versions_device_and_items(tmp_path):
    with RunFolder.create(tmp_path / "run", "analyze x", {"beta": -0.35}) as run:
        run.record("a", "ok", seconds=1.5)
        run.record("b", "error", message="bad")
        run.record("a", "ok", seconds=2.0)  # re-recording replaces
    m = read_manifest(tmp_path / "run")
    assert m["status"] == "ok" and m["command"] == "analyze x"
    assert m["config"] == {"beta": -0.35}
    assert {"torch", "python"} <= set(m["libraries"])
    assert "cuda" in m["device"] and m["vcbench_version"]
    assert m["items"] == [{"item": "b", "status": "error", "message": "bad"},
                          {"item": "a", "status": "ok", "seconds": 2.0}]


def test_failed_run_is_marked(tmp_path):
    with pytest.raises(RuntimeError), RunFolder.create(tmp_path / "run", "x", {}):
        raise RuntimeError("boom")
    assert read_manifest(tmp_path / "run")["status"] == "failed"


def test_atomic_write_leaves_no_temporary_and_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "f.txt"
    atomic_write_text(target, "old")

    class Unwritable:
        def encode(self):
            raise RuntimeError("serialisation failed")

    with pytest.raises(RuntimeError):
        atomic_write_text(target, Unwritable())  # type: ignore[arg-type]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_json_writes_non_finite_as_strings(tmp_path):
    write_json(tmp_path / "r.json", {"psnr": math.inf, "x": [math.nan, 1.0]})
    assert json.loads((tmp_path / "r.json").read_text()) == {"psnr": "inf", "x": ["nan", 1.0]}


def test_tables_round_trip_through_csv_and_parquet(tmp_path):
    df = pd.DataFrame({"method": ["bf16", "vc-8bit"], "rel_l2": [0.0, 0.0123]})
    paths = write_table(df, tmp_path / "t")
    assert [p.suffix for p in paths] == [".csv", ".parquet"]
    pd.testing.assert_frame_equal(pd.read_csv(paths[0]), df)
    pd.testing.assert_frame_equal(pd.read_parquet(paths[1]), df)


def test_not_a_run_folder(tmp_path):
    with pytest.raises(UserError, match="not a run folder"):
        read_manifest(tmp_path)
