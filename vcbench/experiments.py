"""Run a loaded experiment: dispatch on its command to the same functions the CLI calls."""

from __future__ import annotations

from vcbench.config import Experiment
from vcbench.display import print_table


def run(exp: Experiment) -> None:
    s = exp.settings
    if s["command"] == "analyze":
        _analyze(s)
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
