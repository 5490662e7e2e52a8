"""SGLang 0.5.23's `SchedulePolicy.calc_priority` on the simulator's waiting queue.

`managers/schedule_policy.py`, for the `--schedule-policy` a topas-bench policy needs
(`ServerNeeds.schedule_policy`); the policy decides afterwards, on the queue as this leaves it
(the plugin's `TopasSchedulePolicy` runs SGLang's own pass the same way). The simulator's whole
mirror of SGLang's queue pass is here, one row of `PASSES` per `--schedule-policy`:
- `_determine_active_policy`: `lpm` and `hrrn` fall back to `fcfs` above 128 waiting requests;
- cache-aware policies (`lpm`, `dfs-weight`, `hrrn`, `shortest-prefill-first`) match every
  waiting request (`_compute_prefix_matches`: splits, LRU stamps, the in-batch demotions of
  `lpm.in_batch_demotions`) and sort: `lpm` by matched length, `dfs-weight` depth-first over
  the tree, heaviest subtree first (`_dfs_weight_order`), `hrrn` by prefill tokens processed
  since the request queued per uncached input token (ties on the rid, which the reference
  engine makes `task/stage`), `shortest-prefill-first` by uncached work, then queue entry;
- `lof` sorts by `max_new_tokens`, longest first; `random` shuffles (`random.shuffle`, here a
  generator seeded by the policy, as the reference engine seeds SGLang's global one);
- cache-agnostic passes refresh the first 128 requests' prefixes every 32nd call
  (`_touch_waiting_prefixes`), only under LRU eviction;
- `shortest_prefill_chunk_limit`: under `shortest-prefill-first` the in-flight chunk is cut to
  leave room for the shorter waiting requests.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from topas_bench.runners.sim.radix import Node, RadixCache
from topas_bench.runners.sim.state import SimRequest
from topas_bench.schedulers.lpm import IN_BATCH_THRESHOLD, PREFIX_MATCH_MAX, in_batch_demotions

#: `SchedulePolicy.calc_priority`'s pass per `--schedule-policy` (`Pass`). Filled below the
#: class; covers `schedulers.base.SCHEDULE_POLICIES` (tests/test_needs.py).
PASSES: dict[str, Pass] = {}
#: SGLang's `WAITING_PREFIX_REFRESH_INTERVAL`.
PREFIX_REFRESH_INTERVAL = 32


Nodes = dict[int, Node]


class Order(Protocol):
    def __call__(
        self,
        qp: QueuePass,
        waiting: list[SimRequest],
        cache: RadixCache,
        nodes: Nodes,
        processed: int,
        /,
    ) -> list[SimRequest]:
        """The queue in the pass's order (`nodes`: each request's last matched node, when the
        pass matched them)."""
        ...


@dataclass(frozen=True, slots=True)
class Pass:
    """One `--schedule-policy`'s pass.

    order: how it orders the queue.
    cache_aware: it matches every waiting request first (`_compute_prefix_matches`); the
        others refresh prefixes (`_touch_waiting_prefixes`).
    falls_back: above 128 waiting requests it is `fcfs`'s (`_determine_active_policy`).
    cuts_chunk: it cuts the in-flight chunk for shorter waiting requests
        (`shortest_prefill_chunk_limit`).
    """

    order: Order
    cache_aware: bool = False
    falls_back: bool = False
    cuts_chunk: bool = False


class Matcher(Protocol):
    def __call__(self, req: SimRequest) -> tuple[int, Node]:
        """Match `req`'s fill in the tree (stamping it): (device tokens, last device node)."""
        ...


class QueuePass:
    """One server's `SchedulePolicy`: its counters and the last pass's matches."""

    def __init__(self, policy: str, eviction: str, seed: int = 0) -> None:
        if policy not in PASSES:
            raise ValueError(f"no SGLang queue pass {policy!r}; known: {', '.join(PASSES)}")
        self.policy = policy
        self.eviction = eviction
        self.rng = random.Random(seed)
        self._refresh_calls = 0
        #: rid -> `num_matched_prefix_tokens` from the last cache-aware pass
        self.matched: dict[int, int] = {}
        self.demoted: set[int] = set()

    def active(self, waiting: int) -> str:
        if PASSES[self.policy].falls_back and waiting > PREFIX_MATCH_MAX:
            return "fcfs"
        return self.policy

    def run(
        self, waiting: list[SimRequest], cache: RadixCache, match: Matcher, processed: int
    ) -> list[SimRequest]:
        """The queue after SGLang's pass (`processed`: its prefill-token counter)."""
        active = self.active(len(waiting))
        pass_ = PASSES[active]
        nodes: dict[int, Node] = {}
        if pass_.cache_aware:
            # `_compute_prefix_matches`: every waiting request matched (splits, LRU stamps)
            hits: dict[int, int] = {}
            self.matched = {}
            for r in waiting:
                hits[r.rid], nodes[r.rid] = match(r)
                self.matched[r.rid] = min(hits[r.rid], r.fill_tokens - 1)
            self.demoted = in_batch_demotions(waiting, hits, IN_BATCH_THRESHOLD, IN_BATCH_THRESHOLD)
        else:
            self._touch(waiting, match, active)
        return pass_.order(self, waiting, cache, nodes, processed)

    def _keep(
        self, waiting: list[SimRequest], cache: RadixCache, nodes: Nodes, processed: int
    ) -> list[SimRequest]:
        """`fcfs` (and `routing-key` here: the policy sorts by agent, `sglang_stock`)."""
        return waiting

    def _longest_output(
        self, waiting: list[SimRequest], cache: RadixCache, nodes: Nodes, processed: int
    ) -> list[SimRequest]:
        """`_sort_by_longest_output`: `max_new_tokens`, longest first."""
        return sorted(waiting, key=lambda r: -r.max_new_tokens)

    def _shuffle(
        self, waiting: list[SimRequest], cache: RadixCache, nodes: Nodes, processed: int
    ) -> list[SimRequest]:
        """`_sort_randomly`: a shuffle from the server's seeded generator."""
        out = list(waiting)
        self.rng.shuffle(out)
        return out

    def _longest_prefix(
        self, waiting: list[SimRequest], cache: RadixCache, nodes: Nodes, processed: int
    ) -> list[SimRequest]:
        """`_sort_by_longest_prefix`: matched length, longest first; demoted requests last."""
        inf = float("inf")
        return sorted(waiting, key=lambda r: inf if r.rid in self.demoted else -self.matched[r.rid])

    def _dfs_weight(
        self, waiting: list[SimRequest], cache: RadixCache, nodes: Nodes, processed: int
    ) -> list[SimRequest]:
        """`_sort_by_dfs_weight` (`dfs_weight_order`)."""
        return dfs_weight_order(cache.root, waiting, nodes)

    def _hrrn(
        self, waiting: list[SimRequest], cache: RadixCache, nodes: Nodes, processed: int
    ) -> list[SimRequest]:
        """`_sort_by_hrrn`: the highest response ratio first."""
        return sorted(waiting, key=lambda r: self._hrrn_key(r, processed))

    def _shortest_prefill(
        self, waiting: list[SimRequest], cache: RadixCache, nodes: Nodes, processed: int
    ) -> list[SimRequest]:
        """`_sort_by_shortest_prefill`: the least uncached work first, then queue entry."""
        return sorted(waiting, key=lambda r: (r.rid in self.demoted, self._work(r), r.enqueue_seq))

    def replayable(self, waiting: int) -> bool:
        """Whether a pass over an unchanged queue only repeats itself: it reorders nothing
        and draws nothing (the cache-agnostic `fcfs` pass: its touches, every 32nd call, are
        the only effect, `runners.sim.standing` replays them)."""
        return self.active(waiting) == "fcfs"

    def passes_to_refresh(self, waiting: int) -> int | None:
        """How many passes over `waiting` requests come before the next one that touches
        their prefixes (0: the next one does); None if none ever does."""
        if not waiting or self.eviction != "lru":
            return None
        return -self._refresh_calls % PREFIX_REFRESH_INTERVAL

    def skip(self, waiting: int, passes: int = 1) -> None:
        """Count `passes` passes whose touches, if any, would change nothing."""
        if waiting and self.eviction == "lru":
            self._refresh_calls += passes

    def _touch(self, waiting: list[SimRequest], match: Matcher, active: str) -> None:
        if not waiting or self.eviction != "lru":
            return
        refresh = self._refresh_calls % PREFIX_REFRESH_INTERVAL == 0
        self._refresh_calls += 1
        if refresh:
            for r in reversed(waiting[:PREFIX_MATCH_MAX]):
                match(r)

    def _work(self, r: SimRequest) -> int:
        """`_shortest_prefill_work`: uncached fill tokens, at least 1."""
        return max(1, r.fill_tokens - self.matched.get(r.rid, 0))

    def _hrrn_key(self, r: SimRequest, processed: int) -> tuple[float, str]:
        rid = f"{r.task_id}/{r.stage_id}"
        if r.rid in self.demoted:
            return (float("inf"), rid)
        uncached = max(0, r.prompt_tokens - self.matched[r.rid])
        if uncached <= 0:
            return (-float("inf"), rid)
        waited = max(0, processed - r.arrival_processed_tokens)
        return (-(waited / uncached), rid)

    def chunk_limit(
        self, chunked: SimRequest, waiting: Sequence[SimRequest], budget: int
    ) -> int | None:
        """`shortest_prefill_chunk_limit` (page size 1), None when it does not apply."""
        if not PASSES[self.policy].cuts_chunk or budget < 2:
            return None
        remaining = chunked.fill_tokens - chunked.prefix_len
        reserved = 0
        for r in waiting:
            work = self._work(r)
            if work >= remaining or reserved + work > budget - 1:
                break
            reserved += work
        return budget - reserved if reserved else None


PASSES.update({
    "fcfs": Pass(QueuePass._keep),
    "lof": Pass(QueuePass._longest_output),
    "random": Pass(QueuePass._shuffle),
    "routing-key": Pass(QueuePass._keep),
    "lpm": Pass(QueuePass._longest_prefix, cache_aware=True, falls_back=True),
    "dfs-weight": Pass(QueuePass._dfs_weight, cache_aware=True),
    "hrrn": Pass(QueuePass._hrrn, cache_aware=True, falls_back=True),
    "shortest-prefill-first": Pass(QueuePass._shortest_prefill, cache_aware=True, cuts_chunk=True),
})  # fmt: skip
#: The policies whose pass matches every waiting request.
CACHE_AWARE = frozenset(name for name, p in PASSES.items() if p.cache_aware)


def dfs_weight_order(
    root: Node, waiting: Sequence[SimRequest], nodes: dict[int, Node]
) -> list[SimRequest]:
    """`_dfs_weight_order`: weight = waiting requests whose match ends at or below a node;
    depth-first from the root, children heaviest first (ties in the tree's child order), a
    node's requests in queue order after its subtree."""
    at: dict[int, list[SimRequest]] = {}
    for r in waiting:
        at.setdefault(id(nodes[r.rid]), []).append(r)
    weight: dict[int, int] = {k: len(v) for k, v in at.items()}
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, visited = stack.pop()
        if visited:
            w = weight.get(id(node), 0)
            w += sum(weight.get(id(c), 0) for c in node.children.values())
            weight[id(node)] = w
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(list(node.children.values())))
    order: list[SimRequest] = []
    stack = [(root, False)]
    while stack:
        node, visited = stack.pop()
        if visited:
            order.extend(at.get(id(node), ()))
            continue
        children = sorted(node.children.values(), key=lambda c: -weight.get(id(c), 0))
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(children))
    return order
