"""What a run of a trace file needs without holding all of it: `scan` reads the file once for
the task count, the last arrival (the file's rate) and which tasks come first by ``(arrival_s,
id)``, then checks only those in full.

`run -w FILE -n N` with N below the file's task count runs the file's first N tasks. Those are
checked as `workloads validate` checks a file (every field, the DAG, the keys among them). Of
every other line only what choosing them and the file's rate need is read: its `id` (unique
in the file) and `arrival_s` (a time as the format allows), from the line's start when it is
in the canonical form `workloads export` writes (then the rest of the line is not parsed),
else from the line's JSON. Memory: the ids and the N tasks, whatever the file's size.
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from topas_bench.workloads.model import Workload
from topas_bench.workloads.trace.errors import MAX_PROBLEMS, TraceError, TraceProblem
from topas_bench.workloads.trace.parse import MISSING, Parser, bad, bad_name, bad_secs
from topas_bench.workloads.trace.read import (
    LineError,
    decode,
    lone_surrogate,
    open_binary,
    raw_lines,
    show,
)
from topas_bench.workloads.trace.stream import check_lines

# `{"id":"...","workflow":"...","arrival_s":<number>,` as `dumps_workload` starts a task line
_STRING = rb'"(?:[^"\\\x00-\x1f]|\\.)*"'
_NUMBER = rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?"
_CANONICAL = re.compile(
    rb'\{"id":('
    + _STRING
    + rb'),"workflow":'
    + _STRING
    + rb',"arrival_s":('
    + _NUMBER
    + rb'),"stages":\['
)


@dataclass(frozen=True)
class TraceScan:
    """A trace file's task count and last arrival, and (when fewer than all) its first tasks."""

    tasks: int
    last_arrival_s: float
    #: the header's workload with the `keep` first tasks, checked in full; None when `keep`
    #: covers every task (then the caller loads the whole file, as `load_workload`)
    first: Workload | None


def scan(path: Path, keep: int) -> TraceScan:
    """Read `path` once for its count, last arrival and `keep` (at least 1) first tasks (module
    docstring); `TraceError` for any problem in what was read."""
    keep = max(keep, 1)
    source = str(path)
    problems: list[TraceProblem] = []
    header: tuple[int, bytes] | None = None
    ids: set[str] = set()
    chosen: list[tuple[float, str, int]] = []  # a max-heap (negated) of the `keep` first
    last = 0.0
    with open_binary(path) as f:
        for n, _, raw in raw_lines(f, source):
            if isinstance(raw, LineError):
                problems.append(TraceProblem(n, "task" if header else "header", str(raw)))
                if header is None:
                    break
                continue
            if header is None:
                header = (n, raw)
                _check_header(n, raw, source)
                continue
            key = _task_key(n, raw, problems)
            if key is None:
                continue
            arrival, tid = key
            if tid in ids:
                message = f"duplicate task id {show(tid)} (an earlier line has it)"
                problems.append(TraceProblem(n, "id", message))
                continue
            ids.add(tid)
            last = max(last, arrival)
            item = (-arrival, _Desc(tid), n)
            if len(chosen) < keep:
                heapq.heappush(chosen, item)
            elif keep and item > chosen[0]:
                heapq.heapreplace(chosen, item)
            if len(problems) > MAX_PROBLEMS:
                break
    if problems:
        raise TraceError(source, problems)
    if len(ids) <= keep and header is not None and ids:  # all of them: the caller loads all
        return TraceScan(len(ids), last, None)
    wanted = {n for *_, n in chosen} | ({header[0]} if header else set())
    first = check_lines(_picked(path, wanted), source)[0]
    return TraceScan(len(ids), last, first)


def _check_header(n: int, raw: bytes, source: str) -> None:
    """`TraceError` for a first line that is not a good trace header, as `workloads validate`
    reports it (a UTF-16 or binary file is refused there, on its first line)."""
    parser = Parser()
    try:
        parser.header(n, decode(raw))
    except LineError as e:
        parser.problems.append(TraceProblem(n, "header", str(e)))
    if parser.problems:
        raise TraceError(source, parser.problems)


class _Desc(str):
    """A task id that sorts backwards, for the max-heap of the first tasks (ties of arrival:
    the larger id is dropped first)."""

    def __lt__(self, other: str) -> bool:
        return str.__gt__(self, other)

    def __gt__(self, other: str) -> bool:
        return str.__lt__(self, other)


def _picked(path: Path, wanted: set[int]) -> Iterator[tuple[int, int, bytes | LineError]]:
    with open_binary(path) as f:
        for n, offset, raw in raw_lines(f, str(path)):
            if n in wanted:
                yield n, offset, raw


def _task_key(n: int, raw: bytes, problems: list[TraceProblem]) -> tuple[float, str] | None:
    """A task line's ``(arrival_s, id)``, or None with its problems noted."""
    if (m := _CANONICAL.match(raw)) is not None:
        try:
            tid, arrival = json.loads(m[1]), float(m[2])
        except ValueError:  # not UTF-8 in the id, say: the general way names it
            pass
        else:
            if tid and not bad_secs(arrival) and lone_surrogate(tid) is None:
                return arrival, tid
    try:
        row: Any = decode(raw)
    except LineError as e:
        problems.append(TraceProblem(n, "task", str(e)))
        return None
    if not isinstance(row, dict):
        problems.append(TraceProblem(n, "task", bad("a JSON object", row)))
        return None
    tid, arrival = row.get("id", MISSING), row.get("arrival_s", MISSING)
    found = [("id", bad_name(tid)), ("arrival_s", bad_secs(arrival))]
    problems += [TraceProblem(n, field, m) for field, m in found if m]
    return None if any(m for _, m in found) else (float(arrival), tid)
