"""`parrot`: Parrot-style application-level FCFS.

Parrot (Lin et al., OSDI 2024) schedules the requests of one application together: every
request is ranked by the arrival of the task it belongs to, so an earlier task's later stages
overtake a later task's first stage.
"""

from __future__ import annotations

from typing import Any

from topas_bench.schedulers.base import OrderingPolicy, RequestView
from topas_bench.schedulers.view import EngineView


class ParrotFCFS(OrderingPolicy):
    """Parrot-style application FCFS: requests ranked by their task's arrival."""

    name = "parrot"

    def sort_key(self, req: RequestView, view: EngineView) -> tuple[Any, ...]:
        task = view.tasks[req.task_id]
        return (task.arrival_s, req.task_id, req.queued_s, req.rid)
