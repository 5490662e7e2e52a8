"""Recorded MetaGPT call traces -> workloads (`topas-bench trace import`).

Input: JSONL, one LLM call per line, as in ../shared/metagpt/*.jsonl and the recorder's output:
``id`` (0, 1, ... in call order), ``role``, ``action``, ``t_start``/``t_end`` (s),
``system_tokens``, ``rest_tokens``, ``n_messages``, ``completion_tokens``,
``lcp_tokens_with_prev_call_of_same_role``, ``depends_on`` (ids of earlier calls whose output
the prompt contains). Other fields (``role_title``, ``tokenizer``, ``messages``, ...) are
ignored. Every malformed line is reported, with its line number, in one `TraceError`.

Output: a workload (`workloads/trace.py` format) with the recorded job as one task, or
replicated as ``num_tasks`` tasks with Poisson arrivals at ``rate_per_s``. Each call is a stage
``c<id>``, kind = its action:

- Agents: one per (role, system prompt size), named after the role (``Role/<system tokens>``
  when a role has several system prompts, e.g. RoleZero's think vs. its summaries).
- Dependencies: ``depends_on``, plus call order: the call that finished last before this one
  started (so a sequential recording stays a chain). ``delay_s`` = start - the latest finish
  of its dependencies (MetaGPT's own non-LLM time); a root waits from the job's first start.
- Prompts: [agent prefix, the part shared with the role's previous call, this call's own
  tokens]. A call shares ``lcp_tokens_with_prev_call_of_same_role`` tokens with the previous
  call of its role when that call has the same agent; segments are split at every shared
  length, so equal keys are equal tokens and the simulator's radix cache reuses exactly the
  recorded prefixes. When the role's previous call is another agent (e.g. write_new_code between
  two thinks), the recording says nothing about the overlap, and only the agent prefix is
  shared (a lower bound).
- Agent prefix, ``prefix_mode``: ``faithful`` (default: as recorded) = the system prompt, cut to
  the least prefix its calls really shared (a RoleZero system prompt with the time in it shares
  only ~41 tokens between calls a second apart); ``cache-friendly`` = the whole system prompt
  (timestamp frozen), which then also counts as shared between the agent's calls.
- Outputs: ``completion_tokens`` (at least 1; ``max_new_tokens`` = output, as the generators).
"""

from __future__ import annotations

import itertools
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from topas_bench.errors import TopasError
from topas_bench.workloads.arrivals import poisson_arrivals
from topas_bench.workloads.metagpt import PREFIX_MODES
from topas_bench.workloads.model import Agent, Segment, Stage, Task, Workload, agent_key
from topas_bench.workloads.trace import TraceError, TraceProblem, validate

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


# --- reading ----------------------------------------------------------------------------------


def load_calls(path: str | os.PathLike[str]) -> list[Call]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(str(path), [TraceProblem(None, "file", f"not UTF-8 text: {e}")]) from e
    except OSError as e:
        raise TopasError(f"{path}: cannot read call trace: {e.strerror or e}") from e
    return parse_calls(text, source=str(path))


def parse_calls(text: str, *, source: str = "<string>") -> list[Call]:
    """Parse and check a recorded call trace; raises `TraceError` listing every problem."""
    problems: list[TraceProblem] = []
    calls: list[Call] = []
    seen: dict[int, int] = {}  # id -> line
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        found = _call(n, line, seen, problems)
        if found is not None:
            calls.append(found)
    if not calls and not problems:
        problems.append(TraceProblem(1, "file", "no calls: expected one JSON object per line"))
    if problems:
        raise TraceError(source, problems)
    return calls


def _call(n: int, line: str, seen: dict[int, int], problems: list[TraceProblem]) -> Call | None:
    def bad(field: str, message: str) -> None:
        problems.append(TraceProblem(n, field, message))

    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        bad("call", f"invalid JSON: {e.msg} (column {e.colno})")
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
        if cid in seen:
            bad("id", f"duplicate call id {cid} (first on line {seen[cid]})")
        elif seen and cid < max(seen):
            bad("id", f"call ids must increase in call order: {cid} after {max(seen)}")
        seen.setdefault(cid, n)  # known from here on, so that dependents do not cascade
    if ill_typed:
        return None
    if obj["t_end"] < obj["t_start"]:
        bad("t_end", f"{obj['t_end']} is before t_start {obj['t_start']}")
    if obj[_LCP] > obj["system_tokens"] + obj["rest_tokens"]:
        bad(_LCP, f"{obj[_LCP]} exceeds the prompt's {obj['system_tokens'] + obj['rest_tokens']}")
    for k, d in enumerate(deps):
        if not _is_int(d):
            bad(f"depends_on[{k}]", f"expected a call id, got {d!r}")
        elif d not in seen or d >= cid:
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


# --- converting -------------------------------------------------------------------------------


def calls_to_workload(
    calls: Sequence[Call],
    *,
    name: str,
    source: str = "",
    num_tasks: int = 1,
    rate_per_s: float | None = None,
    seed: int = 0,
    prefix_mode: str = "faithful",
    kv_budget_tokens: int | None = None,
) -> Workload:
    """The recorded job as a workload (module docstring); raises `TopasError` on bad options."""
    if prefix_mode not in PREFIX_MODES:
        raise TopasError(
            f"prefix_mode must be one of {', '.join(PREFIX_MODES)}, got {prefix_mode!r}"
        )
    if num_tasks < 1:
        raise TopasError(f"--tasks must be a positive integer, got {num_tasks}")
    if num_tasks > 1 and (
        rate_per_s is None or not rate_per_s > 0 or not math.isfinite(rate_per_s)
    ):
        raise TopasError("replicating the job over several tasks needs a positive --rate")
    agents, stages = recorded_job(calls, prefix_mode)
    if num_tasks == 1:
        arrivals = [0.0]
    else:
        rng = np.random.Generator(np.random.PCG64(seed))
        arrivals = [float(t) for t in poisson_arrivals(rng, num_tasks, float(rate_per_s or 0))]
    tasks = [
        Task(f"t{i:04d}", name, arrival, for_task(stages, f"t{i:04d}"))
        for i, arrival in enumerate(arrivals)
    ]
    params = {
        "source": source, "calls": len(calls), "prefix_mode": prefix_mode,
        "num_tasks": num_tasks, "rate_per_s": rate_per_s,
    }  # fmt: skip
    w = Workload(name, agents, tuple(tasks), params, seed, generator="trace-import")
    if problems := validate(w, kv_budget_tokens=kv_budget_tokens):
        raise TraceError(f"{source or name} (imported)", problems)
    return w


def recorded_job(
    calls: Sequence[Call], prefix_mode: str
) -> tuple[tuple[Agent, ...], tuple[Stage, ...]]:
    """The agents and the stages of the recorded job; segment keys other than agent prefixes
    are relative (``c<id>/p<n>``): `for_task` puts them under a task id."""
    agent_of, prefix = _agents(calls, prefix_mode)
    stages = _stages(calls, agent_of, prefix, prefix_mode)
    return tuple(Agent(a, p) for a, p in prefix.items()), tuple(stages)


def for_task(stages: Sequence[Stage], task_id: str) -> tuple[Stage, ...]:
    """`stages` with every non-prefix segment keyed under `task_id`."""
    return tuple(
        replace(s, prompt=tuple(
            g if g.key.startswith("agent:") else Segment(f"{task_id}/{g.key}", g.tokens)
            for g in s.prompt
        ))
        for s in stages
    )  # fmt: skip


def _agents(calls: Sequence[Call], mode: str) -> tuple[dict[int, str], dict[str, int]]:
    """Call id -> agent name; agent name -> prefix tokens."""
    sizes: dict[str, list[int]] = {}
    for c in calls:
        if c.system_tokens not in sizes.setdefault(c.role, []):
            sizes[c.role].append(c.system_tokens)
    agent_of = {
        c.id: c.role if len(sizes[c.role]) == 1 else f"{c.role}/{c.system_tokens}" for c in calls
    }
    prefix = {agent_of[c.id]: c.system_tokens for c in calls}
    if mode == "faithful":  # as recorded: the least prefix the agent's calls shared
        for c, prev in _with_prev_of_role(calls):
            if prev is not None and agent_of[prev.id] == agent_of[c.id]:
                a = agent_of[c.id]
                prefix[a] = max(1, min(prefix[a], c.lcp))
    return agent_of, prefix


def _with_prev_of_role(calls: Sequence[Call]) -> list[tuple[Call, Call | None]]:
    last: dict[str, Call] = {}
    out = []
    for c in calls:
        out.append((c, last.get(c.role)))
        last[c.role] = c
    return out


# A prompt is a list of pieces (owner call id, tokens taken from the start of its own part);
# owner -1 is the agent prefix. Every use of an own part is a prefix of it, so cutting each part
# at every length used gives segments that are shared exactly where the recording says.
Piece = tuple[int, int]


def _stages(
    calls: Sequence[Call], agent_of: dict[int, str], prefix: dict[str, int], mode: str
) -> list[Stage]:
    pieces: dict[int, list[Piece]] = {}
    for c, prev in _with_prev_of_role(calls):
        a = agent_of[c.id]
        head = min(prefix[a], c.prompt_tokens)
        shared = head
        if prev is not None and agent_of[prev.id] == a:
            recorded = max(c.lcp, c.system_tokens) if mode == "cache-friendly" else c.lcp
            shared = max(head, min(recorded, prev.prompt_tokens, c.prompt_tokens))
        body = (
            _take(pieces[prev.id][1:], shared - head) if prev is not None and shared > head else []
        )
        own = c.prompt_tokens - shared
        pieces[c.id] = [(-1, head), *body, *([(c.id, own)] if own else [])]
    cuts: dict[int, set[int]] = {}
    for ps in pieces.values():
        for owner, n in ps:
            cuts.setdefault(owner, set()).add(n)
    starts = {c.id: c.t_start for c in calls}
    ends = {c.id: c.t_end for c in calls}
    stages = []
    for c in calls:
        a = agent_of[c.id]
        deps = set(c.depends_on)
        before = [d for d in calls if d.id < c.id and d.t_end <= c.t_start]
        if before:
            deps.add(max(before, key=lambda d: (d.t_end, d.id)).id)
        ready = max((ends[d] for d in deps), default=starts[calls[0].id])
        prompt = [Segment(agent_key(a), prefix[a])] + [
            seg for owner, n in pieces[c.id][1:] for seg in _segments(owner, n, cuts[owner])
        ]
        out = max(1, c.completion_tokens)
        stages.append(
            Stage(f"c{c.id}", a, tuple(prompt), out, tuple(f"c{d}" for d in sorted(deps)),
                  max(0.0, round(c.t_start - ready, 6)), c.action, out)
        )  # fmt: skip
    return stages


def _take(pieces: list[Piece], n: int) -> list[Piece]:
    """The first `n` tokens of a prompt body given as pieces."""
    out: list[Piece] = []
    for owner, k in pieces:
        if n <= 0:
            break
        out.append((owner, min(k, n)))
        n -= k
    return out


def _segments(owner: int, n: int, cuts: set[int]) -> list[Segment]:
    """Segments for the first `n` tokens of call `owner`'s own part, split at every cut."""
    edges = [0, *sorted(x for x in cuts if x <= n)]
    return [Segment(f"c{owner}/p{b}", b - a) for a, b in itertools.pairwise(edges)]


def import_trace(
    path: str | os.PathLike[str],
    *,
    num_tasks: int = 1,
    rate_per_s: float | None = None,
    seed: int = 0,
    prefix_mode: str = "faithful",
    name: str | None = None,
    kv_budget_tokens: int | None = None,
) -> Workload:
    """Read a recorded call trace and convert it (see the module docstring)."""
    calls = load_calls(path)
    stem = Path(path).name.removesuffix(".jsonl")
    return calls_to_workload(
        calls, name=name or stem, source=Path(path).name, num_tasks=num_tasks,
        rate_per_s=rate_per_s, seed=seed, prefix_mode=prefix_mode,
        kv_budget_tokens=kv_budget_tokens,
    )  # fmt: skip
