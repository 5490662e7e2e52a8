"""Checking a trace line by line: `check_lines` reads the header, then each task, and keeps
only what the checks across tasks need.

Each task row goes through the fast path (`fast.clean_task`); a row it does not accept
goes through the detailed checker, which names its problems. With ``keep`` the tasks are built
(a run needs them); without it nothing of a task outlives its line. In ``bounded`` mode the
token counts of segment keys, which must agree across the whole file, are not kept in a dict
either: each task's keys go to a `KeyLog` of three integers per (task, key), and only keys whose
hashes disagree are looked at again, by reading their lines a second time. Memory is then the
task ids (for duplicates) plus 16 bytes per key of each task, whatever else the file holds.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import repeat
from typing import Any

import numpy as np

from topas_bench.workloads.model import Task, Workload
from topas_bench.workloads.trace.check import NO_TASKS, Checker, file_loc
from topas_bench.workloads.trace.errors import MAX_PROBLEMS, TraceError, TraceProblem
from topas_bench.workloads.trace.fast import build_task, clean_task, commit
from topas_bench.workloads.trace.parse import Parser
from topas_bench.workloads.trace.read import LineError, decode

#: ``(line number, offset, line bytes or the reason it could not be read)``, non-blank lines
Lines = Iterable[tuple[int, int, bytes | LineError]]


@dataclass(frozen=True)
class TraceSummary:
    """What a valid trace holds."""

    name: str
    tasks: int
    calls: int
    agents: int
    last_arrival_s: float


class KeyLog:
    """Every (key, tokens, line) of a streamed trace but the agents' (checked against the
    header), in arrays: a key by its 64-bit hash, tokens and line as 32-bit integers (a checked
    count is at most 2^31 - 1). `suspect_lines` finds the lines of keys whose token counts may
    disagree."""

    def __init__(self, skip: dict[str, Any]) -> None:
        self.skip = skip
        self.hashes, self.tokens, self.lines = array("q"), array("i"), array("i")

    def add(self, keys: dict[str, int], line: int) -> None:
        """A task's keys and their tokens."""
        if any(k in self.skip for k in keys):
            keys = {k: v for k, v in keys.items() if k not in self.skip}
        self.hashes.extend(map(hash, keys))
        self.tokens.extend(keys.values())
        self.lines.extend(repeat(min(line, 2**31 - 1), len(keys)))

    def suspect_lines(self) -> set[int]:
        """Lines holding a hash whose token counts differ (a real disagreement, or two keys with
        one hash, which the second look tells apart)."""
        if not self.hashes:
            return set()
        h = np.frombuffer(self.hashes, dtype=np.int64)
        order = np.argsort(h, kind="stable")
        h, tok = h[order], np.frombuffer(self.tokens, dtype=np.int32)[order]
        start = np.r_[True, h[1:] != h[:-1]]
        first = np.maximum.accumulate(np.where(start, np.arange(len(h)), 0))
        odd = np.unique(h[tok != tok[first]])
        if not len(odd):
            return set()
        lines = np.frombuffer(self.lines, dtype=np.int32)[order]
        return set(lines[np.isin(h, odd)].tolist())


def check_lines(
    lines: Lines,
    source: str,
    *,
    kv_budget_tokens: int | None = None,
    keep: bool = True,
    bounded: bool = False,
    fetch: Callable[[set[int]], Iterator[tuple[int, Any]]] | None = None,
    fast: bool = True,
) -> tuple[Workload, TraceSummary]:
    """Check a trace's lines; the workload (tasks sorted by ``(arrival_s, id)``; none unless
    `keep`) and a summary, or `TraceError` listing every problem. `fetch(lines)` yields
    ``(line, row)`` again for the given lines (``bounded`` needs it for disagreeing keys).
    ``fast=False`` sends every task through the detailed checker (the reference, for tests)."""
    parser = Parser()
    ck = Checker(lambda *_: (None, ""), kv_budget_tokens)
    log = KeyLog(ck.agent_keys) if bounded else None
    found: list[TraceProblem] = []  # lines that are not JSON, or not read
    more = 0
    header: Workload | None = None
    header_line = 0
    tasks: list[Task] = []
    count = calls = 0
    last = 0.0
    for n, _, raw in lines:
        try:
            if isinstance(raw, LineError):
                raise raw
            row = decode(raw)
        except LineError as e:
            found.append(TraceProblem(n, "task" if header_line else "header", str(e)))
            if not header_line:
                break
            count += 1
            continue
        if not header_line:
            header_line = n
            if (header := parser.header(n, row)) is None:
                break
            ck.loc = partial(file_loc, n)
            ck.header(header)
            continue
        count += 1
        if fast and (local := clean_task(ck, row)) is not None:
            commit(ck, row, n, None if log is not None else local)
            calls += len(row["stages"])
            last = max(last, row["arrival_s"])
            if keep:
                tasks.append(build_task(row))
            if log is not None:
                log.add(local, n)
        else:
            before = len(ck.problems) + len(parser.problems)
            task = parser.task(n, row)
            if task is not None:
                ck.task(n, task)
            if task is not None and len(ck.problems) + len(parser.problems) == before:
                calls += len(task.stages)
                last = max(last, task.arrival_s)
                if keep:
                    tasks.append(task)
            if log is not None:
                log.add({k: v[0] for k, v in ck.keys.items()}, n)
                ck.keys.clear()
        for kept in (found, ck.problems, parser.problems):  # a hopeless file: count, not keep
            if len(kept) > 2 * MAX_PROBLEMS:
                more += len(kept) - MAX_PROBLEMS
                del kept[MAX_PROBLEMS:]
    if not header_line and not found:
        found.append(TraceProblem(1, "header", "empty file; expected a trace header"))
    elif header is not None and count == 0:
        found.append(TraceProblem(header_line, "tasks", NO_TASKS))
    problems = found + parser.problems + ck.problems
    if log is not None and header is not None and (suspects := log.suspect_lines()):
        assert fetch is not None, "a bounded check needs `fetch` to look at keys again"
        problems += _disagreeing_keys(ck, fetch(suspects), {(p.line, p.message) for p in problems})
    if problems or header is None:
        raise TraceError(source, sorted(problems, key=lambda p: p.line or 0), more)
    summary = TraceSummary(header.name, count, calls, len(header.agents), last)
    return _sorted(header, tasks), summary


def _disagreeing_keys(
    ck: Checker, rows: Iterator[tuple[int, Any]], known: set[tuple[int | None, str]]
) -> list[TraceProblem]:
    """The checker's word on keys whose token counts disagree across tasks: the suspect lines
    checked again with one dict of keys (they are few), new key problems only."""
    again = Checker(ck.loc, ck.kv_budget)
    again.agents, again.agent_keys = ck.agents, ck.agent_keys
    parser = Parser()
    for n, row in rows:
        if (task := parser.task(n, row)) is not None:
            again.task(n, task)
    return [
        p
        for p in again.problems
        if p.message.endswith("(equal keys must mean equal tokens)")
        and (p.line, p.message) not in known
    ]


def _sorted(w: Workload, tasks: list[Task]) -> Workload:
    tasks.sort(key=lambda t: (t.arrival_s, t.id))
    return Workload(w.name, w.agents, tuple(tasks), w.params, w.seed, w.generator)
