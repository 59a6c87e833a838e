"""Ctrl-C and SIGTERM: the work in flight unwinds and records itself, then one line says so.

The first SIGINT or SIGTERM raises `Interrupted` (a KeyboardInterrupt) wherever the program is,
so every `finally` and `except KeyboardInterrupt` runs: generate marks its manifest
`interrupted` and the clip in flight stays `partial`; a RunFolder marks itself `interrupted`.
A second signal while that runs exits at once (status 128 + its number) without unwinding
further: every result is written to a temporary name and renamed into place (runs.py,
video_io.py), so stopping between two writes leaves each file old or new, never half.

Code that knows what was left can say it on the exception (`describe`): the CLI's one line
then tells how much was kept and the exact command that resumes it.
"""

from __future__ import annotations

import os
import shlex
import signal
from collections.abc import Callable, Sequence
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; `signum` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_status(e: BaseException) -> int:
    """The shell's convention: 128 + the signal's number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + getattr(e, "signum", signal.SIGINT)


def install() -> Callable[[], None]:
    """Route SIGINT and SIGTERM through `_on_signal`; returns what puts the previous handlers
    back (for a caller that runs the CLI in-process). A signal the parent set to be ignored
    (a shell's background job ignores SIGINT) stays ignored, as it would for any program."""
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    for signum, handler in previous.items():
        if handler is not signal.SIG_IGN:
            signal.signal(signum, _on_signal)

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return restore


def _on_signal(signum: int, frame: FrameType | None) -> None:
    # The next signal, arriving while this one unwinds, stops the process where it stands.
    for s in SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            signal.signal(s, _exit_now)
    raise Interrupted(signum)


def _exit_now(signum: int, frame: FrameType | None) -> None:
    os.write(2, f"interrupted again ({signal.Signals(signum).name}): stopped at once\n".encode())
    os._exit(128 + signum)


def describe(e: BaseException, kept: str, out: str | os.PathLike | None = None) -> None:
    """Say on the exception what the interrupted work kept ("2 of 4 clips finished") and,
    when rerunning resumes it, the folder a rerun must be pointed at."""
    e.vcbench_kept = kept  # type: ignore[attr-defined]
    if out is not None:
        e.vcbench_out = str(out)  # type: ignore[attr-defined]


def message(e: BaseException, argv: Sequence[str]) -> str:
    """The one line the CLI prints: which signal, what was kept, the command to run next."""
    name = signal.Signals(getattr(e, "signum", signal.SIGINT)).name
    kept = getattr(e, "vcbench_kept", None)
    out = getattr(e, "vcbench_out", None)
    args = list(argv)
    if out is not None and not any(a == "--out" or a.startswith("--out=") for a in args):
        args += ["--out", out]  # the default folder is named by the time: name it
    verb = "resume" if out is not None else "rerun"
    what = f"; {kept}" if kept else ""
    return f"interrupted ({name}){what}; {verb} with: {shlex.join(['vcbench', *args])}"


def is_rank0() -> bool:
    """Under torchrun every process is signalled; one of them speaks."""
    return os.environ.get("RANK", "0") == "0"

