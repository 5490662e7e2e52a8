"""Agent affinity: each agent is pinned to a set of replicas, which grows under load.

An agent's first request pins it to the replica hosting the fewest agents (then the fewest
requests in flight, then registry order). A request goes to the least-loaded replica of its
agent's set. When that replica is overloaded against the cluster, sglang-router's balance test
(`max - min > balance_abs_threshold` and `max > balance_rel_threshold * min`, in requests in
flight), the least-loaded replica of the cluster joins the agent's set and takes the request:
the agent is rebalanced onto one more replica, at the price of loading its prefix there. Sets
never shrink, so a hot agent ends up on as many replicas as its load needs and a cold one
stays on one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from topas_bench.runners.cluster.routers.base import Cluster, Route, Router, check_number


class AgentAffinity(Router):
    name = "agent-affinity"

    @dataclass(frozen=True)
    class Params:
        """The balance test that adds a replica to an agent's set (requests in flight)."""

        balance_abs_threshold: int = 2
        balance_rel_threshold: float = 1.5

        def __post_init__(self) -> None:
            r = "agent-affinity"
            check_number(r, "balance_abs_threshold", self.balance_abs_threshold, 0, integer=True)
            check_number(r, "balance_rel_threshold", self.balance_rel_threshold, 0, integer=False)

    def __init__(self, cluster: Cluster, params: Any = None) -> None:
        super().__init__(cluster, params)
        self.homes: dict[str, list[int]] = {}  # agent -> its replicas, in the order they joined
        self._hosted = [0] * self.n  # agents pinned per replica
        self._rank = {k: i for i, k in enumerate(self.order)}
        self.spills = 0

    def choose(self, req: Route, now_s: float) -> int:
        home = self.homes.get(req.agent)
        if home is None:
            first = min(self.order, key=lambda k: (self._hosted[k], self.loads[k], self._rank[k]))
            home = self.homes[req.agent] = [first]
            self._hosted[first] += 1
        k = self.least_loaded(home)
        low = self.least_loaded()
        p = self.p
        if low not in home and self.imbalanced(
            self.loads[k], self.loads[low], p.balance_abs_threshold, p.balance_rel_threshold
        ):
            home.append(low)
            self._hosted[low] += 1
            self.spills += 1
            return low
        return k

    def stats(self) -> dict[str, Any]:
        return {
            "rebalances": self.spills,
            "replicas_per_agent": {a: len(h) for a, h in sorted(self.homes.items())},
        }
