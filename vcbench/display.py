"""Terminal output shared by the commands: DataFrames as rich tables, and progress bars."""

from __future__ import annotations

import math
from contextlib import contextmanager

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


def _cell(value) -> str:
    """A table cell as text. Escaped: rich would read a variant's "[hadamard_qk=True]" as
    markup and drop it, printing two different rows under one name."""
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        return f"{value:.4g}"
    return escape(str(value))


def print_table(df: pd.DataFrame, title: str | None = None, caption: str | None = None,
                compact: bool = False) -> None:
    """`compact`: no column rules (a wide listing that should fit 100 columns)."""
    from rich import box

    table = Table(title=None if title is None else escape(title),
                  caption=None if caption is None else escape(caption),
                  **({"box": box.SIMPLE_HEAD, "collapse_padding": True, "pad_edge": False}
                     if compact else {}))
    for col in df.columns:
        numeric = pd.api.types.is_numeric_dtype(df[col]) and not pd.api.types.is_bool_dtype(df[col])
        table.add_column(escape(str(col)), justify="right" if numeric else "left", no_wrap=True)
    for row in df.itertuples(index=False):
        table.add_row(*(_cell(v) for v in row))
    # Never crop numbers to fit a narrow terminal: widen the output instead.
    needed = Measurement.get(console, console.options.update_width(10_000), table).maximum
    out = console if needed <= console.width else Console(width=needed, file=console.file)
    out.print(table)


@contextmanager
def progress_bar(description: str, total: int):
    """A progress bar on stderr; yields a function that advances it by one."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)
