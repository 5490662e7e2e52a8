"""`autellix`: Autellix-style program-level least attained service (PLAS / ATLAS).

Autellix (Luo et al., 2025) ranks each LLM call by the service its program has already
received, in discretised priority levels with FCFS inside a level, and promotes calls that
have starved. On DAGs its ATLAS variant uses the attained service along the critical path
leading to the call rather than the program's total. Here:
- attained service of a call = the largest, over paths from a root stage to the call's stage,
  of the service its stages received (for a chain: the task's total attained service);
- level = number of thresholds `quantum_s * 2**i` (i = 0 .. levels-2) the attained service has
  passed, so the first `quantum_s` seconds of a program run at the top level;
- anti-starvation: a call that has waited longer than `starvation_ratio` times its program's
  attained service (and at least `quantum_s`) is promoted to the top level.
"""

from __future__ import annotations

import bisect
from typing import Any

from topas_bench.schedulers.base import Decision, OrderingPolicy, RequestView
from topas_bench.schedulers.validate import integer, number
from topas_bench.schedulers.view import EngineView, TaskView


def critical_path_attained(task: TaskView) -> dict[str, float]:
    """Per stage: the most service along any path of its ancestors (ATLAS)."""
    before: dict[str, float] = {}
    for sid, st in task.stages.items():  # topological order
        before[sid] = max(
            (before[d] + _service(task, d) for d in st.deps),
            default=0.0,
        )
    return before


def _service(task: TaskView, stage_id: str) -> float:
    req = task.stages[stage_id].request
    return req.service_s if req is not None else 0.0


class Autellix(OrderingPolicy):
    """Autellix-style least attained service along the critical path (ATLAS), with levels."""

    name = "autellix"

    quantum_s = number(2.0, strict=True, as_given=True)
    levels = integer(8, 1, high=64)  # thresholds quantum_s * 2**i
    starvation_ratio = number(2.0, strict=True, as_given=True)

    def setup(self) -> None:
        self._thresholds = [self.quantum_s * 2**i for i in range(self.levels - 1)]
        self._before: dict[int, float] = {}

    def decide(self, view: EngineView) -> Decision:
        # A waiting stage's ancestors are all done, so its critical-path service is fixed:
        # compute it once per request.
        for r in view.waiting:
            if r.rid not in self._before:
                self._before[r.rid] = critical_path_attained(view.tasks[r.task_id])[r.stage_id]
        if len(self._before) > 4 * len(view.waiting) + 256:
            live = {r.rid for r in view.waiting}
            self._before = {k: v for k, v in self._before.items() if k in live}
        return super().decide(view)

    def sort_key(self, req: RequestView, view: EngineView) -> tuple[Any, ...]:
        attained = self._before[req.rid] + req.service_s
        waited = view.now_s - req.queued_s
        level = bisect.bisect_right(self._thresholds, attained)
        if waited > max(self.starvation_ratio * attained, self.quantum_s):
            level = 0
        return (level, req.queued_s, req.rid)
