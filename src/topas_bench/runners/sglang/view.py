"""The `EngineView` of an SGLang server (`SglangView`): what a policy sees at one scheduling
point, read from the server's queues, cache and allocator through its `bridge.Bridge`, as the
simulator's view (`runners.sim.view`) answers, so a policy decides alike on both."""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sglang.srt.managers.schedule_batch import Req  # type: ignore[import-not-found]
from sglang.srt.managers.schedule_policy import (  # type: ignore[import-not-found]
    CLIP_MAX_NEW_TOKENS,
)
from sglang.srt.mem_cache.base_prefix_cache import (  # type: ignore[import-not-found]
    MatchPrefixParams,
)
from sglang.srt.mem_cache.radix_cache import RadixKey  # type: ignore[import-not-found]

from topas_bench.runners.sglang.tracker import TrackedRequest, TrackedTask, Tracker
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.schedulers.view import PrefixLocation, PrefixView


class ServerState(Protocol):
    """What the view reads of a server: its queues' tracker, cache, allocator, budget and pins
    (`bridge.Bridge` is one; a protocol, so that the view needs no import of the bridge)."""

    @property
    def tracker(self) -> Tracker: ...
    @property
    def tree_cache(self) -> Any: ...
    @property
    def allocator(self) -> Any: ...
    @property
    def kv_budget_tokens(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    @property
    def pins(self) -> Mapping[str, Any]: ...
    def cached(self, token_ids: Sequence[int]) -> int: ...
    def reserved(self, running: Sequence[Req]) -> float: ...
    def agent_in_use(self, agent: str, running: Sequence[Req]) -> bool: ...


def device_prefix_len(tree_cache: Any, token_ids: Sequence[int]) -> int:
    """How many leading tokens of `token_ids` are on the device, read-only: the tree core's
    `match_full_device_prefix` neither splits a node nor refreshes LRU times, so looking does
    not change what SGLang later evicts (`match_prefix` does both)."""
    key = RadixKey(token_ids=array("q", token_ids))
    core = getattr(tree_cache, "tree_core", None)
    if core is not None:
        return int(core.match_full_device_prefix(key)[0])
    return int(tree_cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len)


class SglangView:
    """The `EngineView` of an SGLang server at one scheduling point."""

    def __init__(self, bridge: ServerState, waiting: Sequence[Req], running: Sequence[Req]) -> None:
        self._b = bridge
        self._t = bridge.tracker
        self._waiting_reqs = waiting
        self._running_reqs = running
        self._hits: dict[str, int] = {}

    @property
    def now_s(self) -> float:
        return self._t.clock()

    @property
    def kv_budget_tokens(self) -> int:
        return self._b.kv_budget_tokens

    @property
    def free_tokens(self) -> int:
        return int(self._b.allocator.available_size())

    @property
    def evictable_tokens(self) -> int:
        return int(self._b.tree_cache.evictable_size())

    @property
    def locked_tokens(self) -> int:
        return int(self._b.tree_cache.protected_size())

    @property
    def running_tokens(self) -> int:
        used = self.kv_budget_tokens - self.free_tokens
        return max(used - self.evictable_tokens - self.locked_tokens, 0)

    @property
    def host_capacity_tokens(self) -> int:
        return 0

    @property
    def reserved_tokens(self) -> float:
        return self._b.reserved(self._running_reqs)

    @property
    def waiting(self) -> Sequence[TrackedRequest]:
        return [self._t.get(r) for r in self._waiting_reqs]

    @property
    def running(self) -> Sequence[TrackedRequest]:
        return [self._t.get(r) for r in self._running_reqs]

    @property
    def tasks(self) -> Mapping[str, TrackedTask]:
        return self._t.tasks

    @property
    def estimator(self) -> ServiceEstimator:
        return self._t.estimator

    def cached_tokens(self, req: Any) -> int:
        rid = req.engine.rid
        if rid not in self._hits:
            ids = list(req.engine.origin_input_ids) + list(req.engine.output_ids)
            self._hits[rid] = self._b.cached(ids)
        return self._hits[rid]

    def admission_need(self, req: Any) -> int:
        """`PrefillAdder.add_one_req`'s total_tokens: extend + clipped max_new + one page."""
        extend: int = req.prompt_tokens + req.generated - self.cached_tokens(req)
        left = min(max(req.max_new_tokens - req.generated, 0), int(CLIP_MAX_NEW_TOKENS))
        return max(extend, 1) + int(left) + self._b.page_size

    def lock_cost(self, req: Any) -> int:
        """Evictable tokens on `req`'s matched path. Approximation: the agent prefix part is
        already locked when a running request of the agent (or a pin) holds it."""
        hit = self.cached_tokens(req)
        if req.agent and self._b.agent_in_use(req.agent, self._running_reqs):
            return max(hit - len(self._t.agent_prefixes.get(req.agent, ())), 0)
        return hit

    def admission_costs(self, reqs: Sequence[Any]) -> list[int]:
        return [self.admission_need(r) + self.lock_cost(r) for r in reqs]

    def absent_reload_s(self, agent: str) -> float:
        """No host tier here: the prefill time to recompute the prefix."""
        ids = self._t.agent_prefixes.get(agent)
        return self._t.estimator.prefill_s(len(ids)) if ids else 0.0

    def reload_s(self, agent: str) -> float:
        ids = self._t.agent_prefixes.get(agent)
        if not ids:
            return 0.0
        if self._b.cached(ids) >= len(ids):
            return 0.0
        return self._t.estimator.prefill_s(len(ids))

    def prefixes(self) -> Sequence[PrefixView]:
        out = []
        users: dict[str, int] = {}
        for r in self.running:
            users[r.agent] = users.get(r.agent, 0) + 1
        for agent, ids in sorted(self._t.agent_prefixes.items()):
            on_gpu = self._b.cached(ids) >= len(ids)
            where = PrefixLocation.GPU if on_gpu else PrefixLocation.NONE
            kept = agent in self._b.pins
            out.append(
                PrefixView(agent, len(ids), where, users.get(agent, 0) if on_gpu else 0, kept)
            )
        return out
