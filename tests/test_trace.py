"""The JSONL trace: round trips, canonical bytes, and one test per problem the loader reports."""

from __future__ import annotations

import io
import json
import pickle
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas_bench.errors import TopasError
from topas_bench.workloads.model import Agent, Segment, Stage, Task, Workload, agent_key
from topas_bench.workloads.trace import (
    TraceError,
    TraceProblem,
    dump_workload,
    dumps_workload,
    load_workload,
    loads_workload,
    validate,
)


def _workload() -> Workload:
    """Two agents, two tasks; t1 is a planner -> coder chain, t2 a fan-in of three stages."""
    plan, code = Segment("agent:planner", 100), Segment("agent:coder", 200)
    t1 = Task(
        "t1",
        "chain",
        0.0,
        (
            Stage("s1", "planner", (plan, Segment("t1/in", 50)), 30, kind="plan"),
            Stage(
                "s2",
                "coder",
                (code, Segment("t1/s1/out", 30)),
                40,
                deps=("s1",),
                delay_s=0.5,
                max_new_tokens=512,
            ),
        ),
    )
    t2 = Task(
        "t2",
        "fan-in",
        1.25,
        (
            Stage("a", "planner", (plan, Segment("t2/in", 20)), 10),
            Stage("b", "planner", (plan, Segment("t2/in", 20)), 12),
            Stage(
                "c",
                "coder",
                (code, Segment("t2/a/out", 10), Segment("t2/b/out", 12)),
                400,
                deps=("a", "b"),
            ),
        ),
    )
    agents = (Agent("planner", 100), Agent("coder", 200))
    params = {"rate_per_s": 0.5, "mix": [1, 2], "nested": {"z": 1, "a": None}}
    return Workload("demo", agents, (t1, t2), params, seed=7, generator="hand")


def _rows() -> list[Any]:
    return [json.loads(line) for line in dumps_workload(_workload()).splitlines()]


def _text(rows: list[Any]) -> str:
    """One line per row; a str row is written verbatim (for broken JSON)."""
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)


def _problems(rows: list[Any], **kw: Any) -> TraceError:
    with pytest.raises(TraceError) as info:
        loads_workload(_text(rows), source="bad.jsonl", **kw)
    return info.value


# --- round trips ------------------------------------------------------------------------------


def test_round_trip_is_equal_and_byte_identical(tmp_path: Path) -> None:
    w = _workload()
    path = tmp_path / "w.jsonl"
    dump_workload(w, path)
    loaded = load_workload(path)
    assert loaded == w
    assert dumps_workload(loaded) == path.read_text(encoding="utf-8")
    buf = io.StringIO()
    dump_workload(loaded, buf)
    assert buf.getvalue() == path.read_text(encoding="utf-8")


def test_dump_is_canonical() -> None:
    text = dumps_workload(_workload())
    lines = text.splitlines()
    assert len(lines) == 3 and text.endswith("\n")
    assert lines[0].startswith('{"schema":"topas-bench/trace","version":1,"name":"demo",')
    assert '"params":{"mix":[1,2],"nested":{"a":null,"z":1},"rate_per_s":0.5}' in lines[0]
    assert ", " not in text  # compact separators
    # Task order and params key order do not change the bytes.
    w = _workload()
    shuffled = replace(w, tasks=w.tasks[::-1], params=dict(reversed(list(w.params.items()))))
    assert dumps_workload(shuffled) == text


def test_load_sorts_tasks_and_fills_defaults() -> None:
    rows = _rows()
    rows[1], rows[2] = rows[2], rows[1]
    rows[1]["arrival_s"] = 3  # an int is a number of seconds too
    for key in ("kind", "max_new_tokens", "deps", "delay_s"):
        del rows[2]["stages"][0][key]
    w = loads_workload(_text(rows) + "\n\n")  # blank lines are skipped
    assert [t.id for t in w.tasks] == ["t1", "t2"]
    assert w.tasks[1].arrival_s == 3.0 and isinstance(w.tasks[1].arrival_s, float)
    assert w.tasks[0].stages[0] == Stage("s1", "planner", w.tasks[0].stages[0].prompt, 30)


def test_dump_refuses_an_invalid_workload() -> None:
    w = _workload()
    bad = replace(w, agents=w.agents[:1])
    with pytest.raises(TraceError, match="unknown agent 'coder'"):
        dumps_workload(bad)


def test_missing_file_is_a_topas_error(tmp_path: Path) -> None:
    with pytest.raises(TopasError, match="cannot read trace"):
        load_workload(tmp_path / "nope.jsonl")


# --- one test per problem ---------------------------------------------------------------------

Mutate = Callable[[list[Any]], None]


def _set(path: str, value: Any) -> Mutate:
    """``_set("1.stages.0.output_tokens", -3)``: rows[1]["stages"][0]["output_tokens"] = -3."""

    def mutate(rows: list[Any]) -> None:
        *parents, last = path.split(".")
        obj: Any = rows
        for p in parents:
            obj = obj[int(p)] if isinstance(obj, list) else obj[p]
        if value is _DELETE:
            del obj[last]
        elif isinstance(obj, list):
            obj[int(last)] = value
        else:
            obj[last] = value

    return mutate


_DELETE = object()

# (mutation, line, field, part of the message)
CASES: dict[str, tuple[Mutate, int, str, str]] = {
    "invalid json": (_set("1", '{"id": "t1",'), 2, "task", "invalid JSON"),
    "not an object": (_set("2", "[1, 2]"), 3, "task", "expected a JSON object, got [1, 2]"),
    "missing field": (
        _set("1.stages.0.output_tokens", _DELETE),
        2,
        "stages[0].output_tokens",
        "missing",
    ),
    "negative output": (
        _set("1.stages.1.output_tokens", -3),
        2,
        "stages[1].output_tokens",
        "expected a positive integer, got -3",
    ),
    "ill-typed field": (_set("1.workflow", 3), 2, "workflow", "expected a string, got 3"),
    "float tokens": (
        _set("1.stages.0.prompt.1.1", 5.0),
        2,
        "stages[0].prompt[1].tokens",
        "got 5.0",
    ),
    "bool tokens": (
        _set("1.stages.0.output_tokens", True),
        2,
        "stages[0].output_tokens",
        "got True",
    ),
    "bad segment": (_set("1.stages.0.prompt.1", ["k"]), 2, "stages[0].prompt[1]", "[key, tokens]"),
    "unknown field": (_set("1.stages.0.delay", 1), 2, "stages[0].delay", "unknown field"),
    "wrong schema": (_set("0.schema", "other"), 1, "header.schema", "got 'other'"),
    "wrong version": (
        _set("0.version", 7),
        1,
        "header.version",
        "unsupported trace version 7; this build reads version 1",
    ),
    "missing version": (_set("0.version", _DELETE), 1, "header.version", "missing"),
    "empty file": (lambda rows: rows.clear(), 1, "header", "empty file"),
    "missing header": (lambda rows: rows.pop(0), 1, "header", "must be the trace header"),
    "header not an object": (_set("0", "[]"), 1, "header", "expected a JSON object"),
    "missing provenance": (_set("0.provenance", _DELETE), 1, "header.provenance", "missing"),
    "bad seed": (_set("0.provenance.seed", "7"), 1, "header.provenance.seed", "got '7'"),
    "duplicate agent": (
        lambda rows: rows[0]["agents"].append({"name": "coder", "prefix_tokens": 200}),
        1,
        "header.agents[2].name",
        "duplicate agent name 'coder'",
    ),
    "duplicate task id": (
        _set("2.id", "t1"),
        3,
        "id",
        "duplicate task id 't1' (first used on line 2)",
    ),
    "duplicate stage id": (
        _set("1.stages.1.id", "s1"),
        2,
        "stages[1].id",
        "duplicate stage id 's1'",
    ),
    "unknown agent": (
        _set("1.stages.0.agent", "ghost"),
        2,
        "stages[0].agent",
        "unknown agent 'ghost'",
    ),
    "unknown dependency": (
        lambda rows: rows[2]["stages"][2]["deps"].append("s9"),
        3,
        "stages[2].deps[2]",
        "unknown dependency 's9'",
    ),
    "duplicate dependency": (
        lambda rows: rows[2]["stages"][2]["deps"].append("a"),
        3,
        "stages[2].deps[2]",
        "duplicate dependency 'a'",
    ),
    "cycle": (
        _set("2.stages.0.deps", ["c"]),
        3,
        "stages[0].deps",
        "dependency cycle: a needs c needs a",
    ),
    "self cycle": (_set("1.stages.0.deps", ["s1"]), 2, "stages[0].deps", "cycle: s1 needs s1"),
    "zero prefix_tokens": (
        _set("0.agents.0.prefix_tokens", 0),
        1,
        "header.agents[0].prefix_tokens",
        "expected a positive integer, got 0",
    ),
    "zero segment tokens": (
        _set("1.stages.0.prompt.1.1", 0),
        2,
        "stages[0].prompt[1].tokens",
        "got 0",
    ),
    "negative max_new_tokens": (
        _set("1.stages.1.max_new_tokens", -1),
        2,
        "stages[1].max_new_tokens",
        "got -1",
    ),
    "output above cap": (
        _set("1.stages.1.max_new_tokens", 39),
        2,
        "stages[1].output_tokens",
        "40 exceeds max_new_tokens 39",
    ),
    "negative delay": (_set("1.stages.1.delay_s", -0.5), 2, "stages[1].delay_s", "got -0.5"),
    "negative arrival": (_set("2.arrival_s", -1.0), 3, "arrival_s", "got -1.0"),
    "nan arrival": (_set("2.arrival_s", float("nan")), 3, "arrival_s", "got nan"),
    "infinite delay": (_set("1.stages.0.delay_s", float("inf")), 2, "stages[0].delay_s", "got inf"),
    "empty stage list": (_set("2.stages", []), 3, "stages", "at least one stage"),
    "empty prompt": (_set("1.stages.0.prompt", []), 2, "stages[0].prompt", "empty"),
    "prompt without prefix": (
        _set("1.stages.0.prompt.0.0", "sys"),
        2,
        "stages[0].prompt[0].key",
        "expected the agent prefix 'agent:planner', got 'sys'",
    ),
    "prefix of wrong length": (
        _set("1.stages.0.prompt.0.1", 99),
        2,
        "stages[0].prompt[0].tokens",
        "'agent:planner' is 99 tokens here but 100 at line 1, header.agents[0].prefix_tokens",
    ),
    "key reused with other length": (
        _set("2.stages.1.prompt.1.1", 21),
        3,
        "stages[1].prompt[1].tokens",
        "'t2/in' is 21 tokens here but 20 at line 3, stages[0].prompt[1].tokens",
    ),
    "output of a non-ancestor": (
        _set("2.stages.2.deps", ["a"]),
        3,
        "stages[2].prompt[2]",
        "'t2/b/out' is the output of stage 'b', not an ancestor",
    ),
    "own output": (
        lambda rows: rows[1]["stages"][0]["prompt"].append(["t1/s1/out", 30]),
        2,
        "stages[0].prompt[2]",
        "this stage's own output",
    ),
    "output of other length": (
        _set("1.stages.1.prompt.1.1", 31),
        2,
        "stages[1].prompt[1].tokens",
        "'t1/s1/out' is 31 tokens here but 30 at line 2, stages[0].output_tokens",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_each_problem_is_reported_with_line_and_field(case: str) -> None:
    mutate, line, field, message = CASES[case]
    rows = _rows()
    mutate(rows)
    error = _problems(rows)
    assert f"bad.jsonl:{line}: {field}: " in error.report()
    assert any(p.line == line and p.field == field and message in p.message for p in error.problems)
    assert len(error.problems) == 1, error.report()  # no follow-on noise


def test_kv_budget() -> None:
    error = _problems(_rows(), kv_budget_tokens=600)
    assert error.report() == (
        "bad.jsonl:3: stages[2].prompt: prompt of 222 tokens + output 400 exceeds the KV budget"
        " of 600 tokens"
    )
    loads_workload(_text(_rows()), kv_budget_tokens=622)  # exactly fits
    with pytest.raises(TopasError, match="kv_budget_tokens"):
        loads_workload(_text(_rows()), kv_budget_tokens=0)


def test_every_problem_is_reported() -> None:
    rows = _rows()
    rows[0]["agents"][1]["prefix_tokens"] = -1
    rows[1]["stages"][1]["deps"] = ["s9"]
    rows[1]["stages"][0]["output_tokens"] = "many"
    rows[2]["arrival_s"] = -2
    rows.insert(2, "not json")
    error = _problems(rows)
    lines = error.report().splitlines()
    assert lines == [
        "bad.jsonl:1: header.agents[1].prefix_tokens: expected a positive integer, got -1",
        "bad.jsonl:2: stages[0].output_tokens: expected a positive integer, got 'many'",
        "bad.jsonl:2: stages[1].deps[0]: unknown dependency 's9'",
        "bad.jsonl:2: stages[1].prompt[1]: 't1/s1/out' is the output of stage 's1', not an"
        " ancestor",
        "bad.jsonl:3: task: invalid JSON: Expecting value (column 1)",
        "bad.jsonl:4: arrival_s: expected a finite number of seconds >= 0, got -2",
    ]
    assert str(error) == (
        "bad.jsonl: 6 problems; first: line 1, header.agents[1].prefix_tokens: expected a"
        " positive integer, got -1"
    )


# --- validate on in-memory workloads ----------------------------------------------------------


def test_validate_good_workload() -> None:
    assert validate(_workload()) == []
    assert validate(_workload(), kv_budget_tokens=622) == []


def test_validate_in_memory_paths() -> None:
    w = _workload()
    t1 = w.tasks[0]
    bad_stage = replace(t1.stages[1], deps=("s1", "s9"), output_tokens=0)
    w = replace(w, tasks=(replace(t1, stages=(t1.stages[0], bad_stage)), w.tasks[1]))
    assert validate(w) == [
        TraceProblem(
            None, "tasks[t1].stages[s2].output_tokens", "expected a positive integer, got 0"
        ),
        TraceProblem(None, "tasks[t1].stages[s2].deps[1]", "unknown dependency 's9'"),
    ]
    assert TraceError("gen", validate(w)).report().splitlines()[1] == (
        "gen: tasks[t1].stages[s2].deps[1]: unknown dependency 's9'"
    )


def test_validate_flags_values_json_cannot_hold() -> None:
    w = replace(_workload(), params={"f": object()}, seed=1.5)  # type: ignore[arg-type]
    fields = [p.field for p in validate(w)]
    assert fields == ["provenance.seed", "provenance.params"]


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    children = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    )
    return [prefix] + [p for k, v in children for p in _paths(v, (*prefix, k))]


def test_any_junk_gives_problems_not_a_crash() -> None:
    """Every field of a good trace, replaced by junk or removed: always a `TraceError`."""
    base = _rows()
    for path in _paths(base)[1:]:
        for junk in (None, "", -1, 1.5, [], {}, [["k", 1]], _DELETE):
            rows = json.loads(json.dumps(base))
            parent = rows
            for k in path[:-1]:
                parent = parent[k]
            if junk is _DELETE:
                del parent[path[-1]]
            else:
                parent[path[-1]] = junk
            try:
                loads_workload(_text(rows))
            except TraceError as e:
                assert e.problems and all(p.line is not None for p in e.problems)
            # (a few replacements are valid, e.g. an empty kind)


def test_trace_error_pickles() -> None:
    error = _problems([])
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) and again.problems == error.problems


# -- linear graph checks (issue 13: a 100,000-stage task validates in seconds) -----------------
def _reference_cycles(deps: dict[str, list[str]]) -> list[list[str]]:
    """The checker's former cycle search (quadratic on long chains), as the reference."""
    left, cycles = dict(deps), list[list[str]]()
    while True:
        while free := [n for n, ds in left.items() if not any(d in left for d in ds)]:
            for n in free:
                del left[n]
        if not left:
            return cycles
        path, n = [], next(iter(left))
        while n not in path:
            path.append(n)
            n = next(d for d in left[n] if d in left)
        cycles.append(path[path.index(n) :])
        for n in cycles[-1]:
            del left[n]


def _graphs() -> st.SearchStrategy[dict[str, list[str]]]:
    return st.lists(st.sets(st.integers(0, 9), max_size=3), min_size=1, max_size=10).map(
        lambda rows: {
            f"s{i}": [f"s{d}" for d in sorted(ds) if d < len(rows)] for i, ds in enumerate(rows)
        }
    )


@settings(max_examples=400, deadline=None)
@given(_graphs())
def test_cycle_search_matches_the_reference(deps: dict[str, list[str]]) -> None:
    from topas_bench.workloads.trace.dag import cycles as _cycles

    assert _cycles(deps) == _reference_cycles(deps)


@settings(max_examples=400, deadline=None)
@given(_graphs(), st.data())
def test_ancestor_search_matches_the_closure(
    deps: dict[str, list[str]], data: st.DataObject
) -> None:
    from topas_bench.workloads.trace.dag import is_ancestor as _is_ancestor

    def closure(sid: str) -> set[str]:
        seen: set[str] = set()
        todo = list(deps[sid])
        while todo:
            if (d := todo.pop()) not in seen:
                seen.add(d)
                todo += deps[d]
        return seen

    a, b = data.draw(st.sampled_from(sorted(deps))), data.draw(st.sampled_from(sorted(deps)))
    assert _is_ancestor(a, b, deps, None) == (a in closure(b))
    index = {n: i for i, n in enumerate(deps)}
    if all(index[d] < index[n] for n, ds in deps.items() for d in ds):  # topological order
        assert _is_ancestor(a, b, deps, index) == (a in closure(b))


def test_a_long_cycle_is_one_readable_line() -> None:
    stages = tuple(
        Stage(f"s{i}", "A", (Segment(agent_key("A"), 4),), 2, (f"s{(i - 1) % 500}",))
        for i in range(500)
    )
    w = Workload("w", (Agent("A", 4),), (Task("t", "w", 0.0, stages),))
    (problem,) = validate(w)
    assert problem.message.startswith("dependency cycle: s0 needs s499 needs s498")
    assert "(500 stages in all)" in problem.message and len(problem.message) < 200
