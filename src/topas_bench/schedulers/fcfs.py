"""`fcfs`: SGLang's default policy, the waiting queue in the order requests entered it."""

from __future__ import annotations

from typing import Any

from topas_bench.schedulers.base import EngineView, OrderingPolicy, RequestView


class FCFS(OrderingPolicy):
    """First come, first served by queue entry (SGLang appends retracted requests at the end)."""

    name = "fcfs"
    reorders_during_decode = False

    def sort_key(self, req: RequestView, view: EngineView) -> tuple[Any, ...]:
        return (req.queued_s, req.rid)
