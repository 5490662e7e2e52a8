"""One SGLang server's policy and what it acts on (`Bridge`): the tracker, the decision being
applied (and the one standing), kept prefixes and contexts, and the admission budget as SGLang
counts it. It reads SGLang's cache, allocator and queues, but is independent of how a
`Scheduler` is built (`adapter.make_scheduler_class`), so CPU tests drive it with SGLang's real
classes.
"""

from __future__ import annotations

import logging
import sys
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from sglang.srt.managers.schedule_batch import Req  # type: ignore[import-not-found]
from sglang.srt.managers.schedule_policy import (  # type: ignore[import-not-found]
    CLIP_MAX_NEW_TOKENS,
)
from sglang.srt.mem_cache.base_prefix_cache import (  # type: ignore[import-not-found]
    MatchPrefixParams,
)
from sglang.srt.mem_cache.radix_cache import RadixKey  # type: ignore[import-not-found]

from topas_bench.errors import TopasError
from topas_bench.runners.sglang import request_log
from topas_bench.runners.sglang.guard import PolicyGuard
from topas_bench.runners.sglang.tracker import TrackedRequest, Tracker
from topas_bench.runners.sglang.view import SglangView, device_prefix_len
from topas_bench.schedulers.base import Decision, Policy, Standing, sim_only_error
from topas_bench.schedulers.estimator import ServiceEstimator

#: Called after every decision with (wall seconds, waiting requests, the decision).
DecisionHook = Callable[[float, int, Decision], None]
STATUS_EVERY = 1000  # decisions between status lines in the server log
#: Decode steps a standing decision is asked to cover on a server (`Decision.standing`).
STANDING_STEPS = 256
logger = logging.getLogger("topas_bench.sglang")


class Bridge:
    """One server's policy, task tracker, kept-prefix locks and the decision being applied."""

    def __init__(
        self,
        policy: Policy,
        tree_cache: Any,
        allocator: Any,
        estimator: ServiceEstimator,
        *,
        clock: Callable[[], float] = time.monotonic,
        unix_clock: Callable[[], float] = time.time,
        on_decision: DecisionHook | None = None,
    ) -> None:
        self.policy = policy
        self.guard = PolicyGuard(logger)  # a failing policy degrades to SGLang's queue order
        self.on_decision = on_decision
        self.tree_cache = tree_cache
        self.allocator = allocator
        self.tracker = Tracker(estimator, clock, unix_clock)
        self.new_token_ratio = 0.7
        self.kv_budget_tokens = int(getattr(allocator, "size", 0))
        self.page_size = int(getattr(allocator, "page_size", 1) or 1)
        self.pins: dict[str, Any] = {}  # agent -> TreeLock
        #: rid -> (TreeLock, task id, expiry): finished contexts kept (`Policy.context_ttl`)
        self.contexts: dict[str, tuple[Any, str, float]] = {}
        #: requests finished in the last batch, whose context the policy may keep
        self.finished_pending: list[tuple[Req, TrackedRequest]] = []
        self.asks_ttl = type(policy).context_ttl is not Policy.context_ttl
        error = sim_only_error(type(policy), policy.name, "the SGLang plugin")
        if error is not None:  # true lengths or refresh on a hit: simulator mechanisms
            raise TopasError(error)
        #: What the in-flight chunked request still needs: its unprefilled tokens and decode
        #: headroom (set by the scheduler before each prefill attempt).
        self.chunk_rest = 0
        self.admit_ids: set[str] | None = None  # rids the current decision admits
        self.preempt_ids: set[str] = set()
        #: The last decision, while it may stand (`Standing`): with the state it was made on
        #: and each running request's output length then.
        self.standing: tuple[Decision, tuple[Any, ...], int] | None = None
        self.reused = 0  # scheduling points that reused a standing decision
        #: False asks the policy at every scheduling point (the always-ask path, to compare)
        self.reuse = True
        self.decisions = 0
        self.decision_wall_s = 0.0
        self._warned: set[str] = set()

    # -- requests -------------------------------------------------------------------------
    def on_new_request(self, req: Req) -> None:
        before = dict(self.tracker.untagged)
        tr = self.tracker.add(req)
        if tr.meta.workflow != "untagged":  # which replica served it, for a cluster's tables
            # straight to the server log, as the installed line: SGLang's logging setup decides
            # nothing about it
            print(request_log.line(tr.meta.task_id, tr.meta.stage_id), file=sys.stderr, flush=True)
        for reason, n in self.tracker.untagged.items():
            if n != before.get(reason, 0) and reason not in self._warned:
                self._warned.add(reason)
                logger.warning(
                    "topas: request %s has no usable task metadata (%s); served as an "
                    "independent task (counted in untagged_requests)",
                    req.rid,
                    reason,
                )

    # -- the decision ---------------------------------------------------------------------
    def decide(self, waiting_queue: list[Req], running: Sequence[Req]) -> Decision:
        """Ask the policy; reorder `waiting_queue` in place (admits first, in the policy's
        order, then the rest in queue order) and remember what the adder must enforce."""
        self.tracker.sync(waiting_queue, running)
        state = self.state(waiting_queue, running)
        decision = self.stands(state, running)
        if decision is None:
            decision = self.ask(waiting_queue, running)
            self.standing = None
            if self.reuse and decision.reusable and running:
                # a real server cannot tell its next event: the longest proof the policy gives
                stands = self.guard.standing(decision, STANDING_STEPS)
                if stands is not None:
                    standing = replace(decision, stands=stands)
                    self.standing = (standing, state, len(running[0].output_ids))
        by_id = {r.rid: r for r in waiting_queue}
        first = [
            by_id.pop(req.engine.rid)
            for req in decision.admit
            if isinstance(req, TrackedRequest) and req.engine.rid in by_id
        ]
        self.admit_ids = {r.rid for r in first}
        waiting_queue[:] = first + [r for r in waiting_queue if r.rid in by_id]
        self.preempt_ids = {r.engine.rid for r in decision.preempt if isinstance(r, TrackedRequest)}
        if decision.keep_prefixes is not None:
            self.keep(decision.keep_prefixes, running)
        if decision.prefix_priority is not None:
            self.set_prefix_priorities(decision.prefix_priority)
        return decision

    def ask(self, waiting_queue: list[Req], running: Sequence[Req]) -> Decision:
        """The policy's decision (through the guard), timed, counted and reported."""
        view = SglangView(self, waiting_queue, running)
        t0 = time.perf_counter()
        decision = self.guard.decide(self.policy, view) if waiting_queue else Decision()
        wall_s = time.perf_counter() - t0
        self.decision_wall_s += wall_s
        self.decisions += 1
        if self.on_decision is not None and waiting_queue:
            self.on_decision(wall_s, len(waiting_queue), decision)
        if self.decisions % STATUS_EVERY == 0:
            logger.info(
                "topas: %d decisions, mean %.3f ms, %d reused; %d live tasks; "
                "untagged_requests=%d %s; policy_failures=%s",
                self.decisions, 1e3 * self.decision_wall_s / self.decisions, self.reused,
                len(self.tracker.tasks), sum(self.tracker.untagged.values()),
                self.tracker.untagged, self.guard.failures,
            )  # fmt: skip
        return decision

    def state(self, waiting: Sequence[Req], running: Sequence[Req]) -> tuple[Any, ...]:
        """What a standing decision needs unchanged (`Standing`): the queues, the cache's
        contents (decode changes them only by evicting, which changes the sizes), the pins
        and kept contexts, the estimator's finishes, the tracked tasks' states; and no chunked
        prefill in flight."""
        tasks = self.tracker.tasks
        return (
            tuple(r.rid for r in waiting), tuple(r.rid for r in running),
            int(self.tree_cache.evictable_size()), int(self.tree_cache.protected_size()),
            frozenset(self.pins), frozenset(self.contexts), self.chunk_rest,
            self.tracker.estimator.version, len(tasks), sum(t.version for t in tasks.values()),
            len(self.tracker.agent_prefixes),
        )  # fmt: skip

    def stands(self, state: tuple[Any, ...], running: Sequence[Req]) -> Decision | None:
        """The last decision, if it stands here (`Standing.holds`) on the state it was made
        on, `steps` decode steps later; else None (ask the policy)."""
        last = self.standing
        if last is None or not running or not self.reuse:
            return None
        decision, decided, generated = last
        stands = decision.stands
        if state != decided or not isinstance(stands, Standing):
            return None
        steps = len(running[0].output_ids) - generated
        budget = self.remaining_total(running)
        now, tpot = self.tracker.clock(), self.tracker.estimator.tpot_s
        if steps < 1 or not stands.holds(steps, now, tpot, budget):
            return None
        self.reused += 1
        return decision

    def set_prefix_priorities(self, priorities: Mapping[str, int]) -> None:
        """`Decision.prefix_priority` on the tree's nodes (the simulator's
        `pins.set_prefix_priorities`): each agent's prefix device path, read-only. Needs the
        Python tree core (the Rust one keeps its nodes to itself): without it, logged once and
        skipped."""
        core = getattr(self.tree_cache, "tree_core", None)
        best: dict[int, tuple[Any, int]] = {}
        # a policy's nonsense (a non-integer priority) is dropped, never raised in the server
        priorities = {
            a: p for a, p in priorities.items()
            if isinstance(a, str) and isinstance(p, int) and not isinstance(p, bool)
        }  # fmt: skip
        try:
            for agent in sorted(priorities):
                ids = self.tracker.agent_prefixes.get(agent)
                if not ids:
                    continue
                key = RadixKey(token_ids=array("q", ids))
                matched, node_id, _ = core.match_full_device_prefix(key)  # type: ignore[union-attr]
                n = core.node_by_id(node_id) if matched else None  # type: ignore[union-attr]
                while n is not None and n is not core.root_node:  # type: ignore[union-attr]
                    prev = best.get(id(n))
                    if prev is None or priorities[agent] > prev[1]:
                        best[id(n)] = (n, priorities[agent])
                    n = n.parent
        except (AttributeError, NotImplementedError):
            if "prefix_priority" not in self._warned:
                self._warned.add("prefix_priority")
                logger.warning(
                    "topas: %s sets prefix eviction priorities, which needs SGLang's Python "
                    "tree core (SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python); ignored",
                    self.policy.name,
                )
            return
        for n, priority in best.values():
            n.priority = priority

    def keep(self, agents: frozenset[str], running: Sequence[Req]) -> None:
        """Lock the kept agents' prefix nodes, as far as the admission budget allows (a pin may
        not take memory that running requests have reserved, nor what the in-flight chunked
        prefill still needs: SGLang continues a chunk whatever memory is left, and runs out of
        memory if a pin took it); unlock the others."""
        for agent in [a for a in self.pins if a not in agents]:
            self.tree_cache.unlock(self.pins.pop(agent))
        room = self.remaining_total(running) - self.chunk_rest
        for agent in sorted(agents - self.pins.keys()):
            ids = self.tracker.agent_prefixes.get(agent)
            if not ids:
                continue
            match = self.match(ids)
            if match.device_prefix_len < len(ids):
                continue  # not (wholly) on the GPU: nothing to keep
            cost = 0 if self.agent_in_use(agent, running) else len(ids)
            if cost <= room:
                self.pins[agent] = self.tree_cache.lock(match.last_device_node)
                room -= cost

    def release_pins(self) -> None:
        for lock in self.pins.values():
            self.tree_cache.unlock(lock)
        self.pins.clear()
        for lock, _, _ in self.contexts.values():
            self.tree_cache.unlock(lock)
        self.contexts.clear()

    def maintain_contexts(
        self, waiting: Sequence[Req], running: Sequence[Req], chunk_rest: int
    ) -> None:
        """At an iteration's start (the simulator's `_maintain_contexts`): release contexts
        whose time is up or whose task ended, then ask the policy about the requests that
        finished in the last batch and lock each context its budget allows (locked, measured
        by the evictable tokens it took, unlocked when too dear)."""
        now = self.tracker.clock()
        for rid in [r for r, (_, tid, exp) in self.contexts.items()
                    if exp <= now or tid not in self.tracker.tasks]:  # fmt: skip
            self.tree_cache.unlock(self.contexts.pop(rid)[0])
        pending, self.finished_pending = self.finished_pending, []
        if not pending:
            return
        self.tracker.sync(waiting, running)
        view = SglangView(self, waiting, running)
        for req, tr in pending:
            if tr.task_id not in self.tracker.tasks or req.last_node is None:
                continue
            ttl = self.guard.context_ttl(self.policy, tr, view)
            if ttl <= 0:
                continue
            room = self.remaining_total(running) - chunk_rest
            before = int(self.tree_cache.evictable_size())
            lock = self.tree_cache.lock(req.last_node)
            if before - int(self.tree_cache.evictable_size()) > room:
                self.tree_cache.unlock(lock)
            else:
                self.contexts[req.rid] = (lock, tr.task_id, now + ttl)

    def retraction_indices(self, reqs: Sequence[Req]) -> list[int]:
        """`_get_decode_retraction_order`: indices, most-preferred to keep first (SGLang pops
        the last to retract it), from the policy's `retraction_order` (first retracted first)."""
        view = SglangView(self, [], reqs)
        order = self.policy.retraction_order(view)
        pos = {r.rid: i for i, r in enumerate(reqs)}
        ranked = [pos[r.engine.rid] for r in order if isinstance(r, TrackedRequest)]
        missing = [i for i in range(len(reqs)) if i not in set(ranked)]
        return list(reversed(ranked + missing))

    # -- memory ---------------------------------------------------------------------------
    def match(self, token_ids: Sequence[int]) -> Any:
        """SGLang's `match_prefix`, which also splits the matched node and refreshes the LRU
        time of the path: only for prefixes the policy acts on (keeping one)."""
        key = RadixKey(token_ids=array("q", token_ids))
        return self.tree_cache.match_prefix(MatchPrefixParams(key=key))

    def cached(self, token_ids: Sequence[int]) -> int:
        """Device-resident prefix length of `token_ids`, read-only (`device_prefix_len`)."""
        return device_prefix_len(self.tree_cache, token_ids)

    def reserved(self, running: Sequence[Req]) -> float:
        """`PrefillAdder._get_running_request_total_token_offset` over the running batch."""
        total = 0.0
        for r in running:
            ratio = 1.0 if r.sampling_params.ignore_eos else self.new_token_ratio
            left = min(r.sampling_params.max_new_tokens - len(r.output_ids), CLIP_MAX_NEW_TOKENS)
            total += left * ratio
        return total

    def remaining_total(self, running: Sequence[Req]) -> float:
        free = int(self.allocator.available_size()) + int(self.tree_cache.evictable_size())
        return free - self.reserved(running)

    def agent_in_use(self, agent: str, running: Sequence[Req]) -> bool:
        return any(self.tracker.get(r).agent == agent for r in running) or agent in self.pins
