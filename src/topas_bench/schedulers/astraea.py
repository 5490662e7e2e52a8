"""`astraea`: a stateful multi-level feedback queue over whole agent jobs, HRRN within a level,
and a finished call's KV kept, offloaded or dropped during its tool wait by memory pressure.

Astraea (Ni et al., "Astraea: A State-Aware Scheduling Engine for LLM-Powered Agents", arXiv
2512.14142; no public code found). Read: the paper's abstract and overview (arxiv.org/html/
2512.14142v1). It schedules the whole agent request (a job of LLM segments separated by
external calls) rather than each segment: a state-aware MLFQ ("Stateful-MLFQ") classifies a
job by its I/O- versus compute-intensive behaviour, an enhanced HRRN orders jobs within a
level, and an adaptive KV manager handles a job's state during an I/O wait by memory pressure.
In topas-bench terms (a job is a task, a segment one call, an external call a stage's tool
wait):

- **Levels**: a task starts at level 0. When one of its calls finishes, its token cost (prompt
  plus output) is compared with its level's quota, `base_quota_tokens x 4^level` (the last
  level has none): over it, the task drops a level (compute-intensive); within it and yielding
  to a tool call (a next stage whose dependencies are done is not yet at the server), it rises
  a level (I/O-intensive); else it stays. A waiting request rises one level per `aging_s`
  seconds it has waited (aging).
- **Order**: lowest level first; within a level, highest response ratio `(W + S) / S`, W the
  task's whole waiting so far (every call's queueing time, the current one's included), S the
  request's expected service from the shared estimator (the paper predicts with true output
  lengths: `astraea-oracle` does, labeled as an oracle).
- **KV during a tool wait**: when a finished call's task will extend its context (its agent's
  next call downstream), by KV usage (held by running requests or locked, of the budget):
  below `keep_below` keep it locked on the GPU for twice the predicted wait (observed tool
  times, `toolwait.predicted_send_s`); below `drop_above` with a host tier offload it and
  upload it one transfer time before the predicted return; else drop it (evictable).

Every parameter is ours (the paper's values were not available to us): 4 levels,
`base_quota_tokens` 2,048 (so one 4k-prefix call overflows level 0 and a task that yields
within quota comes back up), `aging_s` 30, `keep_below` 0.5, `drop_above` 0.85, the keep's 2x
bound. Simplifications (docs/schedulers.md): no preemption (a call over its quota is demoted
when it finishes); levels change only at a call's finish in the simulator (the plugin does not
ask `context_action`, so there every task stays at level 0 and the ordering is HRRN with aging).
"""

from __future__ import annotations

from typing import Any

from topas_bench.schedulers.base import (
    DROP,
    ContextAction,
    Decision,
    OrderingPolicy,
    RequestView,
    StageState,
)
from topas_bench.schedulers.toolwait import host_load_s, stall_s, usage
from topas_bench.schedulers.validate import InvalidParameter, integer, number
from topas_bench.schedulers.view import EngineView, TaskView


def task_waiting_s(task: TaskView, now_s: float) -> float:
    """The task's whole waiting so far: each call's time from its receipt to its (last)
    admission, the current wait of one still queued."""
    total = 0.0
    for st in task.stages.values():
        r = st.request
        if r is not None:
            end = r.admitted_s if r.admitted_s is not None else now_s
            total += max(0.0, end - r.ready_s)
    return total


def yields_to_tool(task: TaskView) -> bool:
    """Whether the task now waits on a tool: a stage released by its dependencies has not
    reached the server."""
    return any(st.state == StageState.DELAYED for st in task.stages.values())


class Astraea(OrderingPolicy):
    """Stateful MLFQ over tasks (token quotas, promotion on tool yields, aging); HRRN within."""

    name = "astraea"

    levels = integer(4, 1, 16)
    base_quota_tokens = integer(2048, 1)
    aging_s = number(30.0, strict=True)
    keep_below = number(0.5, high=1.0)
    drop_above = number(0.85, high=1.0)

    def setup(self) -> None:
        if self.keep_below > self.drop_above:
            raise InvalidParameter(f"{self.name}: keep_below must not exceed drop_above")
        self.level: dict[str, int] = {}  # task id -> its level (absent: 0)

    def quota(self, level: int) -> float:
        """Token quota of a segment at `level` (the last level has none)."""
        if level >= self.levels - 1:
            return float("inf")
        return float(self.base_quota_tokens * 4**level)

    def feedback(self, finished: RequestView, task: TaskView) -> int:
        """The task's level after `finished` (one of its calls) ended: demoted over its quota,
        promoted when it yields to a tool call within it."""
        level = self.level.get(task.id, 0)
        cost = finished.prompt_tokens + finished.generated
        if cost > self.quota(level):
            level = min(level + 1, self.levels - 1)
        elif yields_to_tool(task):
            level = max(level - 1, 0)
        self.level[task.id] = level
        return level

    def effective_level(self, req: RequestView, view: EngineView) -> int:
        """The task's level, raised one per `aging_s` the request has waited."""
        aged = int(max(0.0, view.now_s - req.queued_s) // self.aging_s)
        return max(self.level.get(req.task_id, 0) - aged, 0)

    def response_ratio(self, req: RequestView, view: EngineView) -> float:
        task = view.tasks[req.task_id]
        s = max(view.estimator.residual_service_s(req, view.cached_tokens(req)), 1e-9)
        return (task_waiting_s(task, view.now_s) + s) / s

    def sort_key(self, req: RequestView, view: EngineView) -> tuple[Any, ...]:
        return (
            self.effective_level(req, view),
            -self.response_ratio(req, view),
            req.queued_s,
            req.rid,
        )

    def decide(self, view: EngineView) -> Decision:
        if len(self.level) > 2 * len(view.tasks) + 64:
            self.level = {t: v for t, v in self.level.items() if t in view.tasks}
        return super().decide(view)

    def context_action(self, finished: RequestView, view: EngineView) -> ContextAction:
        """Level feedback for the finished call's task, then its context by memory pressure."""
        task = view.tasks.get(finished.task_id)
        if task is None:
            return DROP
        self.feedback(finished, task)
        stall = stall_s(task, finished.stage_id, finished.agent, view)
        if stall is None or stall <= 0:
            return DROP
        used = usage(view)
        if used < self.keep_below:
            return ContextAction(keep_s=2.0 * stall)
        if used < self.drop_above:
            tokens = finished.prompt_tokens + finished.generated
            transfer = host_load_s(view, finished.agent, tokens)
            if transfer is not None:
                return ContextAction(offload=True, upload_in_s=max(0.0, stall - transfer))
        return DROP


class AstraeaOracle(Astraea):
    """`astraea` with the paper's true output lengths (an oracle; simulator only)."""

    name = "astraea-oracle"
    oracle_lengths = True
