"""Task metadata on the wire: what the workflow client attaches to each request, and what the
plugin parses back (DESIGN section 7).

It travels in `custom_params` (top-level in OpenAI chat/completions, inside `sampling_params`
on `/generate`), never in `extra_key`/`cache_salt`, which would split the radix tree. SGLang
0.5.23 allows only JSON scalars, lists of scalars or flat dicts there, so the whole record is
one JSON string under the key ``topas``.

Parsing never raises: missing or malformed metadata yields `None` plus a reason, and the plugin
serves the request as an independent one-stage task and counts the reason in a warning metric.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from topas_bench.workloads.model import Segment, Stage, Task, agent_key

KEY = "topas"
SCHEMA = 1


@dataclass(frozen=True, slots=True)
class StageMeta:
    """One stage of the request's task, as the plugin's task view needs it."""

    id: str
    agent: str
    kind: str
    deps: tuple[str, ...]
    prompt_tokens: int
    delay_s: float


@dataclass(frozen=True, slots=True)
class RequestMeta:
    """Everything the plugin learns about a request beyond its tokens.

    `arrival_unix_s` is the task's arrival on the client's wall clock (seconds since the
    epoch); the plugin converts it to its own clock, so client and server clocks must agree
    to within the precision the policy needs (same host, or NTP).
    `prefix_tokens` is how many leading prompt tokens are the agent's shared prefix.
    """

    task_id: str
    stage_id: str
    agent: str
    kind: str
    workflow: str
    arrival_unix_s: float
    prefix_tokens: int
    segments: tuple[Segment, ...]
    stages: tuple[StageMeta, ...]


def encode(task: Task, stage: Stage, arrival_unix_s: float, prefix_tokens: int) -> dict[str, str]:
    """`custom_params` for one stage's request."""
    record = {
        "v": SCHEMA,
        "task": task.id,
        "stage": stage.id,
        "agent": stage.agent,
        "kind": stage.kind,
        "workflow": task.workflow,
        "arrival": arrival_unix_s,
        "prefix": prefix_tokens,
        "segments": [[s.key, s.tokens] for s in stage.prompt],
        "dag": [
            [s.id, s.agent, s.kind, list(s.deps), s.prompt_tokens, s.delay_s] for s in task.stages
        ],
    }
    return {KEY: json.dumps(record, separators=(",", ":"))}


def decode(custom_params: object) -> tuple[RequestMeta | None, str | None]:
    """`(meta, None)`, or `(None, reason)` when the metadata is absent or malformed."""
    if custom_params is None:
        return None, "missing"
    if not isinstance(custom_params, Mapping):
        return None, "custom_params is not an object"
    raw = custom_params.get(KEY)
    if raw is None:
        return None, "missing"
    try:
        rec = json.loads(raw) if isinstance(raw, str) else raw
        return _parse(rec), None
    except (ValueError, TypeError, KeyError, IndexError) as e:
        return None, f"malformed: {type(e).__name__}: {e}"


def _parse(rec: Any) -> RequestMeta:
    if not isinstance(rec, Mapping):
        raise TypeError("record is not an object")
    if rec.get("v") != SCHEMA:
        raise ValueError(f"schema version {rec.get('v')!r} != {SCHEMA}")
    stages = tuple(
        StageMeta(
            _str(s[0]), _str(s[1]), _str(s[2]), tuple(_str(d) for d in _list(s[3])),
            _count(s[4]), _seconds(s[5]),
        )
        for s in _list(rec["dag"])
    )  # fmt: skip
    meta = RequestMeta(
        task_id=_str(rec["task"]),
        stage_id=_str(rec["stage"]),
        agent=_str(rec["agent"]),
        kind=_str(rec.get("kind", "")),
        workflow=_str(rec.get("workflow", "")),
        arrival_unix_s=_seconds(rec["arrival"]),
        prefix_tokens=_count(rec["prefix"]),
        segments=tuple(Segment(_str(k), _count(n)) for k, n in _list(rec["segments"])),
        stages=stages,
    )
    ids = [s.id for s in stages]
    if meta.stage_id not in ids:
        raise ValueError(f"stage {meta.stage_id!r} is not in the task's DAG")
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate stage ids in the DAG")
    for s in stages:
        for d in s.deps:
            if d not in ids:
                raise ValueError(f"stage {s.id!r} depends on unknown stage {d!r}")
    return meta


def _str(x: object) -> str:
    if not isinstance(x, str):
        raise TypeError(f"expected a string, got {type(x).__name__}")
    return x


def _list(x: object) -> Sequence[Any]:
    if not isinstance(x, list):
        raise TypeError(f"expected a list, got {type(x).__name__}")
    return x


def _count(x: object) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < 0:
        raise ValueError(f"expected a count >= 0, got {x!r}")
    return x


def _seconds(x: object) -> float:
    if not isinstance(x, int | float) or isinstance(x, bool) or not math.isfinite(x) or x < 0:
        raise ValueError(f"expected seconds >= 0, got {x!r}")
    return float(x)


def independent(rid: str, prompt_tokens: int) -> RequestMeta:
    """The metadata of a request that came without any: a one-stage task of its own."""
    return RequestMeta(
        task_id=f"untagged/{rid}", stage_id="s0", agent="", kind="", workflow="untagged",
        arrival_unix_s=-1.0, prefix_tokens=0,
        segments=(Segment(agent_key("") + "/" + rid, prompt_tokens),),
        stages=(StageMeta("s0", "", "", (), prompt_tokens, 0.0),),
    )  # fmt: skip
