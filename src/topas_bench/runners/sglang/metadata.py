"""Task metadata on the wire: what the workflow client attaches to each request, and what the
plugin parses back (docs/design.md section 7).

It travels in `custom_params` (top-level in OpenAI chat/completions, inside `sampling_params`
on `/generate`), never in `extra_key`/`cache_salt`, which would split the radix tree. SGLang
0.5.23 allows only JSON scalars, lists of scalars or flat dicts there, so the whole record is
one JSON string under the key ``topas``.

Parsing never raises: missing, malformed or oversized metadata (`Limits`) yields `None` plus a
reason from a fixed set, and the plugin serves the request as an independent one-stage task and
counts the reason in a warning metric. Parsing is linear in the metadata's size.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from topas_bench.workloads.model import Segment, Stage, Task, agent_key, output_key

KEY = "topas"
SCHEMA = 1


class StageMeta(NamedTuple):
    """One stage of the request's task, as the plugin's task view needs it. A named tuple, not
    a frozen dataclass: a DAG may have `Limits.max_stages` of them, and a tuple is built in a
    third of the time."""

    id: str
    agent: str
    kind: str
    deps: tuple[str, ...]
    prompt_tokens: int  # without the outputs of its task's stages (`outputs`)
    delay_s: float
    #: stages of the same task whose outputs its prompt carries: their lengths are not sent
    #: (the tracker adds each once it is made, `tracker.TrackedStage`)
    outputs: tuple[str, ...] = ()


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
    made = {output_key(task.id, x.id): x.id for x in task.stages}
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
        "dag": [_dag_item(s, made) for s in task.stages],
    }
    return {KEY: json.dumps(record, separators=(",", ":"))}


def _dag_item(s: Stage, made: Mapping[str, str]) -> list[Any]:
    """A stage as the DAG sends it: its prompt without the outputs of its task's other stages
    (a client does not know a call's output before it is made), and which stages those are.
    `made`: each stage's output key -> its id (built once per task: linear in the DAG)."""
    outs = [(made[g.key], g.tokens) for g in s.prompt if made.get(g.key, s.id) != s.id]
    text = s.prompt_tokens - sum(t for _, t in outs)
    return [s.id, s.agent, s.kind, list(s.deps), text, s.delay_s, [sid for sid, _ in outs]]


@dataclass(frozen=True, slots=True)
class Limits:
    """Caps on one request's metadata, so that a hostile or buggy client cannot make the
    scheduler process spend unbounded time or memory on it. Metadata beyond a cap is rejected
    with a reason (the request is served as an independent task), never an exception. The
    defaults take a 100,000-stage DAG (about 5.5 MB; `benchmarks/bench_metadata.py` decodes
    and orders one in well under a second)."""

    max_chars: int = 8_000_000
    max_stages: int = 100_000
    max_deps_per_stage: int = 1_024
    max_segments: int = 4_096


DEFAULT_LIMITS = Limits()


class _Bad(Exception):
    """A reason from a fixed set (no values from the request in it: the plugin counts and
    logs each reason once, so a client must not be able to mint new ones)."""


#: Metadata above this many characters is decoded with the cyclic GC paused (`gc_paused`).
GC_PAUSE_CHARS = 100_000


def is_large(custom: object) -> bool:
    """Whether `custom` carries metadata of more than `GC_PAUSE_CHARS` characters."""
    try:
        raw = custom.get(KEY) if isinstance(custom, Mapping) else None
    except Exception:  # an odd mapping: `decode` reports it
        return False
    return isinstance(raw, str) and len(raw) > GC_PAUSE_CHARS


@contextlib.contextmanager
def gc_paused(pause: bool) -> Iterator[None]:
    """Pause CPython's cyclic garbage collector while a large DAG is built. Its hundreds of
    thousands of new containers (none in a cycle) would otherwise set off collections that
    each rescan every object alive in the scheduler process: with them, decoding and ordering
    a 100,000-stage DAG takes about twice as long. Restored on exit, whatever happens; a no-op
    when `pause` is false or the collector is already off."""
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def decode(
    custom_params: object, limits: Limits = DEFAULT_LIMITS
) -> tuple[RequestMeta | None, str | None]:
    """`(meta, None)`, or `(None, reason)` when the metadata is absent, malformed or beyond
    `limits`. Never raises."""
    with gc_paused(is_large(custom_params)):
        return _decode(custom_params, limits)


def _decode(custom_params: object, limits: Limits) -> tuple[RequestMeta | None, str | None]:
    try:
        if custom_params is None:
            return None, "missing"
        if not isinstance(custom_params, Mapping):
            return None, "custom_params is not an object"
        raw = custom_params.get(KEY)
        if raw is None:
            return None, "missing"
        if isinstance(raw, str) and len(raw) > limits.max_chars:
            return None, f"too large: more than {limits.max_chars} characters"
        rec = json.loads(raw) if isinstance(raw, str) else raw
        return _parse(rec, limits), None
    except _Bad as e:
        return None, str(e)
    except json.JSONDecodeError:
        return None, "malformed: invalid JSON (JSONDecodeError)"
    except ValueError:  # json's own limits, e.g. an integer of more than 4,300 digits
        return None, "malformed: invalid JSON (ValueError)"
    except RecursionError:
        return None, "malformed: nested too deeply"
    except Exception as e:  # anything else the input can provoke, e.g. a 5,000-digit integer
        return None, f"malformed: {type(e).__name__}"


def _parse(rec: Any, limits: Limits) -> RequestMeta:
    if not isinstance(rec, Mapping):
        raise _Bad("malformed: record is not an object")
    if rec.get("v") != SCHEMA:
        raise _Bad(f"malformed: schema version is not {SCHEMA}")
    dag = _list(_field(rec, "dag"), "dag")
    if len(dag) > limits.max_stages:
        raise _Bad(f"too large: more than {limits.max_stages} stages")
    stages = _stages(dag, limits.max_deps_per_stage)
    segments = _list(_field(rec, "segments"), "segments")
    if len(segments) > limits.max_segments:
        raise _Bad(f"too large: more than {limits.max_segments} prompt segments")
    meta = RequestMeta(
        task_id=_str(_field(rec, "task"), "task"),
        stage_id=_str(_field(rec, "stage"), "stage"),
        agent=_str(_field(rec, "agent"), "agent"),
        kind=_str(rec.get("kind", ""), "kind"),
        workflow=_str(rec.get("workflow", ""), "workflow"),
        arrival_unix_s=_seconds(_field(rec, "arrival"), "arrival"),
        prefix_tokens=_count(_field(rec, "prefix"), "prefix"),
        segments=tuple(_segment(g) for g in segments),
        stages=stages,
    )
    ids = {s.id for s in stages}
    if len(ids) != len(stages):
        raise _Bad("malformed: duplicate stage ids in the DAG")
    if meta.stage_id not in ids:
        raise _Bad("malformed: the request's stage is not in the task's DAG")
    for st in stages:
        for d in st.deps:
            if d not in ids:
                raise _Bad("malformed: a stage depends on an unknown stage")
    if not _acyclic(stages):
        raise _Bad("malformed: the DAG has a cycle")
    return meta


def _acyclic(stages: tuple[StageMeta, ...]) -> bool:
    """Whether the stages (ids unique, every dependency known) form a DAG: Kahn's algorithm
    places every stage. A self-dependency is a cycle of one. Linear."""
    index = {s.id: i for i, s in enumerate(stages)}
    missing = [len(s.deps) for s in stages]
    children: list[list[int]] = [[] for _ in stages]
    for i, s in enumerate(stages):
        for d in s.deps:
            children[index[d]].append(i)
    ready = [i for i, n in enumerate(missing) if n == 0]
    for i in ready:  # grows while walked
        for c in children[i]:
            missing[c] -= 1
            if missing[c] == 0:
                ready.append(c)
    return len(ready) == len(stages)


def _stages(dag: list[Any], max_deps: int) -> tuple[StageMeta, ...]:
    """`dag`'s `[id, agent, kind, deps, prompt_tokens, delay_s, outputs]` items as stages (the
    last item optional: a stage whose prompt carries no other stage's output). The hot path
    of a large DAG, so the checks are inline (exact JSON types: `type(x) is int` also rules
    out bools)."""
    out = []
    for s in dag:
        if type(s) is not list or not 6 <= len(s) <= 7:
            raise _Bad("malformed: dag: a stage is not a 6- or 7-item list")
        sid, agent, kind, deps, tokens, delay = s[:6]
        outs: tuple[str, ...] = ()
        if len(s) == 7:
            if type(s[6]) is not list or len(s[6]) > max_deps:
                raise _Bad(f"malformed: dag outputs: expected at most {max_deps} stage ids")
            if any(type(x) is not str for x in s[6]):
                raise _Bad("malformed: dag outputs: expected a list of stage ids")
            outs = tuple(s[6])
        if type(sid) is not str or type(agent) is not str or type(kind) is not str:
            raise _Bad("malformed: dag: a stage's id, agent or kind is not a string")
        if type(deps) is not list:
            raise _Bad("malformed: dag deps: expected a list of stage ids")
        if len(deps) > max_deps:
            raise _Bad(f"too large: a stage has more than {max_deps} deps")
        for d in deps:
            if type(d) is not str:
                raise _Bad("malformed: dag deps: expected a list of stage ids")
        if type(tokens) is not int or tokens < 0:
            raise _Bad("malformed: dag prompt_tokens: expected a count >= 0")
        if type(delay) is int:
            delay = float(delay)
        if type(delay) is not float or not 0.0 <= delay < math.inf:
            raise _Bad("malformed: dag delay_s: expected seconds >= 0")
        out.append(StageMeta(sid, agent, kind, tuple(deps), tokens, delay, outs))
    return tuple(out)


def _field(rec: Mapping[str, Any], name: str) -> Any:
    if name not in rec:
        raise _Bad(f"malformed: {name}: missing")
    return rec[name]


def _segment(g: Any) -> Segment:
    if not isinstance(g, list) or len(g) != 2:
        raise _Bad("malformed: segments: a segment is not a [key, tokens] pair")
    return Segment(_str(g[0], "segments key"), _count(g[1], "segments tokens"))


def _str(x: object, name: str) -> str:
    if not isinstance(x, str):
        raise _Bad(f"malformed: {name}: expected a string")
    return x


def _list(x: object, name: str) -> list[Any]:
    if not isinstance(x, list):
        raise _Bad(f"malformed: {name}: expected a list")
    return x


def _count(x: object, name: str) -> int:
    if not isinstance(x, int) or isinstance(x, bool) or x < 0:
        raise _Bad(f"malformed: {name}: expected a count >= 0")
    return x


def _seconds(x: object, name: str) -> float:
    if not isinstance(x, int | float) or isinstance(x, bool) or not math.isfinite(x) or x < 0:
        raise _Bad(f"malformed: {name}: expected seconds >= 0")
    return float(x)


def independent(rid: str, prompt_tokens: int) -> RequestMeta:
    """The metadata of a request that came without any: a one-stage task of its own."""
    return RequestMeta(
        task_id=f"untagged/{rid}", stage_id="s0", agent="", kind="", workflow="untagged",
        arrival_unix_s=-1.0, prefix_tokens=0,
        segments=(Segment(agent_key("") + "/" + rid, prompt_tokens),),
        stages=(StageMeta("s0", "", "", (), prompt_tokens, 0.0),),
    )  # fmt: skip
