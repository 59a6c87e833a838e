"""The analyze commands: inputs in, a run folder with tables and JSON out.

Each function writes its run folder (manifest, CSV + Parquet, result.json), optionally a
`--json` copy, and returns the table for the CLI to print.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from vcbench.analysis.variants import parse_variant
from vcbench.display import progress_bar
from vcbench.runs import RunFolder, default_run_dir, write_json
from vcbench.tensors import AttentionTensors, load_tensors


def _out(out: str | Path | None, command: str) -> Path:
    return Path(out) if out is not None else default_run_dir(command)


def _finish(run: RunFolder, name: str, table: pd.DataFrame, result: dict[str, Any],
            json_path: str | Path | None) -> None:
    run.table(name, table)
    run.json("result.json", result)
    if json_path is not None:
        write_json(json_path, result)


def input_tensors(tensors: str | Path | None, synthetic: dict[str, Any] | None = None
                  ) -> tuple[AttentionTensors, str]:
    """Load a tensors file, or make synthetic ones; the label says which."""
    if tensors is not None:
        t = load_tensors(tensors)
        return t, str(tensors)
    from vcbench.analysis.synthetic import synthetic_qkv

    s = {"seed": 0, "heads": 2, "grid": [8, 32, 32], "head_dim": 128, **(synthetic or {})}
    t = synthetic_qkv(seed=s["seed"], heads=s["heads"], grid=tuple(s["grid"]), head_dim=s["head_dim"])
    return t, f"synthetic (seed {s['seed']}, {s['heads']} heads, grid {tuple(s['grid'])})"


def analyze_expcast_command(beta: float, out=None, json_path=None) -> pd.DataFrame:
    from vcbench.analysis.expcast import analyze_expcast, byte_map

    result = analyze_expcast(beta)
    with RunFolder.create(_out(out, "analyze-expcast"), "analyze expcast", {"beta": beta}) as run:
        curve = pd.DataFrame(byte_map(beta))
        run.table("byte_map", curve)
        _finish(run, "expcast", pd.DataFrame([result]), result, json_path)
        run.record("expcast", "ok")
    return pd.DataFrame({"quantity": list(result), "value": list(result.values())})


def analyze_kernel_error_command(tensors=None, methods: list[str] | None = None,
                                 options: dict[str, dict] | None = None, synthetic=None,
                                 out=None, json_path=None) -> tuple[pd.DataFrame, str]:
    from vcbench.analysis.kernel_error import kernel_error_table
    from vcbench.kernels import list_methods

    methods = methods or list_methods()
    for m in methods:
        parse_variant(m)  # unknown names and flags fail before any work
    t, label = input_tensors(tensors, synthetic)
    config = {"tensors": label, "methods": methods, "options": options or {},
              "shape": list(t.q.shape), "grid": t.grid}
    with RunFolder.create(_out(out, "analyze-kernel-error"), "analyze kernel-error", config) as run:
        with progress_bar("kernel error", len(methods)) as advance:
            table = kernel_error_table(t.q, t.k, t.v, methods, grid=t.grid, options=options,
                                       progress=advance)
        for m in methods:
            run.record(m, "ok")
        result = {"tensors": label, "rows": table.to_dict(orient="records")}
        _finish(run, "kernel_error", table, result, json_path)
    return table, label


def analyze_token_order_command(tensors=None, synthetic=None, clusters: int = 32, iters: int = 10,
                                out=None, json_path=None) -> tuple[pd.DataFrame, str]:
    from vcbench.analysis.token_order import token_order_table
    from vcbench.kernels.spec.vsmooth import ORDERS

    t, label = input_tensors(tensors, synthetic)
    orders = ["none"] + [o for o in ORDERS if o != "cube" or t.grid is not None]
    config = {"tensors": label, "shape": list(t.v.shape), "grid": t.grid, "clusters": clusters,
              "iters": iters}
    with RunFolder.create(_out(out, "analyze-token-order"), "analyze token-order", config) as run:
        with progress_bar("token orders", 2 * len(orders)) as advance:
            table = token_order_table(t.v, grid=t.grid, orders=orders, clusters=clusters,
                                      iters=iters, progress=advance)
        run.record("token-order", "ok")
        result = {"tensors": label, "rows": table.to_dict(orient="records")}
        _finish(run, "token_order", table, result, json_path)
    return table, label


def analyze_fusion_command(shape: str, seconds: str, out=None, json_path=None
                           ) -> tuple[pd.DataFrame, str]:
    import torch

    from vcbench.analysis.fusion import METHOD, fusion_table
    from vcbench.errors import UserError
    from vcbench.timing.timeit import PRESETS

    if shape not in PRESETS:
        raise UserError(f"unknown shape {shape!r} (presets: {', '.join(PRESETS)})")
    try:
        warmup_s, window_s = (float(x) for x in seconds.split(","))
    except ValueError:
        raise UserError(f"--seconds expects WARMUP,WINDOW, got {seconds!r}") from None
    if not torch.cuda.is_available():
        raise UserError("analyze fusion needs a CUDA GPU (it times kernels with CUPTI); "
                        "this machine has none")
    config = {"method": METHOD, "shape": list(PRESETS[shape]), "preset": shape,
              "warmup_s": warmup_s, "window_s": window_s, "device": torch.cuda.get_device_name()}
    with RunFolder.create(_out(out, "analyze-fusion"), "analyze fusion", config) as run:
        with progress_bar("rungs", 5) as advance:
            table, label = fusion_table(PRESETS[shape], warmup_s, window_s, progress=advance)
        run.record("fusion", "ok")
        result = {"label": label, "device": config["device"], "rows": table.to_dict(orient="records")}
        _finish(run, "fusion", table, result, json_path)
    return table, label
