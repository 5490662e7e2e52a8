"""The workload model (docs/design.md section 2): agents, segments, stages, tasks, workloads.

A prompt is a tuple of segments. A segment is a content key and a token count; equal keys mean
equal tokens, so the prefix cache can share them. By convention the first segment of every prompt
is the agent's system prefix, key ``agent:<name>``. A stage's output becomes the segment
``output_key(task_id, stage_id)``, which downstream prompts (or the agent's own next call, for
append-only memory) include by key.

These classes are plain frozen data. Structural checks (cycles, unknown names, sizes) live in
`topas_bench.workloads.trace.validate`, which reports every problem at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

#: `max_new_tokens` a client sends when a stage does not say (MetaGPT sends 4096 on every call).
DEFAULT_MAX_NEW_TOKENS = 4096


def agent_key(agent: str) -> str:
    """Content key of an agent's system-prompt prefix."""
    return f"agent:{agent}"


def output_key(task_id: str, stage_id: str) -> str:
    """Content key of a stage's output tokens."""
    return f"{task_id}/{stage_id}/out"


@dataclass(frozen=True, slots=True)
class Agent:
    """An agent: a name and the length of the system prompt every one of its calls starts with."""

    name: str
    prefix_tokens: int


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of a prompt: a content key and its length in tokens."""

    key: str
    tokens: int


@dataclass(frozen=True, slots=True)
class Stage:
    """One LLM call of a task.

    `deps` are ids of stages of the same task; the call is sent `delay_s` seconds (client-side
    tool time) after the last of them finishes, or after the task arrives if it has none.
    `output_tokens` is the true output length; `max_new_tokens` is the cap the client sends,
    which is all a server (and so a policy, unless the run uses the oracle length hint) sees.
    `kind` groups calls for the service-time estimator (e.g. ``plan``, ``write_code``).
    """

    id: str
    agent: str
    prompt: tuple[Segment, ...]
    output_tokens: int
    deps: tuple[str, ...] = ()
    delay_s: float = 0.0
    kind: str = ""
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    #: Sum of the prompt's segment tokens (derived, cached: the simulator reads it constantly).
    prompt_tokens: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Tolerates junk: the trace parser builds stages from unchecked input, then validates.
        segs = self.prompt if isinstance(self.prompt, tuple | list) else ()
        total = sum(s.tokens for s in segs if isinstance(s, Segment) and isinstance(s.tokens, int))
        object.__setattr__(self, "prompt_tokens", total)

    @property
    def estimator_key(self) -> tuple[str, str]:
        return (self.agent, self.kind)


@dataclass(frozen=True, slots=True)
class Task:
    """A job: a DAG of stages that arrives at `arrival_s`. JCT = last stage's finish - arrival."""

    id: str
    workflow: str
    arrival_s: float
    stages: tuple[Stage, ...]

    def stage(self, stage_id: str) -> Stage:
        for s in self.stages:
            if s.id == stage_id:
                return s
        raise KeyError(stage_id)

    def topo_order(self) -> list[Stage]:
        """Stages in a dependency-respecting order (ties in declaration order).

        Assumes a validated DAG.
        """
        index = {s.id: i for i, s in enumerate(self.stages)}
        indeg = {s.id: len(s.deps) for s in self.stages}
        children: dict[str, list[str]] = {s.id: [] for s in self.stages}
        for s in self.stages:
            for d in s.deps:
                children[d].append(s.id)
        ready = sorted((sid for sid, n in indeg.items() if n == 0), key=index.__getitem__)
        out: list[Stage] = []
        while ready:
            sid = ready.pop(0)
            out.append(self.stages[index[sid]])
            for c in children[sid]:
                indeg[c] -= 1
                if indeg[c] == 0:
                    ready.append(c)
                    ready.sort(key=index.__getitem__)
        return out


@dataclass(frozen=True)
class Workload:
    """Agents and tasks, with the generator parameters and seed that produced them.

    `generator` names what produced the tasks (a registered workload, a converter); ``None`` for
    hand-written workloads. It and `params`, `seed` are the trace header's provenance.
    """

    name: str
    agents: tuple[Agent, ...]
    tasks: tuple[Task, ...]
    params: Mapping[str, Any] = field(default_factory=dict)
    seed: int | None = None
    generator: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))

    @property
    def agent_map(self) -> dict[str, Agent]:
        return {a.name: a for a in self.agents}

    def stages(self) -> Iterable[tuple[Task, Stage]]:
        for t in self.tasks:
            for s in t.stages:
                yield t, s

    @property
    def max_prompt_tokens(self) -> int:
        return max((s.prompt_tokens for _, s in self.stages()), default=0)

    @property
    def max_request_tokens(self) -> int:
        """Largest prompt + output of a single call: the least KV budget that can serve it."""
        return max((s.prompt_tokens + s.output_tokens for _, s in self.stages()), default=0)
