"""The versioned JSONL trace of a workload (docs/design.md section 2), and the checks it must pass.

Line 1 is a header, ``{"schema": "topas-bench/trace", "version": 1, "name", "agents":
[{"name", "prefix_tokens"}], "provenance": {"generator", "params", "seed"}}``; every further line
is one task, ``{"id", "workflow", "arrival_s", "stages": [{"id", "agent", "kind", "prompt":
[[key, tokens], ...], "output_tokens", "max_new_tokens", "deps", "delay_s"}]}``. A stage's
`kind`, `max_new_tokens`, `deps` and `delay_s` may be left out (model defaults); provenance keys
other than these three are ignored. Blank lines are skipped. JSON only, never pickle. The
format is documented in docs/workload-format.md; `trace.schema.json` is its JSON Schema
(`workloads.schema`).

Writing is canonical: fields in the order above, compact separators, `params` keys sorted,
tasks sorted by ``(arrival_s, id)``, so equal workloads give byte-identical files. Only valid
workloads are written, and loading reports every problem at once (`TraceError.report`), each
with its 1-based line and field path; `validate` runs the same checks on an in-memory workload.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import IO, Any

from topas_bench.errors import TopasError
from topas_bench.workloads.model import Agent, Segment, Stage, Task, Workload, agent_key, output_key

SCHEMA = "topas-bench/trace"
VERSION = 1
_HEADER = ("schema", "version", "name", "agents", "provenance")
_AGENT = ("name", "prefix_tokens")
_TASK = ("id", "workflow", "arrival_s", "stages")
_STAGE = ("id", "agent", "kind", "prompt", "output_tokens", "max_new_tokens", "deps", "delay_s")
_STAGE_REQUIRED = ("id", "agent", "prompt", "output_tokens")


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
    """An invalid trace or workload; str() is a one-line summary, `report()` lists every problem."""

    def __init__(self, source: str, problems: Sequence[TraceProblem]) -> None:
        self.source, self.problems = source, list(problems)
        first = self.problems[0] if problems else TraceProblem(None, "-", "-")
        at = first.field if first.line is None else f"line {first.line}, {first.field}"
        n = len(self.problems)
        super().__init__(f"{source}: {n} problem{'s' * (n != 1)}; first: {at}: {first.message}")

    def __reduce__(self) -> tuple[Any, ...]:  # picklable, e.g. across a process pool
        return (type(self), (self.source, self.problems))

    def report(self) -> str:
        return "\n".join(p.format(self.source) for p in self.problems)


# --- writing ----------------------------------------------------------------------------------


def dumps_workload(w: Workload) -> str:
    """The canonical trace text of `w`; raises `TraceError` if `w` does not pass `validate`."""
    if problems := validate(w):
        raise TraceError(f"workload {w.name!r}", problems)
    provenance = {"generator": w.generator, "params": _canon(w.params), "seed": w.seed}
    agents = [{"name": a.name, "prefix_tokens": a.prefix_tokens} for a in w.agents]
    header = {"schema": SCHEMA, "version": VERSION, "name": w.name, "agents": agents}
    rows: list[Any] = [{**header, "provenance": provenance}]
    rows += [_task_row(t) for t in sorted(w.tasks, key=lambda t: (t.arrival_s, t.id))]
    return "".join(_json(r) + "\n" for r in rows)


def dump_workload(w: Workload, path_or_file: str | os.PathLike[str] | IO[str]) -> None:
    """Write `w`'s trace to a path (atomically, UTF-8) or to an open text file."""
    text = dumps_workload(w)
    if not isinstance(path_or_file, str | os.PathLike):
        path_or_file.write(text)
        return
    path = Path(path_or_file)
    if not path.parent.is_dir():
        raise TopasError(f"cannot write {path}: {path.parent} is not a directory")
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8", newline="")
    os.replace(tmp, path)


def _task_row(t: Task) -> dict[str, Any]:
    stages = [
        {f: getattr(s, f) for f in _STAGE}
        | {"prompt": [[g.key, g.tokens] for g in s.prompt], "deps": list(s.deps)}
        | {"delay_s": float(s.delay_s)}
        for s in t.stages
    ]
    return {"id": t.id, "workflow": t.workflow, "arrival_s": float(t.arrival_s), "stages": stages}


def _canon(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _canon(v[k]) for k in sorted(v)}
    return [_canon(x) for x in v] if isinstance(v, list | tuple) else v


def _json(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


# --- reading ----------------------------------------------------------------------------------


def load_workload(path: str | os.PathLike[str], *, kv_budget_tokens: int | None = None) -> Workload:
    """Read and check a trace file; raises `TraceError` listing every problem."""
    text = read_text(path)
    return loads_workload(text, source=str(path), kv_budget_tokens=kv_budget_tokens)


def read_text(path: str | os.PathLike[str]) -> str:
    """A trace file's text (UTF-8); one-line errors for a missing or undecodable file."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(str(path), [TraceProblem(None, "file", f"not UTF-8 text: {e}")]) from e
    except OSError as e:
        raise TopasError(f"{path}: cannot read trace: {e.strerror or e}") from e


def loads_workload(
    text: str, *, source: str = "<string>", kv_budget_tokens: int | None = None
) -> Workload:
    """Parse and check trace text; tasks come back sorted by ``(arrival_s, id)``."""
    lines = [(n, s) for n, s in enumerate(text.split("\n"), start=1) if s.strip()]
    parser = _Parser()
    w, task_lines = parser.parse(lines)
    problems = parser.problems
    if w is not None:
        problems += _check(w, partial(_file_loc, lines[0][0], task_lines), kv_budget_tokens)
    if problems or w is None:
        raise TraceError(source, sorted(problems, key=lambda p: p.line or 0))
    return replace(w, tasks=tuple(sorted(w.tasks, key=lambda t: (t.arrival_s, t.id))))


def validate(w: Workload, *, kv_budget_tokens: int | None = None) -> list[TraceProblem]:
    """Every problem of an in-memory workload, with field paths like ``tasks[t3].stages[s2]``."""
    return _check(w, partial(_memory_loc, w), kv_budget_tokens)


_MISSING: Any = object()  # an absent field, which the checks report as "missing"


class _Parser:
    """JSON onto the model, permissively: absent fields become `_MISSING` and ill-typed values stay
    as they are, for `_check` to report. Only what `_check` cannot see is reported here."""

    def __init__(self) -> None:
        self.problems: list[TraceProblem] = []

    def parse(self, lines: list[tuple[int, str]]) -> tuple[Workload | None, list[int]]:
        if not lines:
            self.problems.append(TraceProblem(1, "header", "empty file; expected a trace header"))
            return None, []
        w = self.header(*lines[0])
        tasks, task_lines = [], []
        for n, text in lines[1:] if w is not None else ():
            if (obj := self.decode(n, text, "task")) is not None:
                tasks.append(self.task(n, obj))
                task_lines.append(n)
        return (None if w is None else replace(w, tasks=tuple(tasks))), task_lines

    def decode(self, n: int, text: str, what: str) -> dict[str, Any] | None:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            self.problems.append(TraceProblem(n, what, f"invalid JSON: {e.msg} (column {e.colno})"))
            return None
        except (ValueError, RecursionError) as e:  # a 5,000-digit integer; nesting too deep
            self.problems.append(TraceProblem(n, what, f"invalid JSON: {json_error(e)}"))
            return None
        if isinstance(obj, dict):
            return obj
        self.problems.append(TraceProblem(n, what, _bad("a JSON object", obj)))
        return None

    def fields(self, obj: dict[str, Any], known: Sequence[str], n: int, at: str) -> dict[str, Any]:
        for k in obj:
            if k not in known:
                self.problems.append(TraceProblem(n, _join(at, k), "unknown field"))
        return {k: obj.get(k, _MISSING) for k in known}

    def header(self, n: int, text: str) -> Workload | None:
        if (h := self.decode(n, text, "header")) is None:
            return None
        schema, version = h.get("schema", _MISSING), h.get("version", _MISSING)
        if schema is _MISSING and "stages" in h:
            fatal = ("header", f"the first line must be the trace header, not a task; {_HEAD}")
        elif schema != SCHEMA:
            fatal = ("header.schema", _bad(repr(SCHEMA), schema))
        elif not _is_int(version):
            fatal = ("header.version", _bad("an integer", version))
        elif version != VERSION:
            fatal = ("header.version", f"unsupported trace version {version}; {_READS}")
        else:
            return self.workload(n, h)
        self.problems.append(TraceProblem(n, *fatal))
        return None

    def workload(self, n: int, h: dict[str, Any]) -> Workload:
        kw = self.fields(h, _HEADER, n, "header")
        agents = kw["agents"]
        if isinstance(agents, list):
            agents = tuple(self.agent(n, i, a) for i, a in enumerate(agents))
        prov = kw["provenance"]  # keys other than generator, params and seed are ignored
        if not isinstance(prov, dict):
            self.problems.append(TraceProblem(n, "header.provenance", _bad("an object", prov)))
            prov = {}
        params = prov.get("params", {})
        if not isinstance(params, dict):
            field = "header.provenance.params"
            self.problems.append(TraceProblem(n, field, _bad("an object", params)))
            params = {}
        return Workload(kw["name"], agents, (), params, prov.get("seed"), prov.get("generator"))

    def agent(self, n: int, i: int, a: Any) -> Any:
        return (
            Agent(**self.fields(a, _AGENT, n, f"header.agents[{i}]")) if isinstance(a, dict) else a
        )

    def task(self, n: int, obj: dict[str, Any]) -> Task:
        kw = self.fields(obj, _TASK, n, "")
        if isinstance(stages := kw["stages"], list):
            kw["stages"] = tuple(self.stage(n, i, s) for i, s in enumerate(stages))
        return Task(**{**kw, "arrival_s": _float(kw["arrival_s"])})

    def stage(self, n: int, i: int, s: Any) -> Any:
        if not isinstance(s, dict):
            return s
        kw = self.fields(s, _STAGE, n, f"stages[{i}]")
        kw = {k: v for k, v in kw.items() if v is not _MISSING or k in _STAGE_REQUIRED}
        if isinstance(kw["prompt"], list):
            kw["prompt"] = tuple(_segment(g) for g in kw["prompt"])
        if isinstance(kw.get("deps"), list):
            kw["deps"] = tuple(kw["deps"])
        if "delay_s" in kw:
            kw["delay_s"] = _float(kw["delay_s"])
        return Stage(**kw)


_READS = f"this build reads version {VERSION}"
_HEAD = f'expected {{"schema": "{SCHEMA}", "version": {VERSION}, ...}}'


def _segment(g: Any) -> Any:
    return Segment(g[0], g[1]) if isinstance(g, list) and len(g) == 2 else g


def _float(v: Any) -> Any:
    """Seconds as a float; an invalid value stays as it is, so that problems quote it."""
    try:
        return float(v) if _is_int(v) and v >= 0 else v
    except OverflowError:
        return math.inf


# --- checking ---------------------------------------------------------------------------------

# (task index or None, stage index (or agent index if task is None) or None, path) -> line, field
_Loc = Callable[[int | None, int | None, str], tuple[int | None, str]]


def _file_loc(
    header_line: int, task_lines: Sequence[int], ti: int | None, si: int | None, path: str
) -> tuple[int | None, str]:
    if ti is None:
        return header_line, _join("header", "" if si is None else f"agents[{si}]", path)
    return task_lines[ti], _join("" if si is None else f"stages[{si}]", path)


def _memory_loc(w: Workload, ti: int | None, si: int | None, path: str) -> tuple[int | None, str]:
    if ti is None:
        return None, _join("" if si is None else f"agents[{si}]", path)
    task = w.tasks[ti]
    stage = "" if si is None else f"stages[{_label(task.stages[si], si)}]"
    return None, _join(f"tasks[{_label(task, ti)}]", stage, path)


def _check(w: Workload, loc: _Loc, kv_budget_tokens: int | None) -> list[TraceProblem]:
    if kv_budget_tokens is not None and (m := _bad_count(kv_budget_tokens)):
        raise TopasError(f"kv_budget_tokens: {m}")
    checker = _Checker(loc, kv_budget_tokens)
    checker.workload(w)
    return checker.problems


class _Checker:
    def __init__(self, loc: _Loc, kv_budget_tokens: int | None) -> None:
        self.loc, self.kv_budget = loc, kv_budget_tokens
        self.problems: list[TraceProblem] = []
        self.agents: dict[str, Agent] = {}
        # content key -> its tokens and where they were first given (ti, si, path)
        self.tokens: dict[str, tuple[int, int | None, int | None, str]] = {}

    def emit(self, ti: int | None, si: int | None, path: str, message: str) -> None:
        self.problems.append(TraceProblem(*self.loc(ti, si, path), message))

    def note(self, key: str, tokens: int, ti: int | None, si: int | None, path: str) -> None:
        """Equal keys mean equal tokens: the first place that gives a key fixes its length."""
        first = self.tokens.setdefault(key, (tokens, ti, si, path))
        if first[0] != tokens:
            line, field = self.loc(*first[1:])
            at = field if line is None else f"line {line}, {field}"
            message = f"{key!r} is {tokens} tokens here but {first[0]} at {at}"
            self.emit(ti, si, path, message + " (equal keys must mean equal tokens)")

    def workload(self, w: Workload) -> None:
        e = partial(self.emit, None, None)
        if m := _bad_name(w.name):
            e("name", m)
        if w.generator is not None and (m := _bad_str(w.generator)):
            e("provenance.generator", m)
        if w.seed is not None and not _is_int(w.seed):
            e("provenance.seed", _bad("an integer or null", w.seed))
        try:
            _json(_canon(w.params))
        except (TypeError, ValueError) as x:
            e("provenance.params", f"not JSON-serialisable: {x}")
        for ai, a in enumerate(_items(w.agents, partial(e, "agents"))):
            self.agent(ai, a)
        first: dict[str, int] = {}  # task id -> index of the first task with it
        for ti, t in enumerate(_items(w.tasks, partial(e, "tasks"))):
            if not isinstance(t, Task):
                self.emit(ti, None, "", _bad("a task", t))
                continue
            if m := _bad_name(t.id):
                self.emit(ti, None, "id", m)
            elif t.id in first:
                line = self.loc(first[t.id], None, "")[0]
                at = f"on line {line}" if line else f"by task #{first[t.id]}"
                self.emit(ti, None, "id", f"duplicate task id {t.id!r} (first used {at})")
            else:
                first[t.id] = ti
            self.task(ti, t)

    def agent(self, ai: int, a: Any) -> None:
        e = partial(self.emit, None, ai)
        if not isinstance(a, Agent):
            return e("", _bad("an agent", a))
        if bad_tokens := _bad_count(a.prefix_tokens):
            e("prefix_tokens", bad_tokens)
        if m := _bad_name(a.name):
            e("name", m)
        elif a.name in self.agents:
            e("name", f"duplicate agent name {a.name!r}")
        else:
            self.agents[a.name] = a
            if not bad_tokens:
                self.note(agent_key(a.name), a.prefix_tokens, None, ai, "prefix_tokens")

    def task(self, ti: int, t: Task) -> None:
        if m := _bad_str(t.workflow):
            self.emit(ti, None, "workflow", m)
        if m := _bad_secs(t.arrival_s):
            self.emit(ti, None, "arrival_s", m)
        stages = _items(t.stages, partial(self.emit, ti, None, "stages"))
        if isinstance(t.stages, list | tuple) and not t.stages:
            self.emit(ti, None, "stages", "a task needs at least one stage")
        ids: dict[str, int] = {}  # stage id -> index of the first stage with it
        for si, s in enumerate(stages):
            if not isinstance(s, Stage):
                self.emit(ti, si, "", _bad("a stage", s))
                continue
            self.stage(ti, si, s)
            if _bad_name(s.id) is None:
                if s.id in ids:
                    message = f"duplicate stage id {s.id!r} (first used by stage #{ids[s.id]})"
                    self.emit(ti, si, "id", message)
                else:
                    ids[s.id] = si
        self.dag(ti, t, stages, ids)

    def stage(self, ti: int, si: int, s: Stage) -> None:
        e = partial(self.emit, ti, si)
        if m := _bad_name(s.id):
            e("id", m)
        known = isinstance(s.agent, str) and s.agent in self.agents
        if m := _bad_name(s.agent):
            e("agent", m)
        elif not known:
            e("agent", f"unknown agent {s.agent!r}; the header has {sorted(self.agents)}")
        if m := _bad_str(s.kind):
            e("kind", m)
        bad_out, bad_max = _bad_count(s.output_tokens), _bad_count(s.max_new_tokens)
        if bad_out:
            e("output_tokens", bad_out)
        if bad_max:
            e("max_new_tokens", bad_max)
        if not (bad_out or bad_max) and s.output_tokens > s.max_new_tokens:
            e("output_tokens", f"{s.output_tokens} exceeds max_new_tokens {s.max_new_tokens}")
        if m := _bad_secs(s.delay_s):
            e("delay_s", m)
        for k, d in enumerate(_items(s.deps, partial(e, "deps"))):
            if m := _bad_name(d):
                e(f"deps[{k}]", m)
        prompt = _items(s.prompt, partial(e, "prompt"))
        total: int | None = 0
        for k, g in enumerate(prompt):
            if not isinstance(g, Segment):
                e(f"prompt[{k}]", _bad("a [key, tokens] pair", g))
                total = None
                continue
            if m := _bad_name(g.key):
                e(f"prompt[{k}].key", m)
            if m := _bad_count(g.tokens):
                e(f"prompt[{k}].tokens", m)
                total = None
            elif total is not None:
                total += g.tokens
        if isinstance(s.prompt, list | tuple) and not s.prompt:
            e("prompt", "empty; a prompt starts with its agent's prefix segment")
        elif (
            known
            and prompt
            and isinstance(g0 := prompt[0], Segment)
            and g0.key != agent_key(s.agent)
        ):
            e("prompt[0].key", f"expected the agent prefix {agent_key(s.agent)!r}, got {g0.key!r}")
        budget, out = self.kv_budget, s.output_tokens
        if budget is not None and total is not None and not bad_out and total + out > budget:
            message = f"prompt of {total:,} tokens + output {out:,} exceeds the KV budget"
            e("prompt", f"{message} of {budget:,} tokens")

    def dag(self, ti: int, t: Task, stages: Sequence[Any], ids: dict[str, int]) -> None:
        deps: dict[str, list[str]] = {}  # stage id -> its known dependencies
        for sid, si in ids.items():
            deps[sid] = []
            for k, d in enumerate(_items(stages[si].deps, _ignore)):
                if _bad_name(d):
                    continue
                if d not in ids:
                    self.emit(ti, si, f"deps[{k}]", f"unknown dependency {d!r}")
                elif d in deps[sid]:
                    self.emit(ti, si, f"deps[{k}]", f"duplicate dependency {d!r}")
                else:
                    deps[sid].append(d)
        backward = any(ids[d] >= ids[sid] for sid, ds in deps.items() for d in ds)
        for cycle in _cycles(deps) if backward else ():  # else declaration order is topological
            i = min(range(len(cycle)), key=lambda j: ids[cycle[j]])
            cycle = cycle[i:] + cycle[:i] + [cycle[i]]
            if len(cycle) > 12:  # one readable line, however long the cycle
                cycle = [*cycle[:5], f"... ({len(cycle) - 1} stages in all) ...", *cycle[-3:]]
            self.emit(ti, ids[cycle[0]], "deps", "dependency cycle: " + " needs ".join(cycle))
        if _bad_name(t.id):
            return
        outputs: dict[str, str] = {}  # output key of a stage of this task -> that stage's id
        for sid, si in ids.items():
            outputs[output_key(t.id, sid)] = sid
            if _bad_count(stages[si].output_tokens) is None:
                self.note(output_key(t.id, sid), stages[si].output_tokens, ti, si, "output_tokens")
        order = None if backward else ids  # declaration order is topological: prunes searches
        for si, s in enumerate(stages):
            if not isinstance(s, Stage):
                continue
            for k, g in enumerate(_items(s.prompt, _ignore)):
                if not isinstance(g, Segment) or _bad_name(g.key) or _bad_count(g.tokens):
                    continue
                self.note(g.key, g.tokens, ti, si, f"prompt[{k}].tokens")
                producer = outputs.get(g.key)
                if producer is None or _bad_name(s.id) or ids[s.id] != si:
                    continue
                if producer == s.id:
                    self.emit(ti, si, f"prompt[{k}]", f"{g.key!r} is this stage's own output")
                elif not _is_ancestor(producer, s.id, deps, order):
                    message = f"{g.key!r} is the output of stage {producer!r}, not an ancestor"
                    self.emit(ti, si, f"prompt[{k}]", message)


def _cycles(deps: dict[str, list[str]]) -> list[list[str]]:
    """Dependency cycles (each as ``[a, b, ...]``: a needs b needs ... needs a), deterministic.
    Linear in the graph: stages that need nothing left are peeled off (Kahn) as they free up;
    every stage left needs another one left, so following needs from one finds a cycle."""
    left = {n: sum(d in deps for d in ds) for n, ds in deps.items()}  # needs still left
    needed_by: dict[str, list[str]] = {n: [] for n in deps}
    for n, ds in deps.items():
        for d in ds:
            if d in needed_by:
                needed_by[d].append(n)

    def peel(todo: list[str]) -> None:
        while todo:
            n = todo.pop()
            del left[n]
            for m in needed_by[n]:
                if m in left:
                    left[m] -= 1
                    if left[m] == 0:
                        todo.append(m)

    peel([n for n, k in left.items() if k == 0])
    cycles: list[list[str]] = []
    while left:
        path: list[str] = []
        on_path: set[str] = set()
        n = next(iter(left))
        while n not in on_path:
            path.append(n)
            on_path.add(n)
            n = next(d for d in deps[n] if d in left)
        cycles.append(path[path.index(n) :])
        freed = []
        for c in cycles[-1]:
            left[c] = 0
        for c in cycles[-1]:
            for m in needed_by[c]:
                if m in left and left[m] > 0:
                    left[m] -= 1
                    if left[m] == 0:
                        freed.append(m)
        for c in cycles[-1]:
            del left[c]
            needed_by[c] = []
        peel(freed)
    return cycles


def _is_ancestor(
    target: str, sid: str, deps: dict[str, list[str]], order: dict[str, int] | None
) -> bool:
    """Whether `sid` (transitively) needs `target`: a search up from `sid` that stops when it
    finds it and, given a topological `order`, never climbs above `target`'s position (a
    stage's ancestors all come before it). The common case, a direct dependency, is O(1)."""
    if target in deps[sid]:
        return True
    floor = order[target] if order is not None else -1
    if order is not None and order[sid] <= floor:
        return False
    seen = {sid}
    todo = [sid]
    while todo:
        for d in deps[todo.pop()]:
            if d == target:
                return True
            if d not in seen and (order is None or order[d] > floor):
                seen.add(d)
                todo.append(d)
    return False


def _items(v: Any, report: Callable[[str], None]) -> Sequence[Any]:
    if isinstance(v, list | tuple):
        return v
    report(_bad("a list", v))
    return ()


def _ignore(message: str) -> None:
    pass


def json_error(e: Exception) -> str:
    """What `json.loads` failed on beyond syntax, in one short line."""
    if isinstance(e, RecursionError):
        return "nested too deeply"
    return str(e).split(";")[0]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _bad(expected: str, v: Any) -> str:
    if v is _MISSING:
        return "missing"
    shown = repr(v)
    return f"expected {expected}, got {shown if len(shown) <= 60 else shown[:57] + '...'}"


def _bad_str(v: Any) -> str | None:
    return None if isinstance(v, str) else _bad("a string", v)


def _bad_name(v: Any) -> str | None:
    return None if isinstance(v, str) and v else _bad("a non-empty string", v)


def _bad_count(v: Any) -> str | None:
    return None if _is_int(v) and v > 0 else _bad("a positive integer", v)


def _bad_secs(v: Any) -> str | None:
    ok = _is_int(v) or (isinstance(v, float) and math.isfinite(v))
    return None if ok and v >= 0 else _bad("a finite number of seconds >= 0", v)


def _label(obj: Any, i: int) -> str:
    sid = getattr(obj, "id", None)
    return sid if isinstance(sid, str) and sid else f"#{i}"


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)
