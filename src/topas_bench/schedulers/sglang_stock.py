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
  do not have. Not a scheduler here (`REFUSED`).

SGLang's own pass sorts the queue before the policy decides, in both engines
(`runners.sim.calc_priority`, and the server's `SchedulePolicy` behind the plugin), so these
policies keep the queue's order (`routing-key` sorts by agent itself: the plugin's requests carry
no routing key). Each takes the radix eviction policy the server runs with (`eviction`: `lru`,
`lfu`, `slru`, `priority`; `slru_protected_threshold`), like `lpm-slru`, `lpm-lfu` and
`lpm-priority` (`lpm` under SGLang's `slru`, `lfu` and `priority` eviction).

They are rows of one table (`STOCK`): a row names the scheduler, SGLang's `--schedule-policy`,
the eviction policy (fixed, or the `eviction` parameter) and what decides after SGLang's pass;
`Stock` is the policy a row builds, its server needs (`ServerNeeds`) derived from the row and
its parameters. `fcfs` and `lpm` have their own modules (`lpm` has thresholds of its own).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from topas_bench.schedulers.base import (
    EVICTION_POLICIES,
    SCHEDULE_POLICIES,
    Decision,
    Policy,
    RequestView,
    ServerNeeds,
)
from topas_bench.schedulers.fcfs import FCFS
from topas_bench.schedulers.lpm import LPM
from topas_bench.schedulers.validate import InvalidParameter, reject_unknown, require_int
from topas_bench.schedulers.view import EngineView

#: `--schedule-policy` values SGLang 0.5.23's argument parser accepts (`arg_groups/fields/
#: schedule.py`) that are no scheduler here, and why.
REFUSED = {
    "priority": "SchedulePolicy refuses it (Unknown schedule_policy): the server does not start",
}
#: SGLang's default `slru` protected threshold (`--radix-eviction-policy-config`).
SLRU_PROTECTED_THRESHOLD = 2


class AgentsInBatchFirst(Policy):
    """`_sort_by_routing_key`, the agent as key: `(0, -count, key)` for a key the running batch
    has, else `(1, 0, key)`; a stable sort, nothing when the running batch has no key."""

    def decide(self, view: EngineView) -> Decision:
        counts = Counter(r.agent for r in view.running if r.agent)
        if not counts:
            return Decision(admit=list(view.waiting))

        def key(r: RequestView) -> tuple[int, int, str]:
            if r.agent and r.agent in counts:
                return (0, -counts[r.agent], r.agent)
            return (1, 0, r.agent or "")

        return Decision(admit=sorted(view.waiting, key=key))


@dataclass(frozen=True, slots=True)
class StockRow:
    """One of SGLang's own scheduling choices as a scheduler: a row of `STOCK`.

    name: the scheduler's name; summary: one line (`topas-bench schedulers list`).
    schedule_policy: SGLang's `--schedule-policy`, whose pass orders the queue.
    eviction: SGLang's `--radix-eviction-policy`, or None for the `eviction` parameter (`lru`
        by default). Under `slru`, or with `eviction` free, the row takes
        `slru_protected_threshold`; under `random`, the shuffle's `seed`.
    decides: the policy that decides after SGLang's pass: `FCFS` keeps the order the pass
        left; `LPM` sorts as SGLang's `lpm` does (which changes nothing after its pass);
        `AgentsInBatchFirst` is `routing-key`'s sort (the plugin's requests carry no key).
    """

    name: str
    schedule_policy: str
    eviction: str | None
    summary: str
    decides: type[Policy] = FCFS

    def __post_init__(self) -> None:
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"{self.name}: unknown schedule policy {self.schedule_policy!r}")
        if self.eviction is not None and self.eviction not in EVICTION_POLICIES:
            raise ValueError(f"{self.name}: unknown eviction policy {self.eviction!r}")

    @property
    def param_names(self) -> tuple[str, ...]:
        names: tuple[str, ...] = ("eviction",) if self.eviction is None else ()
        if self.eviction in (None, "slru"):
            names += ("slru_protected_threshold",)
        if self.schedule_policy == "random":
            names += ("seed",)
        return names

    def __call__(self, **params: Any) -> Stock:
        """A fresh policy for this row; bad parameters raise `InvalidParameter`, named."""
        return Stock(self, **params)


class Stock(Policy):
    """An SGLang `--schedule-policy` under a radix eviction policy; SGLang's pass orders."""

    def __init__(self, row: StockRow, **params: Any) -> None:
        self.name = row.name
        self.row = row
        valid = row.param_names
        reject_unknown(self.name, params, valid)
        eviction = params.get("eviction", row.eviction or "lru")
        if eviction not in EVICTION_POLICIES:
            raise InvalidParameter(
                f"{self.name}: eviction must be one of {', '.join(EVICTION_POLICIES)}, got "
                f"{eviction!r}"
            )
        self._params: dict[str, Any] = {}
        if "eviction" in valid:
            self._params["eviction"] = eviction
        threshold = params.get("slru_protected_threshold", SLRU_PROTECTED_THRESHOLD)
        if "slru_protected_threshold" in valid:
            require_int(self.name, "slru_protected_threshold", threshold, 1)
            self._params["slru_protected_threshold"] = threshold
        seed = params.get("seed", 0)
        if "seed" in valid:
            self._params["seed"] = require_int(self.name, "seed", seed, 0)
        fields: dict[str, Any] = {"schedule_policy": row.schedule_policy, "native": True}
        if row.schedule_policy == "random":
            fields["seed"] = seed
        self._needs = (
            ServerNeeds.slru(threshold, **fields)
            if eviction == "slru"
            else ServerNeeds(eviction=eviction, **fields)
        )
        self._decides = row.decides()

    @property
    def params(self) -> dict[str, Any]:
        return dict(self._params)

    @property
    def needs(self) -> ServerNeeds:
        return self._needs

    def decide(self, view: EngineView) -> Decision:
        return self._decides.decide(view)


#: SGLang 0.5.23's own scheduling choices beyond `fcfs` and `lpm`, in registration order.
STOCK = (
    StockRow(
        "dfs-weight", "dfs-weight", None,
        "SGLang's `dfs-weight`: the radix subtree with the most waiting requests first.",
    ),
    StockRow("lof", "lof", None, "SGLang's `lof`: the longest `max_new_tokens` first."),
    StockRow(
        "random", "random", None,
        "SGLang's `random`: the queue shuffled at every pass, from `seed`.",
    ),
    StockRow(
        "hrrn", "hrrn", None,
        "SGLang's `hrrn`: highest (prefill tokens served since queued / uncached tokens) first.",
    ),
    StockRow(
        "routing-key", "routing-key", None,
        "SGLang's `routing-key`, the agent as key: agents most present in the running batch "
        "first.",
        AgentsInBatchFirst,
    ),
    StockRow(
        "lpm-slru", "lpm", "slru",
        "`lpm` with SGLang's `slru` eviction: nodes hit twice (by default) outlive the others.",
        LPM,
    ),
    StockRow(
        "lpm-lfu", "lpm", "lfu",
        "`lpm` with SGLang's `lfu` eviction (least hit first, then least recent).",
        LPM,
    ),
    StockRow(
        "lpm-priority", "lpm", "priority",
        "`lpm` with SGLang's `priority` eviction: outputs before prompts (prompt retention).",
        LPM,
    ),
    StockRow(
        "shortest-prefill-first", "shortest-prefill-first", None,
        "SGLang's `shortest-prefill-first`: the least uncached prefill work first.",
    ),
)  # fmt: skip
