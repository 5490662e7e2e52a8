"""Recorded MetaGPT call traces: one LLM call per JSONL line (tests/data/metagpt's recordings and
the recorder's output), parsed and checked. Fields: ``id`` (0, 1, ... in call order), ``role``,
``action``, ``t_start``/``t_end`` (s), ``system_tokens``, ``rest_tokens``, ``n_messages``,
``completion_tokens``, ``lcp_tokens_with_prev_call_of_same_role``, ``depends_on`` (ids of
earlier calls whose output the prompt contains); other fields are ignored. Every malformed line
is reported, with its line number and field, in one `TraceError`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topas_bench.errors import TopasError, not_utf8
from topas_bench.workloads.trace import TraceError, TraceProblem, json_error

_INTS = ("id", "system_tokens", "rest_tokens", "n_messages", "completion_tokens")
_LCP = "lcp_tokens_with_prev_call_of_same_role"


@dataclass(frozen=True)
class Call:
    """One recorded LLM call (the fields this module uses)."""

    id: int
    role: str
    action: str
    t_start: float
    t_end: float
    system_tokens: int
    rest_tokens: int
    completion_tokens: int
    lcp: int
    depends_on: tuple[int, ...]

    @property
    def prompt_tokens(self) -> int:
        return self.system_tokens + self.rest_tokens


#: `progress(phase, done, total)`: how far a long import is (`trace import` draws a bar from it).
Progress = Callable[[str, int, int], None]

#: Report progress every this many lines or calls (and at the end of a phase).
TICK = 2048


def load_calls(path: str | os.PathLike[str], progress: Progress | None = None) -> list[Call]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(str(path), [TraceProblem(None, "file", not_utf8(e))]) from e
    except OSError as e:
        raise TopasError(f"{path}: cannot read call trace: {e.strerror or e}") from e
    return parse_calls(text, source=str(path), progress=progress)


def parse_calls(
    text: str, *, source: str = "<string>", progress: Progress | None = None
) -> list[Call]:
    """Parse and check a recorded call trace; raises `TraceError` listing every problem."""
    problems: list[TraceProblem] = []
    calls: list[Call] = []
    seen = _Seen()
    lines = text.split("\n")
    for n, line in enumerate(lines, start=1):
        if progress is not None and n % TICK == 0:
            progress("read", n, len(lines))
        if not line.strip():
            continue
        found = _call(n, line, seen, problems)
        if found is not None:
            calls.append(found)
    if progress is not None:
        progress("read", len(lines), len(lines))
    if not calls and not problems:
        problems.append(TraceProblem(1, "file", "no calls: expected one JSON object per line"))
    if problems:
        raise TraceError(source, problems)
    return calls


@dataclass
class _Seen:
    """Call ids read so far: id -> line, and the highest (ids must increase)."""

    lines: dict[int, int] = field(default_factory=dict)
    top: int = -1


def _call(n: int, line: str, seen: _Seen, problems: list[TraceProblem]) -> Call | None:
    def bad(field: str, message: str) -> None:
        problems.append(TraceProblem(n, field, message))

    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        bad("call", f"invalid JSON: {e.msg} (column {e.colno})")
        return None
    except (ValueError, RecursionError) as e:  # a 5,000-digit integer; nesting too deep
        bad("call", f"invalid JSON: {json_error(e)}")
        return None
    if not isinstance(obj, dict):
        bad("call", f"expected a JSON object, got {type(obj).__name__}")
        return None
    before = len(problems)
    v: Any
    for f in (*_INTS, _LCP):
        v = obj.get(f)
        if f not in obj:
            bad(f, "missing")
        elif not _is_int(v) or v < (1 if f in ("system_tokens", "n_messages") else 0):
            bad(f, f"expected an integer >= {int(f in ('system_tokens', 'n_messages'))}, got {v!r}")
    for f in ("role", "action"):
        if not isinstance(obj.get(f), str) or not obj.get(f):
            bad(f, "missing" if f not in obj else f"expected a non-empty string, got {obj[f]!r}")
    for f in ("t_start", "t_end"):
        v = obj.get(f)
        if f not in obj:
            bad(f, "missing")
        elif not (_is_int(v) or isinstance(v, float)) or not math.isfinite(v) or v < 0:
            bad(f, f"expected a finite number of seconds >= 0, got {v!r}")
    deps: Any = obj.get("depends_on")
    if "depends_on" not in obj:
        bad("depends_on", "missing")
    elif not isinstance(deps, list):
        bad("depends_on", f"expected a list of call ids, got {deps!r}")
    ill_typed = len(problems) > before
    cid: Any = obj.get("id")
    if _is_int(cid) and cid >= 0:
        if cid in seen.lines:
            bad("id", f"duplicate call id {cid} (first on line {seen.lines[cid]})")
        elif cid < seen.top:
            bad("id", f"call ids must increase in call order: {cid} after {seen.top}")
        seen.lines.setdefault(cid, n)  # known from here on, so that dependents do not cascade
        seen.top = max(seen.top, cid)
    if ill_typed:
        return None
    if obj["t_end"] < obj["t_start"]:
        bad("t_end", f"{obj['t_end']} is before t_start {obj['t_start']}")
    if obj[_LCP] > obj["system_tokens"] + obj["rest_tokens"]:
        bad(_LCP, f"{obj[_LCP]} exceeds the prompt's {obj['system_tokens'] + obj['rest_tokens']}")
    for k, d in enumerate(deps):
        if not _is_int(d):
            bad(f"depends_on[{k}]", f"expected a call id, got {d!r}")
        elif d not in seen.lines or d >= cid:
            bad(f"depends_on[{k}]", f"{d} is not an earlier call")
    if len(problems) > before:
        return None
    return Call(
        cid, obj["role"], obj["action"], float(obj["t_start"]), float(obj["t_end"]),
        obj["system_tokens"], obj["rest_tokens"], obj["completion_tokens"], obj[_LCP],
        tuple(sorted(set(deps))),
    )  # fmt: skip


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
