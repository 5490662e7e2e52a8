"""What a policy keeps in the simulator's tree beyond SGLang: finished contexts with a time to
live (`Policy.context_ttl`), eviction priorities of agent prefixes (`Decision.prefix_priority`)
and host-tier prefetch (`Decision.prefetch`, and the timed upload of an offloaded context,
`Policy.context_action`). The plugin's adapter does the first two on a real
server the same way (`runners.sglang.bridge.Bridge`); prefetch needs a host tier, which only
the simulator has.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from topas_bench.runners.sim.radix import Node, RadixCache
from topas_bench.workloads.model import agent_key
from topas_bench.workloads.pieces import Piece


@dataclass(slots=True)
class ContextPin:
    """A finished request's context, locked at its last tree node until `expires_s`."""

    node: Node
    task_id: str
    expires_s: float
    ttl_s: float = 0.0


class ContextPins:
    """Locked finished contexts, by request id, with their expiries."""

    def __init__(self, cache: RadixCache) -> None:
        self.cache = cache
        self.pins: dict[int, ContextPin] = {}

    def __bool__(self) -> bool:
        return bool(self.pins)

    def nodes(self) -> list[Node]:
        return [p.node for p in self.pins.values()]

    def next_expiry(self) -> float:
        return min((p.expires_s for p in self.pins.values()), default=math.inf)

    def pin(
        self, rid: int, node: Node, task_id: str, expires_s: float, room: float, ttl_s: float = 0.0
    ) -> bool:
        """Lock `node`'s path if the evictable tokens it takes fit in `room` (as the adapter
        does: lock, measure, unlock when too dear)."""
        before = self.cache.evictable_tokens
        self.cache.lock(node)
        if before - self.cache.evictable_tokens > room:
            self.cache.unlock(node)
            return False
        self.pins[rid] = ContextPin(node, task_id, expires_s, ttl_s)
        return True

    def refresh(self, hit: Node, now_s: float) -> None:
        """Refresh on hit: a pin whose whole context lies on the matched path root..`hit`
        expires `ttl_s` from now, if that is later (a hit ending inside the context, e.g. on
        the agent prefix alone, refreshes nothing)."""
        if not self.pins:
            return
        path: set[int] = set()
        n: Node | None = hit
        while n is not None:
            path.add(id(n))
            n = n.parent
        for p in self.pins.values():
            if id(p.node) in path:
                p.expires_s = max(p.expires_s, now_s + p.ttl_s)

    def expire(self, now_s: float, live_tasks: Mapping[str, object]) -> None:
        """Release the pins whose time is up or whose task has ended."""
        for rid in sorted(self.pins):
            p = self.pins[rid]
            if p.expires_s <= now_s or p.task_id not in live_tasks:
                self.cache.unlock(p.node)
                del self.pins[rid]

    def release_all(self) -> None:
        for rid in sorted(self.pins):
            self.cache.unlock(self.pins.pop(rid).node)


def set_prefix_priorities(
    cache: RadixCache, priorities: Mapping[str, int], prefix_tokens: Mapping[str, int]
) -> None:
    """`Decision.prefix_priority`: the nodes of each agent's prefix on the GPU (read-only, as
    SGLang's `match_full_device_prefix` walks it) get the agent's priority; shared ones the
    highest."""
    best: dict[int, tuple[Node, int]] = {}
    for agent in sorted(priorities):
        tokens = prefix_tokens.get(agent, 0)
        if not tokens:
            continue
        p = priorities[agent]
        for node in cache.device_path([(agent_key(agent), 0, tokens)]):
            prev = best.get(id(node))
            if prev is None or p > prev[1]:
                best[id(node)] = (node, p)
    for node, priority in best.values():
        node.priority = priority


class Prefetcher:
    """`Decision.prefetch` (KVFlow's overlapped prefetch): the host-tier part of each agent's
    prefix goes back to the GPU, in order, while the admission budget holds it (its GPU
    ancestors locked while room is made; the first that does not fit stops it, as KVFlow's
    `load_back(check_reserve=True)`). The host link carries the loads one after the other; a
    prefill reading a node before its load ends waits for it (`stall`)."""

    def __init__(self, cache: RadixCache, load_s: Callable[[int], float]) -> None:
        self.cache = cache
        self.load_s = load_s
        self.link_free_s = 0.0  # when the link finishes its last load

    def run(
        self,
        agents: Sequence[str],
        prefix_tokens: Mapping[str, int],
        now_s: float,
        free: Callable[[], int],
        evict_for: Callable[[int], None],
    ) -> None:
        for agent in agents:
            key = [(agent_key(agent), 0, prefix_tokens.get(agent, 0))]
            if not self.load(key, now_s, free, evict_for):
                return

    def load(
        self,
        key: Sequence[Piece],
        now_s: float,
        free: Callable[[], int],
        evict_for: Callable[[int], None],
    ) -> bool:
        """Load the host-tier part of `key`'s cached path back to the GPU, on the link after
        the loads before it; False when it does not fit (nothing loaded)."""
        cache = self.cache
        gpu = cache.device_path(key)
        need = sum(n.tokens for n in cache.walk(key)[len(gpu) :])
        if not need:
            return True
        if need > free() + cache.evictable_tokens:
            return False
        if gpu:
            cache.lock(gpu[-1])
        evict_for(need)
        if gpu:
            cache.unlock(gpu[-1])
        host = [n for n in cache.walk(key)[len(gpu) :] if not n.on_gpu]
        need = sum(n.tokens for n in host)
        if not host or need > free():
            return False
        cache.load_back(host)
        self.link_free_s = max(now_s, self.link_free_s) + self.load_s(need)
        for n in host:
            n.ready_s = self.link_free_s
        return True

    def stall(self, last_nodes: Iterable[Node | None], now_s: float) -> float:
        """Seconds a prefill reading the paths ending at `last_nodes` waits for prefetches."""
        if self.link_free_s <= now_s:
            return 0.0
        ready = 0.0
        for n in last_nodes:
            while n is not None:
                ready = max(ready, n.ready_s)
                n = n.parent
        return max(0.0, ready - now_s)
