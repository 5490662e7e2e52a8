"""The trace format's JSON Schema (`trace.schema.json`, docs/workload-format.md), line by line.

The schema is the format's published contract: line 1 must match ``$defs/header``, every other
non-blank line ``$defs/task``. `schema_problems` reports every mismatch with its line and field,
in the `TraceProblem` form the trace checks use. `workloads validate` does not run it (about
11 ms a task line with `jsonschema`, 50 times the checks' own cost): the checks refuse every line
the schema refuses, and more (`tests/test_trace_file.py` holds them to that on mutated lines).
"""

from __future__ import annotations

import functools
import json
from importlib.resources import files
from typing import Any

from topas_bench.workloads.trace.errors import TraceProblem
from topas_bench.workloads.trace.read import json_error

SCHEMA_FILE = "trace.schema.json"


@functools.cache
def schema() -> dict[str, Any]:
    text = (files("topas_bench.workloads.trace") / SCHEMA_FILE).read_text(encoding="utf-8")
    found: dict[str, Any] = json.loads(text)
    return found


@functools.cache
def _validators() -> tuple[Any, Any]:
    import jsonschema

    full = {k: v for k, v in schema().items() if k != "oneOf"}
    cls = jsonschema.validators.validator_for(full)
    return cls({**full, "$ref": "#/$defs/header"}), cls({**full, "$ref": "#/$defs/task"})


def schema_problems(text: str) -> list[TraceProblem]:
    """Every line of trace `text` that does not match the schema, with its field path."""
    header, task = _validators()
    problems: list[TraceProblem] = []
    first = True
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        what = "header" if first else "task"
        validator = header if first else task
        first = False
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            problems.append(TraceProblem(n, what, f"invalid JSON: {e.msg} (column {e.colno})"))
            continue
        except (ValueError, RecursionError) as e:  # a 5,000-digit integer; nesting too deep
            problems.append(TraceProblem(n, what, f"invalid JSON: {json_error(e)}"))
            continue
        for err in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
            path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
            field = (("header" if what == "header" else "") + path).lstrip(".") or what
            problems.append(TraceProblem(n, field, err.message))
    if first:
        problems.append(TraceProblem(1, "header", "empty file; expected a trace header"))
    return problems
