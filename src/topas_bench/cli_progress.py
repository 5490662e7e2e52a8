"""Rich progress bars on stderr for the library's `progress.Progress` reports.

`RunBars` (`run`): a transient spinner while a large workload is sampled (only on a
terminal), then one bar per scheduler's cell. `SweepBars` (`sweep`): a bar with an ETA per
phase (capacity measurement, cells) and the last thing done. `ImportBars` (`trace import`): a
bar per import phase, on a terminal only, gone when done.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from topas_bench import progress


class _Bars(progress.Progress):
    """Named bars of one rich `Progress`, started with the first and stopped on exit."""

    def __init__(self, console: Console, bars: Progress) -> None:
        self._console = console
        self._p = bars
        self._bars: dict[str, TaskID] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._p.live.is_started:
            self._p.stop()

    def phase(self, name: str, total: int | None) -> None:
        if not self._p.live.is_started:
            self._p.start()
        self._bars[name] = self._p.add_task(name, total=total, last="")

    def update(self, name: str, done: int, label: str = "") -> None:
        self._p.update(self._bars[name], completed=done, last=label)

    def note(self, text: str) -> None:
        self._console.print(text, markup=False)


class RunBars(_Bars):
    def __init__(self, console: Console) -> None:
        super().__init__(console, Progress(
            TextColumn("{task.description:<12}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("tasks"), TimeElapsedColumn(), console=console, transient=False,
        ))  # fmt: skip
        self._sampling = Progress(
            TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
            transient=True, disable=not console.is_terminal,
        )  # fmt: skip

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._sampling.live.is_started:
            self._sampling.stop()
        super().__exit__(kind, e, tb)

    def phase(self, name: str, total: int | None) -> None:
        if total is not None:
            super().phase(name, total)
            return
        self._sampling.start()  # a spinner while the workload is sampled
        self._sampling.add_task(name, total=None)

    def end(self, name: str) -> None:
        if name not in self._bars and self._sampling.live.is_started:
            self._sampling.stop()


class SweepBars(_Bars):
    def __init__(self, console: Console) -> None:
        super().__init__(console, Progress(
            TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            TextColumn("{task.fields[last]}"), console=console,
        ))  # fmt: skip


class ImportBars(_Bars):
    """The importer's `progress(phase, done, total)` callback: a bar per phase (read, convert,
    replicate, check, write), added when the phase first reports."""

    def __init__(self, console: Console) -> None:
        super().__init__(console, Progress(
            TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal,
        ))  # fmt: skip

    def __call__(self, phase: str, done: int, total: int) -> None:
        if phase not in self._bars:
            self.phase(phase, total)
        self._p.update(self._bars[phase], completed=done, total=total)
