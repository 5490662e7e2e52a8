"""`busiest-agent`: serve the agent with the most calls waiting first (a topas-bench plugin).

An agent's calls share its system-prompt prefix, so admitting them together reuses one cached
copy while it is on the GPU. A call waiting longer than `max_wait_s` goes ahead of every
agent's group (oldest first), so a quiet agent is never starved.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from topas_bench.schedulers.base import (
    Decision,
    EngineView,
    OrderingPolicy,
    RequestView,
    number,
)


class BusiestAgent(OrderingPolicy):
    """The agent with the most waiting calls first; calls overdue by max_wait_s before all."""

    name = "busiest-agent"

    max_wait_s = number(30.0, strict=True)  # its default and its check (validate.Param)

    def setup(self) -> None:  # after the parameters are set: the policy's state
        self._waiting: Counter[str] = Counter()

    def decide(self, view: EngineView) -> Decision:
        self._waiting = Counter(r.agent for r in view.waiting)  # calls waiting, per agent
        return super().decide(view)

    def sort_key(self, req: RequestView, view: EngineView) -> tuple[Any, ...]:
        if view.now_s - req.queued_s > self.max_wait_s:  # overdue: oldest first
            return (0, 0, "", req.queued_s, req.rid)
        return (1, -self._waiting[req.agent], req.agent, req.queued_s, req.rid)
