"""The `vcbench` command line: each command parses, calls one library function, prints.

No logic lives here. A `UserError` (or a usage mistake) becomes one `error: ...` line on stderr
and exit status 2; `--debug` keeps the traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import typer
from rich.console import Console

from vcbench.errors import UserError

app = typer.Typer(
    name="vcbench",
    help="Fidelity and speed harness for low-bit attention in video diffusion transformers.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
console = Console()
_DEBUG = False


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors.")) -> None:
    global _DEBUG
    _DEBUG = debug


# --- vcbench methods ---------------------------------------------------------------------------

@app.command()
def methods() -> None:
    """List the attention methods: bits of QK/PV, smoothing, backends available here."""
    from vcbench.kernels import method_table

    from rich.table import Table

    table = Table(title="attention methods")
    rows = method_table()
    for col in rows[0]:
        table.add_column(col)
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning user mistakes into one line and exit 2."""
    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    command = typer.main.get_command(app)
    try:
        command.main(args=argv, prog_name="vcbench", standalone_mode=False)
    except click.exceptions.Exit as e:  # --help and friends
        sys.exit(e.exit_code)
    except click.exceptions.Abort:
        print("error: aborted", file=sys.stderr)
        sys.exit(130)
    except click.ClickException as e:
        if debug:
            raise
        print(f"error: {e.format_message()}", file=sys.stderr)
        sys.exit(2)
    except UserError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        sys.exit(130)


def _existing_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist or is not a file")
    return path


if __name__ == "__main__":
    main()
