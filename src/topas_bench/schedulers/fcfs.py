"""`fcfs`: SGLang's default policy, the waiting queue in the order requests entered it.

SGLang's FCFS does not sort (`SchedulePolicy.calc_priority`): new, retracted and preempted
requests are appended to the queue, which is served in that order.
"""

from __future__ import annotations

from topas_bench.schedulers.base import Decision, Policy, ServerNeeds
from topas_bench.schedulers.view import EngineView


class FCFS(Policy):
    """First come, first served: the queue as it stands (SGLang appends requests it requeues)."""

    name = "fcfs"

    @property
    def needs(self) -> ServerNeeds:
        """SGLang's own `fcfs`: the reference engine runs it natively."""
        return ServerNeeds(native=True)

    def decide(self, view: EngineView) -> Decision:
        return Decision(admit=list(view.waiting))
