"""What the trace checks report: problems with their line and field, and the error that holds
them (`TraceError`: str() is one line, `report()` one line per problem)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from topas_bench.errors import TopasError

#: Problems a `TraceError` keeps (the first ones, by line); past this it counts the rest, so a
#: hopeless file of a million lines does not hold a million messages.
MAX_PROBLEMS = 1000


@dataclass(frozen=True)
class TraceProblem:
    """One problem: file line (``None`` for an in-memory workload), field path and message."""

    line: int | None
    field: str
    message: str

    def format(self, source: str) -> str:
        at = source if self.line is None else f"{source}:{self.line}"
        return f"{at}: {self.field}: {self.message}"


class TraceError(TopasError):
    """An invalid trace or workload; str() is a one-line summary, `report()` lists every problem
    (the first `MAX_PROBLEMS`, then how many more)."""

    def __init__(self, source: str, problems: Sequence[TraceProblem], more: int = 0) -> None:
        self.source, self.problems = source, list(problems[:MAX_PROBLEMS])
        self.more = more + max(len(problems) - MAX_PROBLEMS, 0)
        first = self.problems[0] if problems else TraceProblem(None, "-", "-")
        at = first.field if first.line is None else f"line {first.line}, {first.field}"
        n = len(self.problems) + self.more
        super().__init__(f"{source}: {n:,} problem{'s' * (n != 1)}; first: {at}: {first.message}")

    @property
    def count(self) -> int:
        return len(self.problems) + self.more

    def __reduce__(self) -> tuple[Any, ...]:  # picklable, e.g. across a process pool
        return (type(self), (self.source, self.problems, self.more))

    def report(self) -> str:
        lines = [p.format(self.source) for p in self.problems]
        if self.more:
            lines.append(f"{self.source}: ... and {self.more:,} more problems")
        return "\n".join(lines)
