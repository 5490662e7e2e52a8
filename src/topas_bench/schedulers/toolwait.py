"""What `tokencake` and `astraea` share about a task's tool waits and its graph, from what a
server sees: the shape of the task's DAG, the estimator's service times and observed tool times
(`ServiceEstimator.tool_s`), never a stage's declared delay.
"""

from __future__ import annotations

from dataclasses import dataclass

from topas_bench.schedulers.continuum import expected_send_s, next_turn
from topas_bench.schedulers.view import EngineView, TaskView

#: The tool time assumed before any has been observed (TokenCake's `default_stall_s`,
#: pku-lemonade/TokenCake `vllm/tokencake/config.py`).
DEFAULT_TOOL_S = 1.0


@dataclass(frozen=True, slots=True)
class Shape:
    """A stage's place in its task's DAG: stages from the root to it (`depth`, 1 at a root),
    stages from it to the farthest sink (`remaining`, 1 at a sink), and the DAG's longest
    path (`longest`)."""

    depth: int
    remaining: int
    longest: int


def shapes(task: TaskView) -> dict[str, Shape]:
    """`Shape` of every stage of `task` (the DAG is fixed, so callers may memoise by task)."""
    depth: dict[str, int] = {}
    for sid, st in task.stages.items():  # topological order
        depth[sid] = 1 + max((depth[d] for d in st.deps), default=0)
    rest: dict[str, int] = {}
    for sid in reversed(list(task.stages)):
        st = task.stages[sid]
        rest[sid] = 1 + max((rest[c] for c in st.children), default=0)
    longest = max(depth.values(), default=0)
    return {sid: Shape(depth[sid], rest[sid], longest) for sid in task.stages}


def tool_s(view: EngineView, agent: str, kind: str) -> float:
    """Expected tool time before a call of (agent, kind): observed, else `DEFAULT_TOOL_S`."""
    seen = view.estimator.tool_s(agent, kind)
    return DEFAULT_TOOL_S if seen is None else seen


def predicted_send_s(task: TaskView, target: str, view: EngineView) -> float:
    """Expected seconds until `target` (a stage not yet sent) reaches the server: the longest
    chain of expected service and expected tool times through its unfinished ancestors
    (`continuum.expected_send_s` with observed tool times in place of declared delays)."""
    return expected_send_s(task, target, view, lambda st: tool_s(view, st.agent, st.kind))


def stall_s(task: TaskView, stage_id: str, agent: str, view: EngineView) -> float | None:
    """The predicted stall of a finished call's context: seconds until the next call of its
    agent downstream in its task (which extends the context) is sent; None when none comes."""
    target = next_turn(task, stage_id, agent)
    if target is None:
        return None
    return predicted_send_s(task, target, view)


def host_load_s(view: EngineView, agent: str, tokens: int) -> float | None:
    """Seconds to bring `tokens` of KV back from the host tier over the link, from the view's
    own answer for the agent's prefix (`absent_reload_s`, linear in tokens with a host tier);
    None without a host tier or a known prefix."""
    if not view.host_capacity_tokens:
        return None
    for p in view.prefixes():
        if p.agent == agent and p.tokens:
            return view.absent_reload_s(agent) * tokens / p.tokens
    return None


def usage(view: EngineView) -> float:
    """The fraction of the KV budget in use (held by running requests or locked in the cache),
    vLLM's `KVCacheManager.usage` (cached but unlocked KV counts as free there)."""
    return (view.running_tokens + view.locked_tokens) / max(view.kv_budget_tokens, 1)
