"""Cache-agnostic routers: round-robin and least-load."""

from __future__ import annotations

from typing import Any

from topas_bench.runners.cluster.routers.base import Cluster, Route, Router


class RoundRobin(Router):
    """sglang-router 0.3.2's `round_robin` (`policies/round_robin.rs`): a counter shared by
    every request, starting at 0, modulo the number of workers, in registry order."""

    name = "round-robin"

    def __init__(self, cluster: Cluster, params: Any = None) -> None:
        super().__init__(cluster, params)
        self._count = 0

    def choose(self, req: Route, now_s: float) -> int:
        k = self.order[self._count % self.n]
        self._count += 1
        return k


class LeastLoad(Router):
    """The replica with the fewest requests in flight (the router's own count), the first in
    registry order on ties: `cache_aware`'s imbalanced branch applied to every request. Not a
    policy of sglang-router 0.3.2 (its `power_of_two` compares two random workers)."""

    name = "least-load"

    def choose(self, req: Route, now_s: float) -> int:
        return self.least_loaded()
