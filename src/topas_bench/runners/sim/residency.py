"""What the simulated server holds in KV: the radix cache, private KV and what a policy keeps
(SGLang 0.5.23's `mem_cache`: `UnifiedRadixCache`, `alloc_token_slots`, `evict_from_tree_cache`;
mini-sglang's `CacheManager`).

KV bookkeeping is SGLang's: a batch allocates its extend tokens when it forms; a prefill's
tokens join the radix tree when it ends (`checkpoint_kv_cache`), the request's lock moving to
them; a decode step allocates one token per request for the last token's KV; a finished request
inserts its prompt and all outputs but the last (`release_kv_cache`), a retracted or preempted
one frees its private KV and releases its lock without inserting, then evicts enough cache to
leave `remaining requests * retract_decode_steps` tokens free (`release_req`).

Beyond SGLang, a policy keeps agents' prefixes (`Decision.keep_prefixes`) and finished contexts
(`Policy.context_ttl`) locked in the tree, as the plugin's adapter does on a real server; with
a host tier, it may offload a finished context and have it uploaded at a time it names
(`Policy.context_action`, simulator only).
"""

from __future__ import annotations

import heapq
from typing import Any

from topas_bench.runners.sim.admission import running_offset
from topas_bench.runners.sim.core import SimCore, SimulationError
from topas_bench.runners.sim.radix import Match, Node
from topas_bench.runners.sim.state import SimRequest
from topas_bench.runners.sim.view import SimView
from topas_bench.workloads.model import agent_key
from topas_bench.workloads.pieces import Piece, take


class Residency(SimCore):
    """The simulator's KV memory and cache residency (`engine.Simulator`'s lowest manager)."""

    def _match(self, key: list[Piece], limit: int | None = None) -> Match:
        return self.cache.match(key, limit)

    def _match_req(self, req: SimRequest) -> tuple[int, Node]:
        m = self.cache.match(req.fill())
        return m.gpu_tokens, m.node

    def _evict_for(self, tokens: int) -> None:
        """`evict_from_tree_cache`: evict until `tokens` are free (or nothing is evictable)."""
        short = tokens - self.free_tokens
        if short > 0:
            self.cache.evict(short)

    def _alloc(self, tokens: int) -> None:
        """`alloc_token_slots`: evict the shortfall, then take `tokens` of KV."""
        self._evict_for(tokens)
        if self.free_tokens < tokens:
            raise SimulationError(
                f"out of KV memory allocating {tokens} tokens ({self.free_tokens} free); "
                "SGLang raises here too"
            )
        self.private_tokens += tokens

    def _insert(self, req: SimRequest, up_to: int) -> Node:
        """`UnifiedRadixCache.checkpoint_into_tree`'s inserts: the fill's first `up_to` tokens
        (hits counted past what the request inserted before), then, when the fill goes past
        the prompt, the prompt again at priority 1 (the prompt outlives the output under
        `priority` eviction). Requests carry SGLang's default priority, 0."""
        fill = req.fill()
        last, _ = self.cache.insert(take(fill, up_to)[0], 0, req.inserted_len)
        req.inserted_len = max(req.inserted_len, up_to)
        if 0 < req.prompt_tokens < up_to:
            self.cache.insert(take(fill, req.prompt_tokens)[0], 1)
        return last

    def _checkpoint(self, req: SimRequest, up_to: int) -> None:
        """`checkpoint_kv_cache`: the computed fill joins the tree, the lock moves to it."""
        assert req.lock_node is not None
        last = self._insert(req, up_to)
        self.private_tokens -= up_to - req.prefix_len
        req.private_tokens -= up_to - req.prefix_len
        self.cache.lock(last)
        self.cache.unlock(req.lock_node)
        req.lock_node = last
        req.prefix_len = up_to

    def _load_back(self, req: SimRequest, match: Match) -> None:
        """Bring a just-admitted request's host-tier hit back to the GPU (`init_load_back`):
        the nodes go on the GPU under the request's lock, then room is made by evicting others."""
        nodes = [n for n in match.host_nodes if not n.on_gpu]
        self.cache.load_back(nodes)
        last = match.host_nodes[-1]
        self.cache.lock(last)
        self.cache.unlock(match.node)
        req.lock_node = last
        req.prefix_len += match.host_tokens
        self._evict_for(0)

    def _keep(self, agents: frozenset[str]) -> None:
        """The plugin's `Bridge.keep`: lock kept agents' prefixes, as far as the admission
        budget allows (not what running requests reserved, nor what the chunked request still
        needs); unlock the others."""
        for agent in [a for a in self.pins if a not in agents]:
            self.cache.unlock(self.pins.pop(agent))
        room = self._pin_room()
        for agent in sorted(agents - self.pins.keys()):
            tokens = self.prefix_tokens.get(agent, 0)
            if not tokens:
                continue
            m = self.cache.match([(agent_key(agent), 0, tokens)])
            if m.gpu_tokens < tokens:
                continue
            in_use = any(r.agent == agent for r in self.running)
            cost = 0 if in_use else tokens
            if cost <= room:
                self.cache.lock(m.node)
                self.pins[agent] = m.node
                room -= cost

    def _pin_room(self) -> float:
        """What a pin may take: the admission budget, less the decode headroom running
        requests reserve and what the in-flight chunked prefill still needs (the adapter's
        `chunk_rest`)."""
        clip = self.cfg.clip_max_new_tokens
        room: float = self.free_tokens + self.cache.evictable_tokens
        room -= sum(running_offset(r, self.ratio, clip) for r in self.running)
        if self.chunked is not None:
            c = self.chunked
            room -= c.fill_tokens - c.prefix_len + min(c.max_new_tokens, clip)
        return room

    def _release_pins(self) -> None:
        for node in self.pins.values():
            self.cache.unlock(node)
        self.pins.clear()
        self.contexts.release_all()

    def _maintain_contexts(self) -> None:
        """At an iteration's start: release contexts whose time is up or whose task ended,
        load back the offloaded contexts whose upload time has come, then ask the policy about
        the requests that finished in the last one (`Policy.context_action`, by default
        `context_ttl`'s keep; the adapter does the keep alike in `get_new_batch_prefill`)."""
        if self.contexts:
            self.contexts.expire(self.now, self.tasks)
        if self.uploads:
            self._upload_due()
        pending, self.finished_pending = self.finished_pending, []
        if not pending:
            return
        view = SimView(self)
        for req in pending:
            if req.task_id not in self.tasks or req.context_node is None:
                continue
            action = self.policy.context_action(req, view)
            if action.keep_s > 0:
                expires = self.now + action.keep_s
                room = self._pin_room()
                self.contexts.pin(
                    req.rid, req.context_node, req.task_id, expires, room, action.keep_s
                )
            elif action.offload and self.cfg.host_tier_tokens:
                self._offload(req, action.upload_in_s)

    def _offload(self, req: SimRequest, upload_in_s: float | None) -> None:
        """`ContextAction.offload`: the context's own part (below its agent's prefix) moves to
        the host tier now (the copy is taken as overlapped, as the host tier's evictions);
        with `upload_in_s`, its load back is queued for then."""
        assert req.context_node is not None
        keep = self.prefix_tokens.get(req.agent, 0)
        moved = self.cache.offload_path(req.context_node, keep)
        if moved and upload_in_s is not None:
            key = take(req.fill(), req.inserted_len)[0]
            heapq.heappush(self.uploads, (self.now + upload_in_s, req.rid, req.task_id, key))

    def _upload_due(self) -> None:
        """Load back (`Prefetcher.load`, on the host link) the offloaded contexts whose upload
        time has come and whose task is live; one that does not fit now is not retried (its
        next call loads it, or recomputes what the tier lost)."""
        while self.uploads and self.uploads[0][0] <= self.now:
            _, _, task_id, key = heapq.heappop(self.uploads)
            if task_id in self.tasks:
                self.prefetcher.load(key, self.now, lambda: self.free_tokens, self._evict_for)

    def _row(
        self, kind: str, dur: float, steps: int, batch: list[SimRequest], new: int
    ) -> tuple[Any, ...] | None:
        """The timeline row of an iteration starting now (`records.TIMELINE_COLUMNS`)."""
        if not self.rec.timeline_on:
            return None
        cache = self.cache
        if self._resident[0] != cache.version:  # GPU residency changes bump the version
            self._resident = (cache.version, "|".join(
                a.name for a in self.workload.agents
                if cache.probe([(agent_key(a.name), 0, a.prefix_tokens)])[0] >= a.prefix_tokens
            ))  # fmt: skip
        resident = self._resident[1]
        used = cache.gpu_tokens + self.private_tokens
        return (
            self.now, kind, steps, dur, len(batch), new, used, cache.gpu_tokens,
            self.private_tokens, len(self.waiting), resident, len({r.agent for r in batch}),
        )  # fmt: skip

    def check_invariants(self) -> None:
        """Re-derive KV accounting and lock counts from scratch; raise on any mismatch."""
        live = list({id(r): r for r in [*self.running, *self.prefilling]}.values())
        if self.chunked is not None and self.chunked not in live:
            live.append(self.chunked)
        held = sum(r.private_tokens for r in live)
        if held != self.private_tokens:
            raise SimulationError(f"private KV {self.private_tokens} != held by requests {held}")
        if self.free_tokens < 0:
            raise SimulationError(f"KV budget exceeded by {-self.free_tokens} tokens")
        locks: dict[int, int] = {}
        for node in [*(r.lock_node for r in live), *self.pins.values(), *self.contexts.nodes()]:
            n = node
            while n is not None and n is not self.cache.root:
                locks[id(n)] = locks.get(id(n), 0) + 1
                n = n.parent
        gpu = evictable = 0
        for n in self.cache.nodes():
            if n.lock != locks.get(id(n), 0):
                raise SimulationError(f"node {n.edge[:1]}: lock {n.lock} != {locks.get(id(n), 0)}")
            if n.on_gpu:
                gpu += n.tokens
                evictable += n.tokens if n.lock == 0 else 0
                if n.parent is not None and not n.parent.on_gpu:
                    raise SimulationError(f"GPU node {n.edge[:1]} under a non-GPU parent")
            elif n.lock:
                raise SimulationError(f"locked node {n.edge[:1]} is not on the GPU")
        if (gpu, evictable) != (self.cache.gpu_tokens, self.cache.evictable_tokens):
            raise SimulationError(
                f"cache says {self.cache.gpu_tokens} GPU / {self.cache.evictable_tokens} "
                f"evictable, tree holds {gpu} / {evictable}"
            )
