"""The SGLang adapter: every line of topas-bench that touches SGLang lives here.

Pinned to SGLang 0.5.23 (`SGLANG_VERSION`; the plugin refuses other versions). It installs a
topas-bench policy (`topas_bench.schedulers.registry`) into SGLang's scheduler at the seams
SGLang itself offers (`managers/scheduler.py`, `managers/schedule_policy.py`):

- ordering: `SchedulePolicy.calc_priority` runs SGLang's own pass (its prefix-match
  bookkeeping), then asks our policy and puts its admits first, in its order;
- admission: `Scheduler.get_prefill_adder_class()` returns `TopasPrefillAdder`, a `PrefillAdder`
  whose `add_one_req` stops the pass at the first request the policy did not admit, and
  otherwise defers to SGLang's budget checks unchanged (so a policy cannot overcommit memory);
- preemption: applied when the adder is built, exactly as SGLang's `preempt_to_schedule`
  releases requests (`ScheduleBatch.release_req`, `filter_batch`, `preempt_list`, requeued by
  the scheduler after the pass);
- kept prefixes: `tree_cache.lock(node)` on each kept agent's prefix node, released when the
  policy stops keeping it and, like the simulator, before decode would have to retract
  (running requests win over pins);
- retraction order: `ScheduleBatch._get_decode_retraction_order` (a staticmethod) is shadowed
  per batch instance with the policy's `retraction_order`;
- task metadata: parsed in `_create_generation_req` from `sampling_params.custom_params`;
  missing or malformed metadata makes an independent one-stage task and bumps a warning count
  (`Tracker.untagged`), logged, never raised.

`Bridge` holds the state and logic against SGLang's cache, allocator and queues, independent of
how a `Scheduler` is built, so CPU tests drive it with SGLang's real classes. `make_scheduler_class`
builds the `Scheduler` subclass the plugin installs.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from sglang.srt.managers.schedule_batch import (  # type: ignore[import-not-found]
    Req,
    ScheduleBatch,
)
from sglang.srt.managers.schedule_policy import (  # type: ignore[import-not-found]
    CLIP_MAX_NEW_TOKENS,
    AddReqResult,
    PrefillAdder,
    SchedulePolicy,
)
from sglang.srt.mem_cache.base_prefix_cache import (  # type: ignore[import-not-found]
    MatchPrefixParams,
)
from sglang.srt.mem_cache.radix_cache import RadixKey  # type: ignore[import-not-found]
from sglang.srt.runtime_context import get_memory  # type: ignore[import-not-found]

from topas_bench.errors import TopasError
from topas_bench.runners.sglang import request_log
from topas_bench.runners.sglang.guard import PolicyGuard
from topas_bench.runners.sglang.tracker import TrackedRequest, TrackedTask, Tracker
from topas_bench.schedulers.base import (
    Decision,
    Policy,
    PrefixLocation,
    PrefixView,
    Standing,
    sim_only_error,
)
from topas_bench.schedulers.estimator import ServiceEstimator

SGLANG_VERSION = "0.5.23"
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

    def __init__(self, bridge: Bridge, waiting: Sequence[Req], running: Sequence[Req]) -> None:
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


class TopasPrefillAdder(PrefillAdder):  # type: ignore[misc]
    """SGLang's `PrefillAdder` that also applies the policy's preemptions and admit set."""

    def __init__(self, *args: Any, bridge: Bridge, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bridge = bridge
        self._preempt(bridge.preempt_ids)
        bridge.preempt_ids = set()

    def _preempt(self, rids: set[str]) -> None:
        """Release the chosen running requests, as `preempt_to_schedule` does."""
        batch = self.running_batch
        if not rids or batch is None:
            return
        keep, released = [], 0
        for i, r in enumerate(batch.reqs):
            if r.rid in rids and not r.finished() and r not in self.preempt_list:
                self.memory_budget.total_offset -= self._get_running_request_total_token_offset(r)
                released += 1
                batch.release_req(i, len(batch.reqs) - released)
                self.preempt_list.append(r)
            else:
                keep.append(i)
        if released:
            batch.filter_batch(keep_indices=keep)

    def add_one_req(
        self, req: Req, has_chunked_req: bool, truncation_align_size: int | None
    ) -> AddReqResult:
        allowed = self.bridge.admit_ids
        if allowed is not None and req.rid not in allowed:
            return AddReqResult.OTHER  # the policy admits nobody past this point
        res = super().add_one_req(req, has_chunked_req, truncation_align_size)
        idle = not self.can_run_list and (self.running_batch is None or not self.running_batch.reqs)
        if res == AddReqResult.NO_TOKEN and idle and (self.bridge.pins or self.bridge.contexts):
            # Liveness (as the simulator): kept prefixes may not starve an idle server.
            self.bridge.release_pins()
            res = super().add_one_req(req, has_chunked_req, truncation_align_size)
        if self.can_run_list and self.can_run_list[-1] is req:
            self.bridge.tracker.admitted(req)
        return res


class TopasSchedulePolicy(SchedulePolicy):  # type: ignore[misc]
    """SGLang's `SchedulePolicy` whose `calc_priority` ends with our policy's decision."""

    def __init__(self, *args: Any, bridge: Bridge, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bridge = bridge

    def calc_priority(
        self,
        waiting_queue: list[Req],
        running_batch: ScheduleBatch | None = None,
        processed_tokens: int = 0,
    ) -> None:
        super().calc_priority(waiting_queue, running_batch, processed_tokens)
        running = list(running_batch.reqs) if running_batch is not None else []
        self.bridge.decide(waiting_queue, running)


def make_scheduler_class(
    policy_factory: Callable[[], Policy],
    estimator_factory: Any,
    *,
    clock: Callable[[], float] = time.monotonic,
    unix_clock: Callable[[], float] = time.time,
    on_decision: DecisionHook | None = None,
) -> type:
    """The `Scheduler` subclass the plugin installs (SGLang builds it in each scheduler process).

    `policy_factory()` and `estimator_factory()` are called once per scheduler process. The
    clocks are the server's (the reference engine passes its virtual clock for both).
    """
    from sglang.srt.managers.scheduler import Scheduler  # type: ignore[import-not-found]

    class TopasScheduler(Scheduler):  # type: ignore[misc]
        def init_schedule_policy(self) -> None:
            super().init_schedule_policy()
            self.topas = Bridge(
                policy_factory(), self.tree_cache, self.token_to_kv_pool_allocator,
                estimator_factory(), clock=clock, unix_clock=unix_clock, on_decision=on_decision,
            )  # fmt: skip
            self._topas_batch_start = 0.0
            # SGLang's own pass for the policy's `--schedule-policy` (its bookkeeping and
            # order), whatever the server was started with; the simulator runs the same.
            self._topas_needs = self.topas.policy.needs  # read once (`ServerNeeds`)
            self.policy = TopasSchedulePolicy(
                self._topas_needs.schedule_policy, self.tree_cache, self.enable_hierarchical_cache,
                self.enable_priority_scheduling, self.schedule_low_priority_values_first,
                bridge=self.topas,
            )  # fmt: skip
            want = self._topas_needs.eviction
            have = get_memory().radix_eviction_policy
            if str(have).lower() != want:
                logger.warning(
                    "topas: %s wants --radix-eviction-policy %s; the server runs %s",
                    self.topas.policy.name, want, have,
                )  # fmt: skip
            # The launcher waits for this line (stderr: whatever logging SGLang configured).
            print(f"topas: scheduler {self.topas.policy.name!r} installed", file=sys.stderr)

        def _create_generation_req(self, recv_req: Any, *args: Any, **kwargs: Any) -> Req:
            req = super()._create_generation_req(recv_req, *args, **kwargs)
            self.topas.on_new_request(req)
            return req

        def get_prefill_adder_class(self) -> Any:
            self.topas.new_token_ratio = self.new_token_ratio_tracker.current
            return functools.partial(TopasPrefillAdder, bridge=self.topas)

        def _get_new_batch_prefill_raw(self, *args: Any, **kwargs: Any) -> Any:
            # The one door for acting while the batch is full (`ServerNeeds.acts_while_full`): clear
            # the latch before every prefill attempt, as SGLang does with
            # `enable_priority_preemption`; the simulator opens the same door.
            running = kwargs.get("running_batch", args[1] if len(args) > 1 else None)
            if self._topas_needs.acts_while_full and running is not None:
                running.batch_is_full = False
            # The policy's view reserves decode headroom at the ratio this pass admits with.
            self.topas.new_token_ratio = self.new_token_ratio_tracker.current
            self.topas.chunk_rest = self._topas_chunk_rest()
            return super()._get_new_batch_prefill_raw(*args, **kwargs)

        def _topas_chunk_rest(self) -> int:
            """What the in-flight chunked request still needs: its unprefilled tokens and
            decode headroom."""
            chunked = self.chunked_req
            return 0 if chunked is None else (
                len(chunked.origin_input_ids) + len(chunked.output_ids) - chunked.prefix_len
                + min(chunked.sampling_params.max_new_tokens, CLIP_MAX_NEW_TOKENS)
            )  # fmt: skip

        def get_new_batch_prefill(self, running_batch: ScheduleBatch, *args: Any, **kw: Any) -> Any:
            # Every iteration, once the last batch is merged: kept contexts expire or start
            # (`Policy.context_ttl`), as in the simulator's `_step`.
            bridge = self.topas
            if bridge.contexts or bridge.finished_pending:
                bridge.new_token_ratio = self.new_token_ratio_tracker.current
                running = [r for r in running_batch.reqs if not r.finished()]
                bridge.maintain_contexts(self.waiting_queue, running, self._topas_chunk_rest())
            return super().get_new_batch_prefill(running_batch, *args, **kw)

        def _add_request_to_queue(self, req: Req, is_retracted: bool = False) -> Any:
            self.topas.tracker.requeued(req)  # a retraction or a preemption, if it ran
            return super()._add_request_to_queue(req, is_retracted=is_retracted)

        def run_batch(self, batch: ScheduleBatch, *args: Any, **kwargs: Any) -> Any:
            self._topas_batch_start = clock()
            return super().run_batch(batch, *args, **kwargs)

        def process_batch_result(self, batch: ScheduleBatch, result: Any) -> Any:
            out = super().process_batch_result(batch, result)
            seconds = clock() - self._topas_batch_start
            tracker = self.topas.tracker
            if self.topas.asks_ttl:
                self.topas.finished_pending += [
                    (r, tracker.requests[r.rid])
                    for r in batch.reqs
                    if r.finished() and r.rid in tracker.requests
                ]
            for req in batch.reqs:
                tracker.served(req, seconds)
            if batch.forward_mode.is_decode():
                # The estimator's time per output token, from the server's own decode steps.
                tracker.estimator.observe_decode(seconds, 1)
            tracker.finished(batch.reqs)
            return out

        def update_running_batch(self, batch: ScheduleBatch) -> ScheduleBatch | None:
            pinned = self.topas.pins or self.topas.contexts
            if pinned and not batch.is_empty() and not batch.check_decode_mem():
                self.topas.release_pins()  # running requests win over kept prefixes
            batch._get_decode_retraction_order = self.topas.retraction_indices
            return super().update_running_batch(batch)

    return TopasScheduler
