"""Where the commands print: a rich console sized for logs, and a job's live progress on it."""

from __future__ import annotations

from typing import Any

from envace.jobs import Reporter


def new_console():
    from rich.console import Console  # rich loads when a command prints, not for `envace --help`

    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 140  # logs and pipes: keep the tables' columns readable instead of 80 wide
    return console


class LiveReporter(Reporter):
    """A progress bar with the episodes' outcomes; in a log (no terminal) one line per engine step."""

    def __init__(self, console) -> None:
        self.console = console
        self.progress, self.bar, self.done = None, None, {"n": 0, "ok": 0, "steps": 0}

    def say(self, text: str) -> None:
        self.console.print(text, markup=False)

    def begin(self, total: int) -> None:
        self.done = {"n": 0, "ok": 0, "steps": 0}
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                                 TextColumn("{task.fields[status]}"), console=self.console)
        self.progress.start()
        self.bar = self.progress.add_task("episodes", total=total, status="")

    def step(self, waiting: int, tokens: int) -> None:
        self.done["steps"] += 1
        status = f"step {self.done['steps']}: {waiting} episode(s) generating, {tokens} tokens so far"
        self.progress.update(self.bar, status=status)
        if not self.console.is_terminal:
            self.console.print(status)

    def episode(self, row: dict[str, Any]) -> None:
        self.done["n"] += 1
        self.done["ok"] += bool(row["success"])
        self.progress.update(self.bar, advance=1, status=f"success {self.done['ok']}/{self.done['n']}")
        super().episode(row)

    def end(self) -> None:
        self.progress.stop()
