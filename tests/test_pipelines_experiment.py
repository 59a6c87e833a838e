"""`vcbench run` on a `command: generate` experiment file: the same run folder as the flags of
`vcbench generate`, and errors that name the file and the key."""

import json
from pathlib import Path

import pytest

from vcbench.cli import main
from vcbench.config import load_experiment
from vcbench.errors import UserError
from vcbench.pipelines.registry import MODELS

ROOT = Path(__file__).resolve().parents[1]


def _manifest(run: Path) -> dict:
    m = json.loads((run / "manifest.json").read_text())
    for row in m["items"]:
        row.pop("wall_s")  # the one field that differs run to run
    return {"config": m["config"], "items": m["items"], "status": m["status"]}


def test_experiment_file_makes_the_same_run_folder_as_cli_flags(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("a fox in snow\n")
    flags = tmp_path / "flags"
    main(["generate", "--model", "tiny-wan-random", "--methods", "bf16,vc-8bit", "--prompts", str(prompts),
          "--seeds", "3", "--steps", "2", "--frames", "5", "--height", "128", "--width", "128",
          "--option", "vc-8bit.vsmooth_clusters=4", "--option", "vc-8bit.vsmooth_cube=[1,4,4]",
          "--schedule-fraction", "1.0", "--schedule-after-window", "reuse", "--out", str(flags)])
    exp = tmp_path / "gen.yaml"
    exp.write_text(f"""name: gen
command: generate
model: tiny-wan-random
methods: [bf16, vc-8bit]
method_options: {{vc-8bit: {{vsmooth_clusters: 4, vsmooth_cube: [1, 4, 4]}}}}
prompts: {prompts}
seeds: [3]
steps: 2
frames: 5
height: 64
width: 128
schedule: {{fraction: 1.0, after_window: reuse}}
""")
    from_file = tmp_path / "from-file"
    # --set replaces the file's value before validation (height 64 -> 128).
    main(["run", str(exp), "--set", "height=128", "--set", f"out={from_file}"])
    a, b = _manifest(flags), _manifest(from_file)
    assert a == b
    assert a["status"] == "ok" and len(a["items"]) == 2
    assert a["config"]["method_options"]["vc-8bit"] == {"vsmooth_clusters": 4, "vsmooth_cube": [1, 4, 4]}
    assert a["items"][1]["grouping_actions"] == {"0": "regroup", "1": "reuse"}
    for row in a["items"]:  # the frames themselves, not only the rows
        assert (flags / row["frames_dir"] / "000000.png").read_bytes() == \
            (from_file / row["frames_dir"] / "000000.png").read_bytes()


GOOD = "name: g\ncommand: generate\nmodel: tiny-wan-random\nmethods: [bf16]\n"


@pytest.mark.parametrize("extra, message", [
    ("seeds: 0\n", "key 'seeds' expects list[int]"),
    ("steps: -1\n", "key 'steps' must be positive"),
    ("schedule: {fractoin: 0.5}\n", "unknown key 'schedule.fractoin'"),
    ("schedule: {placement: middle}\n", "key 'schedule.placement' must be one of"),
    ("backend: tpu\n", "key 'backend' must be one of"),
    ("lora: x.safetensors\n", "unknown key 'lora'"),
    ("method_options: {bf16: {clusters: 4}}\n", "key 'method_options.bf16': method 'bf16' has no option 'clusters'"),
])
def test_generate_keys_are_validated_by_name(tmp_path, extra, message):
    path = tmp_path / "g.yaml"
    path.write_text(GOOD + extra)
    with pytest.raises(UserError) as err:
        load_experiment(path)
    assert str(path) in str(err.value) and message in str(err.value)


@pytest.mark.parametrize("text, message", [
    ("name: g\ncommand: generate\nmethods: [bf16]\n", "needs key 'model'"),
    ("name: g\ncommand: generate\nmodel: sora\nmethods: [bf16]\n", "needs key 'model'"),
    ("name: g\ncommand: generate\nmodel: tiny-wan-random\n", "needs non-empty keys 'methods'"),
    ("name: g\ncommand: generate\nmodel: wan22-t2v-a14b\nmethods: [bf16]\n", "set key 'model_path'"),
    (GOOD + "prompts: /nonexistent/prompts.txt\n", "key 'prompts'"),
])
def test_cli_reports_one_error_line_naming_the_key(tmp_path, capsys, text, message):
    path = tmp_path / "g.yaml"
    path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(path)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: ") and message in err


# `diffusers` is any folder's pipeline: its defaults are that class's, not the paper's.
@pytest.mark.parametrize("name", [n for n in MODELS if not n.startswith("tiny-wan") and n != "diffusers"])
def test_real_model_files_carry_the_loaders_paper_settings(name):
    # The paper's settings live in each loader's defaults; the shipped file must agree.
    exp = load_experiment(ROOT / "experiments" / f"{name}.yaml")
    assert exp["model"] == name and exp["model_path"] is None
    defaults = _defaults(name)
    assert (exp["steps"], exp["frames"], exp["height"], exp["width"]) == \
        (defaults.steps, defaults.frames, defaults.height, defaults.width)
    assert exp["schedule"] == {"fraction": 0.25, "refresh_every": 4, "placement": "leading",
                               "after_window": "plain"}


def _defaults(name):
    from vcbench.pipelines import hunyuan, longcat, minimax, wan

    return {"wan22-t2v-a14b": wan.WAN22_DEFAULTS, "hunyuanvideo15": hunyuan.HUNYUAN15_DEFAULTS,
            "minimax-h3": minimax.MINIMAX_DEFAULTS, "longcat-video": longcat.LONGCAT_DEFAULTS}[name]


def test_tiny_wan_file_runs_every_method_on_two_prompts():
    from vcbench.kernels import METHODS
    from vcbench.pipelines.prompts import read_prompts

    exp = load_experiment(ROOT / "experiments" / "tiny-wan.yaml")
    assert exp["model"] == "tiny-wan" and sorted(exp["methods"]) == sorted(METHODS)
    assert len(read_prompts(ROOT / exp["prompts"])) == 2
