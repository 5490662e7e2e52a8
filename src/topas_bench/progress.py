"""What a long call (a run, a sweep) reports as it goes; the command line draws it.

One small interface for `experiment.plan_run`, `experiment.run_plan` and `sweep.run_sweep`, so
the library never prints and the commands need no callbacks of their own.
"""

from __future__ import annotations


class Progress:
    """No-ops by default; the CLI's bars override them (`cli_progress`)."""

    def phase(self, name: str, total: int | None) -> None:
        """A piece of work of `total` steps begins (None: of unknown length)."""

    def update(self, name: str, done: int, label: str = "") -> None:
        """`done` steps of the phase `name` are done; `label`: what was done last."""

    def end(self, name: str) -> None:
        """The phase `name` is over."""

    def note(self, text: str) -> None:
        """A line for the user (a warning, the size estimate of a large run)."""
