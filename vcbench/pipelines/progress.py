"""Rich progress: one bar over the run's clips, one over the current clip's steps."""

from __future__ import annotations

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class ClipProgress:
    def __init__(self, clips: int, steps: int, enabled: bool = True) -> None:
        self.steps, self.enabled = steps, enabled
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TimeRemainingColumn(), disable=not enabled)
        self.run_task = self.progress.add_task("clips", total=clips)
        self.clip_task = self.progress.add_task("", total=steps, visible=False)

    def __enter__(self) -> ClipProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def start_clip(self, name: str) -> None:
        self.progress.reset(self.clip_task, total=self.steps, description=f"  {name}", visible=True)

    def step(self, done: int) -> None:
        self.progress.update(self.clip_task, completed=done)

    def skip_clip(self) -> None:
        self.progress.advance(self.run_task)

    def end_clip(self) -> None:
        self.progress.advance(self.run_task)
