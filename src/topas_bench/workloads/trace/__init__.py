"""The versioned JSONL trace of a workload (docs/design.md section 2), and the checks it must pass.

Line 1 is a header, ``{"schema": "topas-bench/trace", "version": 1, "name", "agents":
[{"name", "prefix_tokens"}], "provenance": {"generator", "params", "seed"}}``; every further line
is one task, ``{"id", "workflow", "arrival_s", "stages": [{"id", "agent", "kind", "prompt":
[[key, tokens], ...], "output_tokens", "max_new_tokens", "deps", "delay_s"}]}``. A stage's
`kind`, `max_new_tokens`, `deps` and `delay_s` may be left out (model defaults); provenance keys
other than these three are ignored. Blank lines are skipped. JSON only, never pickle. The
format is documented in docs/workload-format.md; `trace.schema.json` is its JSON Schema
(`workloads.trace.schema`).

Writing is canonical: fields in the order above, compact separators, `params` keys sorted,
tasks sorted by ``(arrival_s, id)``, so equal workloads give byte-identical files. Only valid
workloads are written, and loading reports every problem at once (`TraceError.report`), each
with its 1-based line and field path; `validate` runs the same checks on an in-memory workload,
`validate_file` on a file in bounded memory (no task kept).

The package's modules, in the order a trace flows through them: `read` (bytes to numbered,
decoded JSON lines: gzip, a BOM, duplicate keys), `parse` (the fields, bounds and rows onto the
model), `check` (every problem, named; `dag`: cycles, ancestors; `fast`: clean tasks in one
pass), `stream` (line by line, with what checks across tasks keep), `index` (a run's first tasks
of a big file), and `errors` (problems and the error) beside them all. This module is the
package's face (writing, loading, validating); `workload` runs a file as the registered `trace`
workload, and `schema` checks lines against the published JSON Schema.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import IO, Any

from topas_bench.errors import TopasError
from topas_bench.workloads.model import Task, Workload
from topas_bench.workloads.trace.check import Checker, canon, memory_loc
from topas_bench.workloads.trace.errors import TraceError, TraceProblem
from topas_bench.workloads.trace.parse import MAX_TIME_S, SCHEMA, STAGE, VERSION
from topas_bench.workloads.trace.read import (
    LineError,
    check_trace_path,
    decode,
    json_error,
    open_binary,
    raw_lines,
    text_lines,
)
from topas_bench.workloads.trace.stream import TraceSummary, check_lines

# --- writing ----------------------------------------------------------------------------------


def dumps_workload(w: Workload) -> str:
    """The canonical trace text of `w`; raises `TraceError` if `w` does not pass `validate`."""
    if problems := validate(w):
        raise TraceError(f"workload {w.name!r}", problems)
    provenance = {"generator": w.generator, "params": canon(w.params), "seed": w.seed}
    agents = [{"name": a.name, "prefix_tokens": a.prefix_tokens} for a in w.agents]
    header = {"schema": SCHEMA, "version": VERSION, "name": w.name, "agents": agents}
    rows: list[Any] = [{**header, "provenance": provenance}]
    rows += [_task_row(t) for t in sorted(w.tasks, key=lambda t: (t.arrival_s, t.id))]
    return "".join(_json(r) + "\n" for r in rows)


def dump_workload(w: Workload, path_or_file: str | os.PathLike[str] | IO[str]) -> None:
    """Write `w`'s trace to a path (atomically, UTF-8: a hidden temporary sibling renamed into
    place, removed if the write fails, a full disk say) or to an open text file."""
    text = dumps_workload(w)
    if not isinstance(path_or_file, str | os.PathLike):
        path_or_file.write(text)
        return
    path = Path(path_or_file)
    if not path.parent.is_dir():
        raise TopasError(f"cannot write {path}: {path.parent} is not a directory")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8", newline="")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _task_row(t: Task) -> dict[str, Any]:
    stages = [
        {f: getattr(s, f) for f in STAGE}
        | {"prompt": [[g.key, g.tokens] for g in s.prompt], "deps": list(s.deps)}
        | {"delay_s": float(s.delay_s)}
        for s in t.stages
    ]
    return {"id": t.id, "workflow": t.workflow, "arrival_s": float(t.arrival_s), "stages": stages}


def _json(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


# --- reading ----------------------------------------------------------------------------------


def load_workload(path: str | os.PathLike[str], *, kv_budget_tokens: int | None = None) -> Workload:
    """Read and check a trace file (`read`: gzip, a BOM); raises `TraceError` listing
    every problem."""
    p = check_trace_path(path)
    with open_binary(p) as f:
        return check_lines(raw_lines(f, str(path)), str(path), kv_budget_tokens=kv_budget_tokens)[0]


def validate_file(
    path: str | os.PathLike[str], *, kv_budget_tokens: int | None = None
) -> TraceSummary:
    """Check a trace file in bounded memory (no task is kept; `stream`): its summary, or
    `TraceError` listing every problem."""
    p = check_trace_path(path)

    def fetch(wanted: set[int]) -> Iterator[tuple[int, Any]]:
        with open_binary(p) as f:
            yield from _rows(raw_lines(f, str(path)), wanted)

    with open_binary(p) as f:
        lines = raw_lines(f, str(path))
        budget = kv_budget_tokens
        return check_lines(
            lines, str(path), kv_budget_tokens=budget, keep=False, bounded=True, fetch=fetch
        )[1]


def loads_workload(
    text: str, *, source: str = "<string>", kv_budget_tokens: int | None = None
) -> Workload:
    """Parse and check trace text; tasks come back sorted by ``(arrival_s, id)``."""
    return check_lines(text_lines(text), source, kv_budget_tokens=kv_budget_tokens)[0]


def _rows(
    lines: Iterable[tuple[int, int, bytes | LineError]], wanted: set[int]
) -> Iterator[tuple[int, Any]]:
    for n, _, raw in lines:
        if n in wanted and isinstance(raw, bytes):
            try:
                yield n, decode(raw)
            except LineError:
                continue


def validate(w: Workload, *, kv_budget_tokens: int | None = None) -> list[TraceProblem]:
    """Every problem of an in-memory workload, with field paths like ``tasks[t3].stages[s2]``."""
    checker = Checker(partial(memory_loc, w), kv_budget_tokens)
    checker.workload(w)
    return checker.problems


__all__ = [
    "MAX_TIME_S", "SCHEMA", "VERSION", "TraceError", "TraceProblem", "TraceSummary",
    "dump_workload", "dumps_workload", "json_error", "load_workload", "loads_workload",
    "validate", "validate_file",
]  # fmt: skip
