"""Radix eviction orders, mirroring SGLang 0.5.23's `--radix-eviction-policy` strategies.

`mem_cache/evict_policy.py`: eviction pops the unlocked leaf with the smallest key, so a
strategy is a key of a node. Keys end in the node's last access time, unique per cache, so the
order is total and deterministic.
- `lru`: `last_access_time` (the default);
- `lfu`: `(hit_count, last_access_time)`;
- `slru`: `(hit_count >= protected_threshold, last_access_time)`: nodes hit at least
  `protected_threshold` times (default 2) are evicted only when no probationary one is left;
- `priority`: `(priority, last_access_time)`: lower priority first. A node's priority is the
  highest priority of the requests whose inserts walked it (`max` on every walk, a split copies
  it); SGLang also re-inserts a finished request's prompt at priority + 1
  (`UnifiedRadixCache.checkpoint_into_tree`), so without request priorities outputs (0) go
  before prompts (1): the prompt is retained.

A hit is counted on a node by an insert that walks past the inserting request's previously
inserted length (`UnifiedTreeCore._finish_insert_walk_node`, `_should_backup_after_insert`): a
node counts each request once. `tlru` (Tail-Optimized LRU) is not mirrored: it needs each
branch's high-water depth, bookkeeping the simulator does not keep.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from topas_bench.schedulers.base import EVICTION_POLICIES

#: the policies mirrored, as the policy interface names them (`ServerNeeds.eviction`)
POLICIES = EVICTION_POLICIES


class Scored(Protocol):
    last_access: float
    hit_count: int
    priority: int


Key = Callable[[Scored], Any]


def eviction_key(policy: str, slru_protected_threshold: int = 2) -> Key:
    """The sort key SGLang's strategy `policy` gives a node (smaller is evicted first)."""
    if policy == "lru":
        return lambda n: n.last_access
    if policy == "lfu":
        return lambda n: (n.hit_count, n.last_access)
    if policy == "slru":
        t = slru_protected_threshold
        return lambda n: (n.hit_count >= t, n.last_access)
    if policy == "priority":
        return lambda n: (n.priority, n.last_access)
    raise ValueError(f"unknown radix eviction policy {policy!r}; known: {', '.join(POLICIES)}")
