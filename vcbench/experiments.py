"""Run a loaded experiment: dispatch on its command to the same functions the CLI calls."""

from __future__ import annotations

from vcbench.config import Experiment
from vcbench.display import print_table


def run(exp: Experiment) -> None:
    s = exp.settings
    if s["command"] == "analyze":
        _analyze(s)
        return
    if s["command"] == "generate":
        _generate(s, str(exp.path))
        return
    raise AssertionError(f"command {s['command']} passed validation but has no runner")


def _analyze(s: dict) -> None:
    from vcbench.analysis import commands

    title = s["description"] or s["name"]
    if s["analysis"] == "expcast":
        print_table(commands.analyze_expcast_command(s["beta"], s["out"]), title=title)
    elif s["analysis"] == "kernel-error":
        table, label = commands.analyze_kernel_error_command(
            s["tensors"], s["methods"] or None, s["method_options"], s["synthetic"], s["out"])
        print_table(table, title=title, caption=label)
    elif s["analysis"] == "token-order":
        table, label = commands.analyze_token_order_command(s["tensors"], s["synthetic"], out=s["out"])
        print_table(table, title=title, caption=label)
    print(f"results in {s['out']}")


def _generate(s: dict, where: str) -> None:
    """The same request `vcbench generate` builds from its flags, then the same function."""
    from pathlib import Path

    from vcbench.errors import UserError
    from vcbench.pipelines.generate import GenerateRequest, run_generate
    from vcbench.pipelines.prompts import demo_prompts_path, read_prompts
    from vcbench.pipelines.registry import MODELS

    if MODELS.get(s["model"]).needs_path and not s["model_path"]:
        raise UserError(f"{where}: model {s['model']} loads local weights: set key 'model_path' "
                        "(in the file, or `vcbench run FILE --set model_path=DIR`)")
    prompts = Path(s["prompts"]) if s["prompts"] else demo_prompts_path()
    if not prompts.is_file():
        raise UserError(f"{where}: key 'prompts': file {prompts} does not exist")
    schedule = {f"schedule_{k}": v for k, v in s["schedule"].items() if v is not None}
    options = {m: {k: tuple(v) if isinstance(v, list) else v for k, v in opts.items()}
               for m, opts in s["method_options"].items()}  # as --option parses them
    req = GenerateRequest(model=s["model"], model_path=Path(s["model_path"]) if s["model_path"] else None,
                          methods=list(s["methods"]), prompts=read_prompts(prompts), seeds=list(s["seeds"]),
                          out=Path(s["out"]), steps=s["steps"], frames=s["frames"], height=s["height"],
                          width=s["width"], options=options, schedule=schedule, backend=s["backend"],
                          device=s["device"], lora_path=Path(s["lora_path"]) if s["lora_path"] else None,
                          compile=s["compile"])
    print(f"clips and manifest in {run_generate(req)}")
