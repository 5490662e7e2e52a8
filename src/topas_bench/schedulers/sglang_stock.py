"""SGLang 0.5.23's own scheduling choices, as they are: how far tuning stock SGLang gets.

Every `--schedule-policy` value the 0.5.23 server accepts (`arg_groups/fields/schedule.py`),
each as SGLang implements it (`managers/schedule_policy.py`, `SchedulePolicy.calc_priority`):
- `fcfs`, `lpm`: `schedulers.fcfs`, `schedulers.lpm`;
- `dfs-weight`: depth-first over the radix tree, the subtree with the most waiting requests
  first (`_sort_by_dfs_weight`);
- `lof`: longest `max_new_tokens` first (`_sort_by_longest_output`);
- `random`: a shuffle per pass (`_sort_randomly`), seeded (`seed`);
- `hrrn`: highest response ratio next, prefill tokens processed since a request queued over
  its uncached input tokens (`_sort_by_hrrn`; `lpm`'s in-batch demotions; `fcfs` above 128
  waiting);
- `shortest-prefill-first`: least uncached work first, cutting the in-flight chunk to leave
  room for shorter requests (`_sort_by_shortest_prefill`, `shortest_prefill_chunk_limit`);
- `routing-key`: requests whose routing key is most frequent in the running batch first
  (`_sort_by_routing_key`); the routing key here is the request's agent, so it groups an
  agent's calls (the reference engine sends the agent as `routing_key`);
- `priority` is accepted by the server's argument parser but not by `SchedulePolicy`
  (`Unknown schedule_policy: policy='priority'`: the server does not start); priority
  scheduling is `--enable-priority-scheduling`, which needs request priorities these workloads
  do not have. Not a scheduler here.

SGLang's own pass sorts the queue before the policy decides, in both engines
(`runners.sim.calc_priority`, and the server's `SchedulePolicy` behind the plugin), so these
policies keep the queue's order (`routing-key` sorts by agent itself: the plugin's requests carry
no routing key). Each takes the radix eviction policy the server runs with (`eviction`: `lru`,
`lfu`, `slru`, `priority`; `slru_protected_threshold`), like `lpm-slru`, `lpm-lfu` and
`lpm-priority` (`lpm` under SGLang's `slru`, `lfu` and `priority` eviction).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

from topas_bench.runners.sim.evict import POLICIES
from topas_bench.schedulers.base import (
    Decision,
    EngineView,
    InvalidParameter,
    Policy,
    RequestView,
    require_int,
)
from topas_bench.schedulers.lpm import LPM


class Stock(Policy):
    """An SGLang `--schedule-policy` under a radix eviction policy; SGLang's pass orders."""

    def __init__(self, eviction: str = "lru", slru_protected_threshold: int = 2) -> None:
        if eviction not in POLICIES:
            raise InvalidParameter(
                f"{self.name}: eviction must be one of {', '.join(POLICIES)}, got {eviction!r}"
            )
        require_int(self.name, "slru_protected_threshold", slru_protected_threshold, 1)
        self.eviction = eviction
        self.slru_protected_threshold = slru_protected_threshold
        self.radix_eviction_policy = eviction  # type: ignore[misc]
        if eviction == "slru":
            self.radix_eviction_config = {"protected_threshold": slru_protected_threshold}  # type: ignore[misc]

    @property
    def params(self) -> dict[str, Any]:
        return {
            "eviction": self.eviction,
            "slru_protected_threshold": self.slru_protected_threshold,
        }

    def decide(self, view: EngineView) -> Decision:
        return Decision(admit=list(view.waiting))


class DfsWeight(Stock):
    """SGLang's `dfs-weight`: the radix subtree with the most waiting requests first."""

    name = "dfs-weight"
    sglang_policy: ClassVar[str] = "dfs-weight"


class LongestOutputFirst(Stock):
    """SGLang's `lof`: the longest `max_new_tokens` first."""

    name = "lof"
    sglang_policy: ClassVar[str] = "lof"


class HRRN(Stock):
    """SGLang's `hrrn`: highest (prefill tokens served since queued / uncached tokens) first."""

    name = "hrrn"
    sglang_policy: ClassVar[str] = "hrrn"


class ShortestPrefillFirst(Stock):
    """SGLang's `shortest-prefill-first`: the least uncached prefill work first."""

    name = "shortest-prefill-first"
    sglang_policy: ClassVar[str] = "shortest-prefill-first"


class RandomOrder(Stock):
    """SGLang's `random`: the queue shuffled at every pass, from `seed`."""

    name = "random"
    sglang_policy: ClassVar[str] = "random"

    def __init__(
        self, eviction: str = "lru", slru_protected_threshold: int = 2, seed: int = 0
    ) -> None:
        super().__init__(eviction, slru_protected_threshold)
        self.sglang_seed = require_int(self.name, "seed", seed, 0)  # type: ignore[misc]

    @property
    def params(self) -> dict[str, Any]:
        return {**super().params, "seed": self.sglang_seed}


class RoutingKey(Stock):
    """SGLang's `routing-key`, the agent as key: agents most present in the running batch first.

    `_sort_by_routing_key`: `(0, -count, key)` for a key the running batch has, else
    `(1, 0, key)`; a stable sort, nothing when the running batch has no key."""

    name = "routing-key"
    sglang_policy: ClassVar[str] = "routing-key"

    def decide(self, view: EngineView) -> Decision:
        counts = Counter(r.agent for r in view.running if r.agent)
        if not counts:
            return super().decide(view)

        def key(r: RequestView) -> tuple[int, int, str]:
            if r.agent and r.agent in counts:
                return (0, -counts[r.agent], r.agent)
            return (1, 0, r.agent or "")

        return Decision(admit=sorted(view.waiting, key=key))


class LPMSlru(LPM):
    """`lpm` with SGLang's `slru` eviction: nodes hit twice (by default) outlive the others."""

    name = "lpm-slru"
    radix_eviction_policy: ClassVar[str] = "slru"

    def __init__(self, slru_protected_threshold: int = 2) -> None:
        super().__init__()
        require_int(self.name, "slru_protected_threshold", slru_protected_threshold, 1)
        self.slru_protected_threshold = slru_protected_threshold
        self.radix_eviction_config = {"protected_threshold": slru_protected_threshold}  # type: ignore[misc]

    @property
    def params(self) -> dict[str, Any]:
        return {"slru_protected_threshold": self.slru_protected_threshold}


class LPMLfu(LPM):
    """`lpm` with SGLang's `lfu` eviction (least hit first, then least recent)."""

    name = "lpm-lfu"
    radix_eviction_policy: ClassVar[str] = "lfu"

    def __init__(self) -> None:
        super().__init__()

    @property
    def params(self) -> dict[str, Any]:
        return {}


class LPMPriority(LPM):
    """`lpm` with SGLang's `priority` eviction: outputs before prompts (prompt retention)."""

    name = "lpm-priority"
    radix_eviction_policy: ClassVar[str] = "priority"

    def __init__(self) -> None:
        super().__init__()

    @property
    def params(self) -> dict[str, Any]:
        return {}
