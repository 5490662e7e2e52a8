"""The trace checks, in detail: every problem of a header or a task with its field path
(`Checker`), fed one task at a time.

The checker keeps only what checks across tasks need: the agents, each task id (with where it
was first used) and the segment keys' token counts. Where those counts live is the caller's
choice (`Checker.keys`): one dict for the whole workload, or, for a file streamed in bounded
memory, a dict per task whose keys then go to a compact log (`stream.KeyLog`).
`fast` is the fast path for clean tasks; this module is the reference it must agree with,
and what names every problem.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.workloads.model import Agent, Segment, Stage, Task, Workload, agent_key, output_key
from topas_bench.workloads.trace.dag import cycles, is_ancestor
from topas_bench.workloads.trace.errors import TraceProblem
from topas_bench.workloads.trace.parse import (
    bad,
    bad_count,
    bad_name,
    bad_secs,
    bad_str,
    is_int,
    join,
    label,
)
from topas_bench.workloads.trace.read import show

# (task index, or its line in a file, or None; stage index (or agent index if the task is None)
# or None; path) -> line, field
Loc = Callable[[int | None, int | None, str], tuple[int | None, str]]
#: a key's tokens and where they were first given: (tokens, task, stage, path), the path an int
#: ``k`` for ``prompt[k].tokens`` (the fast path's, which builds no strings)
KeyFirst = tuple[int, int | None, int | None, str | int]


def file_loc(header_line: int, ti: int | None, si: int | None, path: str) -> tuple[int | None, str]:
    """Where, in a file: a task is named by its line."""
    if ti is None:
        return header_line, join("header", "" if si is None else f"agents[{si}]", path)
    return ti, join("" if si is None else f"stages[{si}]", path)


def memory_loc(w: Workload, ti: int | None, si: int | None, path: str) -> tuple[int | None, str]:
    if ti is None:
        return None, join("" if si is None else f"agents[{si}]", path)
    task = w.tasks[ti]
    stage = "" if si is None else f"stages[{label(task.stages[si], si)}]"
    return None, join(f"tasks[{label(task, ti)}]", stage, path)


class Checker:
    """Every problem of a workload's header and of its tasks, fed one at a time."""

    def __init__(self, loc: Loc, kv_budget_tokens: int | None) -> None:
        if kv_budget_tokens is not None and (m := bad_count(kv_budget_tokens)):
            raise TopasError(f"kv_budget_tokens: {m}")
        self.loc, self.kv_budget = loc, kv_budget_tokens
        self.problems: list[TraceProblem] = []
        self.agents: dict[str, Agent] = {}
        self.agent_keys: dict[str, KeyFirst] = {}  # the agents' prefix keys
        self.keys: dict[str, KeyFirst] = {}  # every other key (or, streamed, this task's)
        self.first: dict[str, int] = {}  # task id -> the task (index or line) that first had it

    def emit(self, ti: int | None, si: int | None, path: str, message: str) -> None:
        self.problems.append(TraceProblem(*self.loc(ti, si, path), message))

    def note(self, key: str, tokens: int, ti: int | None, si: int | None, path: str) -> None:
        """Equal keys mean equal tokens: the first place that gives a key fixes its length."""
        first = self.agent_keys.get(key) or self.keys.setdefault(key, (tokens, ti, si, path))
        if first[0] != tokens:
            self.mismatch(key, tokens, first, ti, si, path)

    def mismatch(
        self, key: str, tokens: int, first: KeyFirst, ti: int | None, si: int | None, path: str
    ) -> None:
        where = first[3] if isinstance(first[3], str) else f"prompt[{first[3]}].tokens"
        line, field = self.loc(first[1], first[2], where)
        at = field if line is None else f"line {line}, {field}"
        message = f"{show(key)} is {tokens} tokens here but {first[0]} at {at}"
        self.emit(ti, si, path, message + " (equal keys must mean equal tokens)")

    def workload(self, w: Workload) -> None:
        self.header(w)
        tasks = items(w.tasks, partial(self.emit, None, None, "tasks"))
        if isinstance(w.tasks, list | tuple) and not w.tasks:
            self.emit(None, None, "tasks", NO_TASKS)
        for ti, t in enumerate(tasks):
            self.task(ti, t)

    def header(self, w: Workload) -> None:
        e = partial(self.emit, None, None)
        if m := bad_name(w.name):
            e("name", m)
        if w.generator is not None and (m := bad_str(w.generator)):
            e("provenance.generator", m)
        if w.seed is not None and not is_int(w.seed):
            e("provenance.seed", bad("an integer or null", w.seed))
        try:
            json.dumps(canon(w.params), allow_nan=False)
        except (TypeError, ValueError) as x:
            e("provenance.params", f"not JSON-serialisable: {x}")
        for ai, a in enumerate(items(w.agents, partial(e, "agents"))):
            self.agent(ai, a)

    def agent(self, ai: int, a: Any) -> None:
        e = partial(self.emit, None, ai)
        if not isinstance(a, Agent):
            return e("", bad("an agent", a))
        if bad_tokens := bad_count(a.prefix_tokens):
            e("prefix_tokens", bad_tokens)
        if m := bad_name(a.name):
            e("name", m)
        elif a.name in self.agents:
            e("name", f"duplicate agent name {show(a.name)}")
        else:
            self.agents[a.name] = a
            if not bad_tokens:
                self.agent_keys[agent_key(a.name)] = (a.prefix_tokens, None, ai, "prefix_tokens")

    def task(self, ti: int, t: Any) -> None:
        if not isinstance(t, Task):
            self.emit(ti, None, "", bad("a task", t))
            return
        if m := bad_name(t.id):
            self.emit(ti, None, "id", m)
        elif t.id in self.first:
            line = self.loc(self.first[t.id], None, "")[0]
            at = f"on line {line}" if line else f"by task #{self.first[t.id]}"
            self.emit(ti, None, "id", f"duplicate task id {show(t.id)} (first used {at})")
        else:
            self.first[t.id] = ti
        if m := bad_str(t.workflow):
            self.emit(ti, None, "workflow", m)
        if m := bad_secs(t.arrival_s):
            self.emit(ti, None, "arrival_s", m)
        stages = items(t.stages, partial(self.emit, ti, None, "stages"))
        if isinstance(t.stages, list | tuple) and not t.stages:
            self.emit(ti, None, "stages", "a task needs at least one stage")
        ids: dict[str, int] = {}  # stage id -> index of the first stage with it
        for si, s in enumerate(stages):
            if not isinstance(s, Stage):
                self.emit(ti, si, "", bad("a stage", s))
                continue
            self.stage(ti, si, s)
            if bad_name(s.id) is None:
                if s.id in ids:
                    message = f"duplicate stage id {show(s.id)} (first used by stage #{ids[s.id]})"
                    self.emit(ti, si, "id", message)
                else:
                    ids[s.id] = si
        self.dag(ti, t, stages, ids)

    def stage(self, ti: int, si: int, s: Stage) -> None:
        e = partial(self.emit, ti, si)
        if m := bad_name(s.id):
            e("id", m)
        known = isinstance(s.agent, str) and s.agent in self.agents
        if m := bad_name(s.agent):
            e("agent", m)
        elif not known:
            e(
                "agent",
                f"unknown agent {show(s.agent)}; the header has {show(sorted(self.agents), 200)}",
            )
        if m := bad_str(s.kind):
            e("kind", m)
        bad_out, bad_max = bad_count(s.output_tokens), bad_count(s.max_new_tokens)
        if bad_out:
            e("output_tokens", bad_out)
        if bad_max:
            e("max_new_tokens", bad_max)
        if not (bad_out or bad_max) and s.output_tokens > s.max_new_tokens:
            e("output_tokens", f"{s.output_tokens} exceeds max_new_tokens {s.max_new_tokens}")
        if m := bad_secs(s.delay_s):
            e("delay_s", m)
        for k, d in enumerate(items(s.deps, partial(e, "deps"))):
            if m := bad_name(d):
                e(f"deps[{k}]", m)
        prompt = items(s.prompt, partial(e, "prompt"))
        total: int | None = 0
        for k, g in enumerate(prompt):
            if not isinstance(g, Segment):
                e(f"prompt[{k}]", bad("a [key, tokens] pair", g))
                total = None
                continue
            if m := bad_name(g.key):
                e(f"prompt[{k}].key", m)
            if m := bad_count(g.tokens):
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
            e(
                "prompt[0].key",
                f"expected the agent prefix {show(agent_key(s.agent))}, got {show(g0.key)}",
            )
        budget, out = self.kv_budget, s.output_tokens
        if budget is not None and total is not None and not bad_out and total + out > budget:
            message = f"prompt of {total:,} tokens + output {out:,} exceeds the KV budget"
            e("prompt", f"{message} of {budget:,} tokens")

    def dag(self, ti: int, t: Task, stages: Sequence[Any], ids: dict[str, int]) -> None:
        deps: dict[str, list[str]] = {}  # stage id -> its known dependencies
        for sid, si in ids.items():
            deps[sid] = []
            for k, d in enumerate(items(stages[si].deps, _ignore)):
                if bad_name(d):
                    continue
                if d not in ids:
                    self.emit(ti, si, f"deps[{k}]", f"unknown dependency {show(d)}")
                elif d in deps[sid]:
                    self.emit(ti, si, f"deps[{k}]", f"duplicate dependency {show(d)}")
                else:
                    deps[sid].append(d)
        backward = any(ids[d] >= ids[sid] for sid, ds in deps.items() for d in ds)
        for cycle in cycles(deps) if backward else ():  # else declaration order is topological
            i = min(range(len(cycle)), key=lambda j: ids[cycle[j]])
            cycle = cycle[i:] + cycle[:i] + [cycle[i]]
            if len(cycle) > 12:  # one readable line, however long the cycle
                cycle = [*cycle[:5], f"... ({len(cycle) - 1} stages in all) ...", *cycle[-3:]]
            shown = [c if len(c) <= 60 else show(c) for c in cycle]
            self.emit(ti, ids[cycle[0]], "deps", "dependency cycle: " + " needs ".join(shown))
        if bad_name(t.id):
            return
        outputs: dict[str, str] = {}  # output key of a stage of this task -> that stage's id
        for sid, si in ids.items():
            outputs[output_key(t.id, sid)] = sid
            if bad_count(stages[si].output_tokens) is None:
                self.note(output_key(t.id, sid), stages[si].output_tokens, ti, si, "output_tokens")
        order = None if backward else ids  # declaration order is topological: prunes searches
        for si, s in enumerate(stages):
            if not isinstance(s, Stage):
                continue
            for k, g in enumerate(items(s.prompt, _ignore)):
                if not isinstance(g, Segment) or bad_name(g.key) or bad_count(g.tokens):
                    continue
                self.note(g.key, g.tokens, ti, si, f"prompt[{k}].tokens")
                producer = outputs.get(g.key)
                if producer is None or bad_name(s.id) or ids[s.id] != si:
                    continue
                if producer == s.id:
                    self.emit(ti, si, f"prompt[{k}]", f"{show(g.key)} is this stage's own output")
                elif not is_ancestor(producer, s.id, deps, order):
                    message = (
                        f"{show(g.key)} is the output of stage {show(producer)}, not an ancestor"
                    )
                    self.emit(ti, si, f"prompt[{k}]", message)


NO_TASKS = "the trace has no tasks; a workload needs at least one task line after the header"


def canon(v: Any) -> Any:
    """JSON-shaped `v` with mapping keys sorted (the canonical form of `params`)."""
    if isinstance(v, Mapping):
        return {k: canon(v[k]) for k in sorted(v)}
    return [canon(x) for x in v] if isinstance(v, list | tuple) else v


def items(v: Any, report: Callable[[str], None]) -> Sequence[Any]:
    if isinstance(v, list | tuple):
        return v
    report(bad("a list", v))
    return ()


def _ignore(message: str) -> None:
    pass
