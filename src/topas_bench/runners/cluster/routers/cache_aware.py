"""sglang-router 0.3.2's `cache_aware` policy, rule for rule.

Read from the `sglang-router==0.3.2` sdist (`src/policies/cache_aware.rs`, `select_worker`;
defaults from `sglang_router/router_args.py`, which the CLI passes; the Rust `Default` differs
and is not what `sglang-router` runs with). Per request:
1. loads = the router's in-flight counts (+1 when routed, -1 when the response ends; only
   `cache_aware` and `manual` count them), min and max over all workers;
2. imbalanced when `max - min > balance_abs_threshold` and `max > balance_rel_threshold * min`
   (both strict): the least-loaded worker (first in registry order on ties), and the request is
   still inserted into the tree under it;
3. else `prefix_match` on the shared tree (`tree.ApproxTree`): match rate = matched / length
   (f32; 0 for an empty text); above `cache_threshold` (strict) the matched node's tenant,
   otherwise the least-loaded worker; the request is inserted under the chosen worker;
4. every `eviction_interval_secs` a background task shrinks each worker above `max_tree_size`
   units (`tree.ApproxTree.evict`); here it runs at the first routing after each interval of
   simulated time (nothing changes the tree in between).
Workers are registered by `insert("", worker)` in registry order (`init_workers`). All workers
are healthy here, so the stale-tenant branch (remove the tenant, take the first healthy worker)
never runs.

The simulator matches token runs (`tree.TOKENS`); the real router matches characters of the
request text (`tree.TEXT`, used when checking against it: docs/cluster.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from topas_bench.runners.cluster.routers.base import Cluster, Route, Router, check_number
from topas_bench.runners.cluster.tree import TOKENS, ApproxTree, Units


class CacheAware(Router):
    name = "cache-aware"

    @dataclass(frozen=True)
    class Params:
        """sglang-router's `--cache-threshold`, `--balance-abs-threshold` (requests),
        `--balance-rel-threshold`, `--eviction-interval-secs` (0: never) and `--max-tree-size`
        (units per worker: characters there, tokens in the simulator)."""

        cache_threshold: float = 0.3
        balance_abs_threshold: int = 64
        balance_rel_threshold: float = 1.5
        eviction_interval_secs: int = 60
        max_tree_size: int = 2**26

        def __post_init__(self) -> None:
            r = "cache-aware"
            check_number(r, "cache_threshold", self.cache_threshold, 0.0, integer=False)
            check_number(r, "balance_abs_threshold", self.balance_abs_threshold, 0, integer=True)
            check_number(r, "balance_rel_threshold", self.balance_rel_threshold, 0, integer=False)
            check_number(r, "eviction_interval_secs", self.eviction_interval_secs, 0, integer=True)
            check_number(r, "max_tree_size", self.max_tree_size, 0, integer=True)

    def __init__(self, cluster: Cluster, params: Any = None, units: Units[Any] = TOKENS) -> None:
        super().__init__(cluster, params)
        self.tree: ApproxTree[Any] = ApproxTree(units)
        for k in self.order:
            self.tree.insert(units.empty, k)
        self._threshold = np.float32(self.p.cache_threshold)
        interval = float(self.p.eviction_interval_secs)
        self._next_eviction_s = interval if interval > 0 else math.inf
        self.hits = self.misses = self.spills = 0
        self.last_match = -1  # units the latest decision matched (-1: decided on load alone)

    def choose(self, req: Route, now_s: float) -> int:
        k = self.decide(req, now_s)
        self.tree.insert(req.key, k)
        return k

    def decide(self, req: Route, now_s: float) -> int:
        """The worker for `req`; the tree learns of it only through `choose` (a replay against
        the real router inserts the worker that router chose instead, `replay.agreement`)."""
        self._evict_due(now_s)
        loads, p = self.loads, self.p
        if self.imbalanced(max(loads), min(loads), p.balance_abs_threshold,
                           p.balance_rel_threshold):  # fmt: skip
            k = self.least_loaded()
            self.spills += 1
            self.last_match = -1
        else:
            matched, tenant = self.tree.prefix_match(req.key)
            self.last_match = matched
            total = self.tree.units.length(req.key)
            rate = np.float32(matched) / np.float32(total) if total else np.float32(0.0)
            if rate > self._threshold and tenant is not None:
                k = tenant
                self.hits += 1
            else:
                k = self.least_loaded()
                self.misses += 1
        return k

    def _evict_due(self, now_s: float) -> None:
        if now_s < self._next_eviction_s:
            return
        self.tree.evict(self.p.max_tree_size)
        interval = float(self.p.eviction_interval_secs)
        self._next_eviction_s = (math.floor(now_s / interval) + 1) * interval

    def stats(self) -> dict[str, Any]:
        return {"cache_hits": self.hits, "cache_misses": self.misses, "balance_spills": self.spills}
