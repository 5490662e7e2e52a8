"""Recorded MetaGPT call traces -> workloads (`topas-bench trace import`).

Input: a recorded call trace, one LLM call per JSONL line (`metagpt_calls`: tests/data/metagpt's
recordings and the recorder's output); every malformed line is reported with its line number.

Output: a workload (`workloads/trace/` format) with the recorded job as one task, or
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
- Agent prefix, ``prefix_mode``: ``cache-friendly`` (default, as the MetaGPT generators) = the
  whole system prompt (timestamp frozen), which then also counts as shared between the agent's
  calls, plus, for MetaGPT 0.8.2's SOP actions, the action's fixed template moved in front of
  the job's content (`Layout`; sizes of `metagpt-sop-full`, measured on 0.8.2's source), one
  agent per (role, action); ``faithful`` = as recorded: the system prompt, cut to the least
  prefix its calls really shared (a RoleZero system prompt with the time in it shares only ~41
  tokens between calls a second apart), templates after the content as recorded.
- Outputs: ``completion_tokens`` (at least 1). ``max_tokens`` (`lengths`): ``cap`` (default)
  makes every call send ``max_tokens_cap`` (4,096, MetaGPT's own ``max_token``, which the
  recording does not keep) and end at EOS after its recorded output, as MetaGPT's calls did;
  ``exact`` sends the recorded length with ``ignore_eos``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from topas_bench.errors import TopasError
from topas_bench.workloads import lengths
from topas_bench.workloads.arrivals import poisson_arrivals
from topas_bench.workloads.metagpt import PREFIX_MODES
from topas_bench.workloads.metagpt_calls import TICK, Call, Progress, load_calls, parse_calls
from topas_bench.workloads.metagpt_sop_full import SopFullParams
from topas_bench.workloads.model import Agent, Segment, Stage, Task, Workload, agent_key
from topas_bench.workloads.trace import TraceError, validate

__all__ = ["Call", "calls_to_workload", "for_task", "import_trace", "load_calls", "parse_calls",
           "recorded_job"]  # fmt: skip


def calls_to_workload(
    calls: Sequence[Call],
    *,
    name: str,
    source: str = "",
    num_tasks: int = 1,
    rate_per_s: float | None = None,
    seed: int = 0,
    prefix_mode: str = PREFIX_MODES[0],
    kv_budget_tokens: int | None = None,
    progress: Progress | None = None,
    max_tokens: str = "cap",
    max_tokens_cap: int = lengths.METAGPT_CAP,
) -> Workload:
    """The recorded job as a workload (module docstring); raises `TopasError` on bad options.
    `progress` hears phases ``convert`` (calls), ``replicate`` (tasks, when several) and
    ``check`` (tasks validated)."""
    if prefix_mode not in PREFIX_MODES:
        raise TopasError(
            f"prefix_mode must be one of {', '.join(PREFIX_MODES)}, got {prefix_mode!r}"
        )
    lengths.check_mode(max_tokens)
    lengths.check_cap(max_tokens_cap)
    if num_tasks < 1:
        raise TopasError(f"--tasks must be a positive integer, got {num_tasks}")
    if num_tasks > 1 and (
        rate_per_s is None or not rate_per_s > 0 or not math.isfinite(rate_per_s)
    ):
        raise TopasError("replicating the job over several tasks needs a positive --rate")
    agents, stages = recorded_job(calls, prefix_mode, progress)
    stages = lengths.apply(stages, max_tokens, max_tokens_cap)
    if num_tasks == 1:
        arrivals = [0.0]
    else:
        rng = np.random.Generator(np.random.PCG64(seed))
        arrivals = [float(t) for t in poisson_arrivals(rng, num_tasks, float(rate_per_s or 0))]
    tasks = []
    for i, arrival in enumerate(arrivals):
        if progress is not None and num_tasks > 1 and i % max(1, TICK // len(stages)) == 0:
            progress("replicate", i, num_tasks)
        tasks.append(Task(f"t{i:04d}", name, arrival, for_task(stages, f"t{i:04d}")))
    if progress is not None and num_tasks > 1:
        progress("replicate", num_tasks, num_tasks)
    params = {
        "source": source, "calls": len(calls), "prefix_mode": prefix_mode,
        "num_tasks": num_tasks, "rate_per_s": rate_per_s,
        **lengths.setting("trace-import", {lengths.MODE: max_tokens, lengths.CAP: max_tokens_cap}),
    }  # fmt: skip
    w = Workload(name, agents, tuple(tasks), params, seed, generator="trace-import")
    if progress is not None:
        progress("check", 0, len(tasks))
    if problems := validate(w, kv_budget_tokens=kv_budget_tokens):
        raise TraceError(f"{source or name} (imported)", problems)
    if progress is not None:
        progress("check", len(tasks), len(tasks))
    return w


def recorded_job(
    calls: Sequence[Call], prefix_mode: str, progress: Progress | None = None
) -> tuple[tuple[Agent, ...], tuple[Stage, ...]]:
    """The agents and the stages of the recorded job; segment keys other than agent prefixes
    are relative (``c<id>/p<n>``): `for_task` puts them under a task id. Linear in the calls
    (but for sorting), so a recording of 100,000 calls converts in seconds."""
    layouts = _layouts(calls, prefix_mode)
    agent_of, prefix = _agents(calls, prefix_mode, layouts)
    stages = _stages(calls, agent_of, prefix, layouts, prefix_mode, progress)
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


@dataclass(frozen=True)
class Layout:
    """Where a call's fixed template sits: `before` the content (a header, in every mode),
    `after` it (moved in front by cache-friendly), and whether the call is a rewrite."""

    before: int = 0
    after: int = 0
    rewrite: bool = False


def sop_templates() -> dict[str, tuple[int, int]]:
    """MetaGPT 0.8.2's SOP actions: (template before, template after the content), tokens."""
    p = SopFullParams()
    return {
        "WritePRD": (0, p.prd_template_tokens),
        "WriteDesign": (0, p.design_template_tokens),
        "WriteTasks": (0, p.tasks_template_tokens),
        "WriteCode": (p.code_header_tokens, p.code_template_tokens),
        "WriteCodeReview": (p.review_header_tokens, p.review_template_tokens),
        "WriteTest": (p.test_header_tokens, p.test_template_tokens),
        "RunCode": (p.run_header_tokens, p.run_template_tokens),
    }


def _layouts(calls: Sequence[Call], mode: str) -> dict[int, Layout]:
    """Cache-friendly: each SOP call's template. A WriteCodeReview call shorter than the review
    of its role just before it, which it extends, is a rewrite: the review's prompt without its
    instruction, the review and a rewrite instruction. It keeps the review agent's prefix, so it
    carries the review template too (+`after` tokens, as `metagpt-sop-full` models it). An
    action any of whose calls is too short for its template is left as recorded."""
    if mode != "cache-friendly":
        return {}
    found: dict[int, Layout] = {}
    templates = sop_templates()
    for c, prev in _with_prev_of_role(calls):
        if (t := templates.get(c.action)) is not None:
            rewrite = (
                prev is not None and prev.action == c.action == "WriteCodeReview"
                and c.prompt_tokens < prev.prompt_tokens and c.lcp > c.system_tokens + t[0]
            )  # fmt: skip
            found[c.id] = Layout(t[0], t[1], rewrite)
    short = {
        c.action for c in calls
        if c.id in found and c.rest_tokens < found[c.id].before + found[c.id].after
        and not found[c.id].rewrite
    }  # fmt: skip
    action = {c.id: c.action for c in calls}
    return {i: x for i, x in found.items() if action[i] not in short}


def _agents(
    calls: Sequence[Call], mode: str, layouts: dict[int, Layout]
) -> tuple[dict[int, str], dict[str, int]]:
    """Call id -> agent name; agent name -> prefix tokens. An agent is a (role, system prompt
    size) pair, or with a moved template a (role, action) pair, named after the role alone when
    the role has one."""
    keys: dict[int, tuple[str, str]] = {
        c.id: (c.action, c.action) if c.id in layouts else (str(c.system_tokens), "") for c in calls
    }
    per_role: dict[str, set[tuple[str, str]]] = {}
    for c in calls:
        per_role.setdefault(c.role, set()).add(keys[c.id])
    agent_of = {
        c.id: c.role if len(per_role[c.role]) == 1 else f"{c.role}/{keys[c.id][0]}" for c in calls
    }
    prefix = {}
    for c in calls:
        x = layouts.get(c.id, Layout())
        prefix[agent_of[c.id]] = c.system_tokens + x.before + x.after
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
    calls: Sequence[Call],
    agent_of: dict[int, str],
    prefix: dict[str, int],
    layouts: dict[int, Layout],
    mode: str,
    progress: Progress | None,
) -> list[Stage]:
    pieces: dict[int, list[Piece]] = {}
    length: dict[int, int] = {}  # call id -> its prompt tokens here (a rewrite gains a template)
    for c, prev in _with_prev_of_role(calls):
        a = agent_of[c.id]
        x = layouts.get(c.id)
        length[c.id] = c.prompt_tokens + (x.after if x is not None and x.rewrite else 0)
        head = min(prefix[a], length[c.id])
        shared = head
        if prev is not None and agent_of[prev.id] == a:
            # what the recording shares past the system prompt (and a header) moves behind
            # the agent prefix; as recorded, it is the recorded shared length
            front = c.system_tokens + (x.before if x is not None else 0)
            recorded = prefix[a] + max(0, c.lcp - front) if mode == "cache-friendly" else c.lcp
            shared = max(head, min(recorded, length[prev.id], length[c.id]))
        body = (
            _take(pieces[prev.id][1:], shared - head) if prev is not None and shared > head else []
        )
        own = length[c.id] - shared
        pieces[c.id] = [(-1, head), *body, *([(c.id, own)] if own else [])]
    cut_sets: dict[int, set[int]] = {}
    for ps in pieces.values():
        for owner, n in ps:
            cut_sets.setdefault(owner, set()).add(n)
    cuts = {owner: sorted(ns) for owner, ns in cut_sets.items()}
    ends = {c.id: c.t_end for c in calls}
    stages = []
    for k, (c, last) in enumerate(zip(calls, _last_finished_before(calls), strict=True)):
        if progress is not None and k % TICK == 0:
            progress("convert", k, len(calls))
        a = agent_of[c.id]
        deps = set(c.depends_on)
        if last is not None:
            deps.add(last)
        ready = max((ends[d] for d in deps), default=calls[0].t_start)
        prompt = [Segment(agent_key(a), prefix[a])] + [
            seg for owner, n in pieces[c.id][1:] for seg in _segments(owner, n, cuts[owner])
        ]
        out = max(1, c.completion_tokens)
        stages.append(
            Stage(f"c{c.id}", a, tuple(prompt), out, tuple(f"c{d}" for d in sorted(deps)),
                  max(0.0, round(c.t_start - ready, 6)), c.action, out)
        )  # fmt: skip
    if progress is not None:
        progress("convert", len(calls), len(calls))
    return stages


def _last_finished_before(calls: Sequence[Call]) -> list[int | None]:
    """For each call, the earlier call (lower id) that finished last at or before its start
    (ties: the higher id), or None: the call-order dependency. O(n log n): the earlier calls
    sit in a Fenwick tree of prefix maxima over their rank by (t_end, id), queried up to the
    last rank that ended by this call's start."""
    order = sorted(range(len(calls)), key=lambda i: (calls[i].t_end, calls[i].id))
    rank = [0] * len(calls)
    for r, i in enumerate(order):
        rank[i] = r
    ends = [calls[i].t_end for i in order]
    tree = [-1] * (len(calls) + 1)  # 1-based; the highest rank inserted in each range
    out: list[int | None] = []
    for i, c in enumerate(calls):
        best, k = -1, bisect.bisect_right(ends, c.t_start)  # ranks < k ended by the start
        while k > 0:
            best = max(best, tree[k])
            k -= k & -k
        out.append(calls[order[best]].id if best >= 0 else None)
        k = rank[i] + 1
        while k <= len(calls):
            tree[k] = max(tree[k], rank[i])
            k += k & -k
    return out


def _take(pieces: list[Piece], n: int) -> list[Piece]:
    """The first `n` tokens of a prompt body given as pieces."""
    out: list[Piece] = []
    for owner, k in pieces:
        if n <= 0:
            break
        out.append((owner, min(k, n)))
        n -= k
    return out


def _segments(owner: int, n: int, cuts: list[int]) -> list[Segment]:
    """Segments for the first `n` tokens of call `owner`'s own part, split at every cut
    (`cuts`: sorted)."""
    edges = [0, *cuts[: bisect.bisect_right(cuts, n)]]
    return [Segment(f"c{owner}/p{b}", b - a) for a, b in itertools.pairwise(edges)]


def import_trace(
    path: str | os.PathLike[str],
    *,
    name: str | None = None,
    progress: Progress | None = None,
    **options: Any,
) -> Workload:
    """Read a recorded call trace and convert it (see the module docstring) with
    `calls_to_workload`'s `options`, named after the file unless `name` is given; `progress`
    hears the phases ``read`` (lines), ``convert`` (calls) and ``check`` (tasks)."""
    calls = load_calls(path, progress)
    stem = Path(path).name.removesuffix(".jsonl")
    return calls_to_workload(
        calls, name=name or stem, source=Path(path).name, progress=progress, **options
    )
