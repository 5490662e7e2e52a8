"""The fast path of the trace checks: a clean task row, accepted in one pass.

`clean_task` answers one question, "would `check.Checker` find no problem in this row?",
only ever answering yes when that is so; whenever it is unsure (any problem, a stage listed
before one it depends on, ...) it says no and the detailed checker runs and names the
problems. It changes the cross-task state (task ids, key token counts) only when it says yes,
exactly as the checker would. `tests/test_trace_stream.py` holds the two to agreement on
mutated traces.
"""

from __future__ import annotations

from typing import Any

from topas_bench.workloads.model import DEFAULT_MAX_NEW_TOKENS, Segment, Stage, Task
from topas_bench.workloads.trace.check import Checker
from topas_bench.workloads.trace.dag import is_ancestor
from topas_bench.workloads.trace.parse import MAX_TIME_S, MAX_TOKENS, STAGE, TASK

_TASK_KEYS = frozenset(TASK)
_STAGE_KEYS = frozenset(STAGE)
_SETS = 64  # stages up to which ancestors are kept as sets


def clean_task(ck: Checker, row: Any) -> dict[str, int] | None:
    """The token count of each segment key of `row` when it is a task without a problem (given
    the agents, ids and keys `ck` holds), else None. Changes nothing: `commit` records it."""
    if type(row) is not dict or row.keys() != _TASK_KEYS:
        return None
    tid, arrival, stages = row["id"], row["arrival_s"], row["stages"]
    if type(tid) is not str or not tid or tid in ck.first or type(row["workflow"]) is not str:
        return None
    if not _seconds(arrival) or type(stages) is not list or not stages:
        return None
    agents, budget = ck.agents, ck.kv_budget
    small = len(stages) <= _SETS  # ancestors as sets; a huge task searches (`is_ancestor`)
    ids: dict[str, int] = {}
    deps: dict[str, list[str]] = {}
    ancestors: dict[str, set[str]] = {}
    mine: set[str] = set()  # this stage's ancestors (when `small`)
    local: dict[str, int] = {}  # key -> tokens
    outputs: dict[str, str] = {}  # output key of a stage before -> its id
    for si, s in enumerate(stages):
        if type(s) is not dict or not s.keys() <= _STAGE_KEYS:
            return None
        sid, agent, out = s.get("id"), s.get("agent"), s.get("output_tokens")
        if type(sid) is not str or not sid or sid in ids or type(agent) is not str:
            return None
        if agent not in agents or type(s.get("kind", "")) is not str:
            return None
        cap = s.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        if type(out) is not int or type(cap) is not int or not 0 < out <= cap <= MAX_TOKENS:
            return None
        if not _seconds(s.get("delay_s", 0.0)):
            return None
        needs = s.get("deps", [])
        if type(needs) is not list or not all(type(d) is str and d in ids for d in needs):
            return None  # not a list, or unknown, or declared later (maybe a cycle)
        if len(set(needs)) != len(needs):
            return None
        prompt = s.get("prompt")
        if type(prompt) is not list or not prompt:
            return None
        if small:
            mine = set(needs)
            for d in needs:
                mine |= ancestors[d]
            ancestors[sid] = mine
        deps[sid] = needs
        total = 0
        for g in prompt:
            if type(g) is not list or len(g) != 2:
                return None
            key, tokens = g
            if type(key) is not str or type(tokens) is not int or not 0 < tokens <= MAX_TOKENS:
                return None
            total += tokens
            if local.setdefault(key, tokens) != tokens or not key:
                return None
            if (made := outputs.get(key)) is not None and not (
                made in mine if small else is_ancestor(made, sid, deps, ids)
            ):
                return None
        if prompt[0][0] != "agent:" + agent:
            return None
        if budget is not None and total + out > budget:
            return None
        ids[sid] = si
        key = f"{tid}/{sid}/out"
        if key in local:  # read by this stage or one before: its own output, or a later one's
            return None
        local[key] = out
        outputs[key] = sid
    agent_keys, keys = ck.agent_keys, ck.keys
    for key, tokens in local.items():
        first = agent_keys.get(key) or keys.get(key)
        if first is not None and first[0] != tokens:
            return None
    return local


def commit(ck: Checker, row: dict[str, Any], ti: int, local: dict[str, int] | None) -> None:
    """Record task `row` (`clean_task` accepted it) in `ck`: its id, and, unless `local` is None
    (the caller keeps the keys elsewhere), its keys with where each was first given."""
    ck.first[row["id"]] = ti
    if local is None:
        return
    keys, agent_keys = ck.keys, ck.agent_keys
    new = {k for k in local if k not in keys and k not in agent_keys}
    if not new:
        return
    for si, s in enumerate(row["stages"]):  # places, in the checker's order: outputs first
        if (key := f"{row['id']}/{s['id']}/out") in new:
            keys[key] = (local[key], ti, si, "output_tokens")
    for si, s in enumerate(row["stages"]):
        for k, (key, tokens) in enumerate(s["prompt"]):
            if key in new and key not in keys:
                keys[key] = (tokens, ti, si, k)


def _seconds(v: Any) -> bool:
    t = type(v)
    return (t is float or t is int) and 0 <= v <= MAX_TIME_S  # NaN fails the comparison


def build_task(row: dict[str, Any]) -> Task:
    """The model of a row `clean_task` accepted."""
    return Task(
        row["id"],
        row["workflow"],
        float(row["arrival_s"]),
        tuple(
            Stage(
                s["id"],
                s["agent"],
                tuple(Segment(k, n) for k, n in s["prompt"]),
                s["output_tokens"],
                tuple(s.get("deps", ())),
                float(s.get("delay_s", 0.0)),
                s.get("kind", ""),
                s.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS),
            )
            for s in row["stages"]
        ),
    )
