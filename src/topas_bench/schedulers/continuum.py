"""`continuum`: keep a finished call's KV for a time to live, with program-level FCFS.

Continuum (Li et al., "Continuum: Efficient and Robust Multi-Turn LLM Agent Scheduling with KV
Cache Time-to-Live", arXiv 2511.02230; code Hanchenli/vllm-continuum, a vLLM scheduling policy):
when an agent's call ends in a tool call, its KV is pinned in GPU memory for a time to live
(TTL) chosen from the reload cost it saves against the expected wait for the next turn, so the
next turn finds its context; the pin expires on its own, bounding what a slow tool costs.
Requests are admitted program-level FCFS (by their job's arrival), which keeps a job's turns
together.

In topas-bench terms: when a stage finishes and its task has a later stage of the same agent
downstream (the next turn on the same context: our agents' calls start with their own prefix
and, with append-only memory, extend their previous call), the finished context is kept
(`Policy.context_ttl`, enforced by the engine) for

    TTL = argmax_t  P(D <= t) * B  -  c * t   =   mu * ln(B / (c * mu))   when B > c * mu, else 0

with D ~ Exponential(mu), the paper's cold-start model of the wait, mu = the expected time until
that stage is sent (the estimator's service of the stages between, plus client delays) plus the
mean queueing delay of the requests waiting now (the next turn queues too); B = the prefill
time of the context (the reload cost saved); c = `memory_price` * context tokens / KV budget
(pinning a fraction f of the KV memory for a second costs f server-seconds). The paper leaves
the exchange rate between pinned memory and job time to the implementation (the preview code
pins when the tool's moving-average duration is under a threshold); `memory_price` = 1 is ours,
not tuned. Admission is `parrot`'s key (task arrival, then queue entry).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from topas_bench.schedulers.base import OrderingPolicy, RequestView, StageState, StageView
from topas_bench.schedulers.validate import number
from topas_bench.schedulers.view import EngineView, TaskView


def expected_send_s(
    task: TaskView,
    target: str,
    view: EngineView,
    delay: Callable[[StageView], float] = lambda st: st.delay_s,
) -> float:
    """Expected seconds until `target` (a stage not yet sent) is sent: the longest chain of
    expected service (prefill and output) and client delays through its unfinished
    ancestors. `delay`: a stage's client delay before it is sent (by default its declared
    `delay_s`; `toolwait.predicted_send_s` passes observed tool times)."""
    ready: dict[str, float] = {}
    for sid, st in task.stages.items():  # topological order
        if st.state == StageState.DONE:
            continue
        after = max(
            (ready[d] + _service(task, d, view) for d in st.deps if d in ready), default=0.0
        )
        ready[sid] = after + (delay(st) if st.request is None else 0.0)
        if sid == target:
            break
    return ready.get(target, 0.0)


def _service(task: TaskView, sid: str, view: EngineView) -> float:
    st = task.stages[sid]
    est = view.estimator
    if st.request is not None:
        return est.residual_service_s(st.request)
    return est.stage_service_s(task.id, st)


class Continuum(OrderingPolicy):
    """Program-level FCFS; a finished context kept for a TTL when its agent comes back."""

    name = "continuum"

    memory_price = number(1.0)

    def sort_key(self, req: RequestView, view: EngineView) -> tuple[Any, ...]:
        task = view.tasks[req.task_id]
        return (task.arrival_s, req.task_id, req.queued_s, req.rid)

    def context_ttl(self, finished: RequestView, view: EngineView) -> float:
        task = view.tasks.get(finished.task_id)
        if task is None:
            return 0.0
        target = next_turn(task, finished.stage_id, finished.agent)
        if target is None:
            return 0.0
        waiting = view.waiting
        queueing = sum(view.now_s - r.queued_s for r in waiting) / len(waiting) if waiting else 0.0
        mu = expected_send_s(task, target, view) + queueing
        tokens = finished.prompt_tokens + finished.generated
        benefit = view.estimator.prefill_s(tokens)
        price = self.memory_price * tokens / max(view.kv_budget_tokens, 1)
        if price <= 0.0:
            return math.inf  # memory is free: keep it until the task ends
        if mu <= 0.0 or benefit <= price * mu:
            return 0.0
        return mu * math.log(benefit / (price * mu))


def next_turn(task: TaskView, stage_id: str, agent: str) -> str | None:
    """The first stage downstream of `stage_id`, not yet sent, by the same agent."""
    down: set[str] = {stage_id}
    for sid, st in task.stages.items():  # topological order
        if sid == stage_id or not any(d in down for d in st.deps):
            continue
        down.add(sid)
        if st.agent == agent and st.request is None:
            return sid
    return None
