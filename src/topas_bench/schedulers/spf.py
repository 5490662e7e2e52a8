"""`spf`: shortest (expected) remaining processing of the task first.

A request is ranked by the expected remaining service of its whole task: the sum, over the
task's unfinished stages, of the estimator's expected residual service (requests already sent)
or expected full service (stages not yet sent). On a chain this is SRPT over tasks.
"""

from __future__ import annotations

from typing import Any

from topas_bench.schedulers.base import Decision, OrderingPolicy, RequestView, StageState
from topas_bench.schedulers.view import EngineView, TaskView


def expected_remaining_s(
    task: TaskView, view: EngineView, memo: dict[str, tuple[int, int, float, float]] | None = None
) -> float:
    """Expected service still owed to `task` (seconds), from the shared estimator.

    Stages not yet sent contribute `prefill + E[output] * tpot`; their prefill and token sums
    only change when a stage is sent or the estimator learns, so `memo` keeps them per task.
    """
    est = view.estimator
    total = 0.0
    unsent = [st for st in task.stages.values() if st.request is None]
    for st in task.stages.values():
        if st.request is not None and st.state != StageState.DONE:
            total += est.residual_service_s(st.request)
    hit = memo.get(task.id) if memo is not None else None
    if hit is not None and hit[0] == est.version and hit[1] == len(unsent):
        prefill, tokens = hit[2], hit[3]
    else:
        prefill = sum(est.prefill_s(int(est.prompt_estimate(task.id, st))) for st in unsent)
        tokens = sum(est.residual_tokens(st.agent, st.kind, 0, (task.id, st.id)) for st in unsent)
        if memo is not None:
            memo[task.id] = (est.version, len(unsent), prefill, tokens)
    return total + prefill + tokens * est.tpot_s


class SPF(OrderingPolicy):
    """Shortest expected remaining task service first (SRPT over tasks on a chain)."""

    name = "spf"

    def setup(self) -> None:
        self._memo: dict[str, tuple[int, int, float, float]] = {}

    def decide(self, view: EngineView) -> Decision:
        self._remaining = {
            tid: expected_remaining_s(view.tasks[tid], view, self._memo)
            for tid in {r.task_id for r in view.waiting}
        }
        if len(self._memo) > 4 * len(view.tasks) + 64:
            self._memo = {k: v for k, v in self._memo.items() if k in view.tasks}
        return super().decide(view)

    def sort_key(self, req: RequestView, view: EngineView) -> tuple[Any, ...]:
        task = view.tasks[req.task_id]
        return (self._remaining[req.task_id], task.arrival_s, req.rid)
