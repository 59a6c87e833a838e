"""The report's PNG figures (matplotlib, Agg: no display needed).

Each function draws one figure from a table the report also writes as CSV, so a figure never
shows a number the tables do not hold. Figures are written atomically (rendered to memory,
then `atomic_write_bytes`).
"""

from __future__ import annotations

import io
import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: reports are written on machines without a display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from vcbench.report.tables import REFERENCE, higher_is_better, label, method_order  # noqa: E402
from vcbench.runs import atomic_write_bytes  # noqa: E402

# How a metric is named on an axis, and its unit (None: a plain number).
METRIC_NAMES = {"psnr": ("PSNR", "dB"), "ssim": ("SSIM", None), "lpips": ("LPIPS", None),
                "subject_consistency": ("subject consistency", None),
                "imaging_quality": ("imaging quality", None)}


def axis_label(metric: str) -> str:
    """'PSNR (dB, higher is better)': the name, unit and which way is better, read from the
    metrics' own declaration so an axis never disagrees with the table's ranking."""
    name, unit = METRIC_NAMES.get(metric, (metric, None))
    better = "higher" if higher_is_better(metric) else "lower"
    return f"{name} ({unit + ', ' if unit else ''}{better} is better)"


def save(fig, path: Path) -> Path:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def _bars(ax, names, values, errors=None, color="#4878a8", hatch=None):
    x = np.arange(len(names))
    err = None if errors is None else [0 if not math.isfinite(e) else e for e in errors]
    ax.bar(x, values, yerr=err, capsize=3, color=color, hatch=hatch, edgecolor="white" if hatch else None)
    ax.set_xticks(x, names, rotation=35, ha="right", fontsize=8)


def metric_per_model(long: pd.DataFrame, metric: str, path: Path, note: str) -> Path | None:
    """Mean of one metric per method with its 95% CI over clips, one panel per model. Points,
    not bars: PSNR has no meaningful zero, and the differences are what the table is about.
    The bf16 reference (no value against itself) is left out."""
    data = long[(long.metric == metric) & np.isfinite(long["mean"])]
    models = list(dict.fromkeys(data.model))
    if not models:
        return None
    widest = max(int((data.model == m).sum()) for m in models)
    fig, axes = plt.subplots(1, len(models), figsize=((1.5 + 0.75 * widest) * len(models), 3.8),
                             squeeze=False, layout="constrained")
    for ax, model in zip(axes[0], models, strict=True):
        rows = data[data.model == model].copy()
        rows["order"] = [method_order(m) for m in rows.method]
        rows = rows.sort_values(["order", "variant"])
        x = np.arange(len(rows))
        err = [0 if not math.isfinite(e) else e for e in rows.ci95_half]
        ax.errorbar(x, rows["mean"], yerr=err, fmt="o", capsize=4, color="#4878a8")
        for i, (mean, n) in enumerate(zip(rows["mean"], rows.n, strict=True)):
            ax.annotate(f"{mean:.4g}\nn={n}", (i, mean), ha="left", va="center", fontsize=7,
                        xytext=(6, 0), textcoords="offset points")
        ax.set_xticks(x, [label(m, v) for m, v in zip(rows.method, rows.variant, strict=True)],
                      rotation=35, ha="right", fontsize=8)
        ax.set_xlim(-0.5, len(rows) - 0.2)
        ax.set_title(model, fontsize=10)
        ax.set_ylabel(f"{axis_label(metric)}\nvs {REFERENCE}: mean, 95% CI", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(note, fontsize=8)
    return save(fig, path)


def _with_fidelity_label(rows: pd.DataFrame, names: list[str] | None = None) -> list[str]:
    """Bar names, each run on a fidelity-only backend marked with its label (the NVFP4
    kernel's time is NVFP4 computed on 16-bit tensor cores, no FP4 kernel's)."""
    from vcbench.kernels.backends import fidelity_label

    names = list(rows.method) if names is None else names
    impls = rows.implementation if "implementation" in rows else [""] * len(names)
    marks = [fidelity_label(str(i)) for i in impls]
    return [f"{n}\n({m})" if m else n for n, m in zip(names, marks, strict=True)]


def speedup_bars(speed: pd.DataFrame, clip: pd.DataFrame, path: Path, note: str,
                 projected: pd.DataFrame | None = None) -> Path | None:
    """Attention speedup over bf16 per GPU (from timeit), clip speedup (from generate) and the
    projected clip speedup (from project-clip), each panel titled with what it is."""
    panels = []
    for (gpu, inputs), rows in (speed.groupby(["gpu", "inputs"], sort=False) if len(speed) else []):
        panels.append((f"attention: {gpu}\n{inputs}", _with_fidelity_label(rows),
                       list(rows.speedup_vs_bf16), False))
    for model, rows in (clip.groupby("model", sort=False) if len(clip) else []):
        rows = rows[np.isfinite(rows.speedup_vs_bf16)]  # emulated clips have no speedup
        if rows.empty:
            continue
        where = ", ".join(sorted({f"{b} on {d}" for b, d in zip(rows.backend, rows.device, strict=False)}))
        panels.append((f"clip wall clock: {model}\n({where})",
                       _with_fidelity_label(rows, [label(m, v) for m, v in
                                                   zip(rows.method, rows.variant, strict=False)]),
                       list(rows.speedup_vs_bf16), False))
    for (_, text), rows in (projected.groupby(["run", "label"], sort=False)
                              if projected is not None and len(projected) else []):
        rows = rows[np.isfinite(rows.clip_speedup_vs_bf16)]
        if rows.empty:
            continue
        base = rows.implementation[rows.method == REFERENCE]
        bf16 = f"; {REFERENCE} = {base.iloc[0]}" if len(base) else ""
        panels.append((f"clip wall clock, PROJECTED ({rows.model.iloc[0]}{bf16})\n"
                       + textwrap.fill(text, 58), list(rows.method), list(rows.clip_speedup_vs_bf16),
                       True))
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), 4.0), squeeze=False,
                             layout="constrained")
    for ax, (title, names, values, projected_panel) in zip(axes[0], panels, strict=False):
        # Projected clip times: hatched orange, so they never read as a measured clip.
        _bars(ax, names, values, color="#f28e2b" if projected_panel else "#59a14f",
              hatch="//" if projected_panel else None)
        ax.axhline(1.0, color="k", lw=0.8, ls=":")
        for i, v in enumerate(values):
            ax.annotate(f"{v:.2f}x", (i, v), ha="center", va="bottom", fontsize=7)
        ax.set_title(title, fontsize=9 if title.count("\n") < 2 else 7)
        ax.set_ylabel(f"speedup over {REFERENCE} (higher is better)")
    fig.suptitle(textwrap.fill(note, 75 * len(panels)), fontsize=8)
    return save(fig, path)


def frame_strip(rows: list[tuple[str, np.ndarray]], indices: list[int], path: Path,
                title: str) -> Path:
    """Paper appendix E: one clip per row, the same frame indices in every row; the row label
    carries that clip's PSNR."""
    cols = len(indices)
    h, w = rows[0][1].shape[1:3]
    fig, axes = plt.subplots(len(rows), cols, squeeze=False, layout="constrained",
                             figsize=(1.9 * cols * w / max(h, w) + 1.5, 1.9 * len(rows) * h / max(h, w) + 0.6))
    for r, (name, frames) in enumerate(rows):
        for c, t in enumerate(indices):
            ax = axes[r][c]
            ax.imshow(frames[t].astype(np.uint8) if frames.shape[-1] != 1 else frames[t, ..., 0],
                      cmap=None if frames.shape[-1] != 1 else "gray")
            ax.set_xticks([])
            ax.set_yticks([])
            if r == 0:
                ax.set_title(f"frame {t}", fontsize=8)
            if c == 0:
                ax.set_ylabel(name, fontsize=7, rotation=0, ha="right", va="center")
    fig.suptitle(title, fontsize=8)
    return save(fig, path)


def expcast_figure(byte_map: pd.DataFrame, path: Path, note: str) -> Path:
    """Figure 5: the byte each path writes over one doubling, and ExpCast's relative error."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    a.step(byte_map.f, byte_map.cast_byte, where="mid", label="exp2 then cast (E4M3)")
    a.step(byte_map.f, byte_map.expcast_byte, where="mid", label="ExpCast-FP8 (one FMA)", ls="--")
    a.set_xlabel("fractional part f of the log2 score")
    a.set_ylabel("E4M3 byte")
    a.legend(fontsize=7)
    a.set_title("byte map over one doubling", fontsize=9)
    b.plot(byte_map.f, 100 * byte_map.expcast_rel_error, color="#e15759")
    b.axhline(0, color="k", lw=0.6)
    b.set_xlabel("fractional part f of the log2 score")
    b.set_ylabel("relative error of decoded P (%; 0 is exact)")
    b.set_title("ExpCast-FP8 relative error", fontsize=9)
    fig.suptitle(note, fontsize=8)
    return save(fig, path)


def kernel_error_figure(table: pd.DataFrame, path: Path, note: str) -> Path:
    """Figure 3a: the probability term and the value term of each method's output error."""
    x = np.arange(len(table))
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(table)), 3.6))
    ax.bar(x - 0.2, table.prob_term, 0.4, label="probability term ||(P-P_q)V|| / ||O||")
    ax.bar(x + 0.2, table.value_term, 0.4, label="value term ||P_q(V-V_q)|| / ||O||")
    ax.set_xticks(x, table.method, rotation=35, ha="right", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("relative L2 error (lower is better)")
    ax.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    fig.suptitle(note, fontsize=8, y=1.02)
    return save(fig, path)


def token_order_figure(table: pd.DataFrame, path: Path, note: str) -> Path:
    """Table 1 / Figure 4: block-energy share and value error under each token order."""
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    orders = list(dict.fromkeys(table.order))
    x = np.arange(len(orders))
    for offset, had in ((-0.2, False), (0.2, True)):
        rows = table[table.hadamard_v == had].set_index("order").reindex(orders)
        tag = "with V Hadamard" if had else "no rotation"
        a.bar(x + offset, rows.energy_share, 0.4, label=tag)
        b.bar(x + offset, rows.value_error, 0.4, label=tag)
    for ax, ylabel in ((a, "block-energy share removed (Eq. 5;\nhigher is better)"),
                       (b, "relative value error (lower is better)")):
        ax.set_xticks(x, orders, fontsize=8)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2)
    fig.suptitle(note, fontsize=8)
    fig.subplots_adjust(wspace=0.3)
    return save(fig, path)


def fusion_figure(table: pd.DataFrame, path: Path, note: str) -> Path:
    """Figure 7: the chain's time per call at each rung, each bar labelled with its factor
    over the rung before and over the eager chain; a rung not built is named, not drawn."""
    fig, ax = plt.subplots(figsize=(8, 3.4))
    x = np.arange(len(table))
    ms = table.ms.astype(float)
    ax.bar(x, ms.fillna(0), 0.6, color="#4c72b0")
    top = np.nanmax(ms) if ms.notna().any() else 1.0
    for i, row in enumerate(table.itertuples()):
        if math.isnan(row.ms):
            ax.text(i, 0.02 * top, "not built", ha="center", va="bottom", fontsize=7, rotation=90)
        elif i == 0:
            ax.text(i, row.ms, f"{row.ms:.2f} ms", ha="center", va="bottom", fontsize=7)
        else:
            ax.text(i, row.ms, f"{row.ms:.2f} ms\n{row.step_factor:.2f}x, {row.cumulative_factor:.2f}x total",
                    ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [textwrap.fill(s, 18) for s in table.stage], fontsize=7)
    ax.set_ylabel("preprocessing + grouping, ms per call")
    ax.set_ylim(0, top * 1.3)
    fig.suptitle(note, fontsize=8)
    return save(fig, path)
