"""Experiment YAML: one schema, errors that name the file, the key and the expectation."""

import pytest

from vcbench.config import load_experiment
from vcbench.errors import UserError


def write(tmp_path, text):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_valid_file_gets_defaults(tmp_path):
    exp = load_experiment(write(tmp_path, "name: t1\ncommand: analyze\nanalysis: token-order\n"))
    assert exp["out"] == "results/t1"
    assert exp["synthetic"] == {"seed": 0, "heads": 2, "grid": [8, 32, 32], "head_dim": 128}
    assert exp["tensors"] is None


@pytest.mark.parametrize("text, message", [
    ("name: t\ncommand: analyze\nanalysis: expcast\nbogus: 1\n", "unknown key 'bogus'"),
    ("name: t\ncommand: analyze\nanalysis: expcast\nsynthetic: {seeds: 1}\n", "unknown key 'synthetic.seeds'"),
    ("command: analyze\nanalysis: expcast\n", "missing required key 'name'"),
    ("name: t\ncommand: analyze\nanalysis: expcast\nbeta: high\n", "key 'beta' expects float"),
    ("name: t\ncommand: dance\n", "key 'command' must be one of"),
    ("name: t\ncommand: analyze\n", "needs key 'analysis'"),
    ("name: t\ncommand: analyze\nanalysis: kernel-error\nmethods: [bf16, nope]\n", "unknown method 'nope'"),
    ("name: t\ncommand: analyze\nanalysis: expcast\nsynthetic: {grid: [1, 2]}\n", "synthetic.grid"),
    ("- just\n- a list\n", "must be a mapping"),
    ("name: [unclosed\n", "not valid YAML at line"),
])
def test_errors_name_file_key_and_expectation(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as err:
        load_experiment(path)
    assert str(path) in str(err.value)
    assert message in str(err.value)


def test_yaml_is_loaded_safely(tmp_path):
    path = write(tmp_path, "name: !!python/object/apply:os.system ['echo pwned']\ncommand: analyze\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_experiment(path)


def test_shipped_experiments_validate():
    from pathlib import Path

    files = sorted(Path(__file__).resolve().parents[1].glob("experiments/*.yaml"))
    assert files, "no experiment files shipped"
    for f in files:
        load_experiment(f)
