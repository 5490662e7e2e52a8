"""The discrete-event simulator of one SGLang server (DESIGN section 4).

Events live in a heap of `(time, seq, kind, payload)`; `seq` is per simulator, so runs are
deterministic and nothing leaks between runs. Kinds: a task arrives, a stage's request is sent
(after its dependencies and the client's delay), an engine iteration ends.

Each iteration mirrors SGLang's `Scheduler.get_next_batch_to_run` (0.5.23): if a prefill batch
can be formed it runs (prefill has priority; no mixed chunks), else the running batch decodes
one token per request, retracting requests first when the next step does not fit. Runs of
decode-only iterations in which nothing else can change are advanced in closed form, as one
event: up to the first finish, the next external event, the step at which the policy's
first-choice waiting request would fit, the first eviction while requests wait, or (for
policies whose ranking moves during decode) `decision_interval_steps`.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from topas_bench.errors import TopasError
from topas_bench.runners.sim.admission import AddResult, PrefillAdder, running_offset
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel
from topas_bench.runners.sim.radix import Match, Node, RadixCache
from topas_bench.runners.sim.records import Recorder, SimResult
from topas_bench.runners.sim.state import SimRequest, TaskRun
from topas_bench.runners.sim.view import SimView
from topas_bench.schedulers.base import Decision, Policy, StageState
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.workloads.model import Task, Workload, agent_key

ARRIVE, READY, ITER = 0, 1, 2


class SimulationError(TopasError):
    """The simulation cannot make progress (a policy or engine bug)."""


class Simulator:
    """Runs one workload under one policy on one simulated server."""

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        cost: CostModel,
        config: SimConfig,
        on_task_done: Callable[[int], None] | None = None,
    ) -> None:
        self.workload = workload
        self.policy = policy
        self.cost = cost
        self.cfg = config
        self.cache = RadixCache(config.host_tier_tokens)
        self.private_tokens = 0
        self.waiting: list[SimRequest] = []
        self.running: list[SimRequest] = []
        self.chunked: SimRequest | None = None
        self.prefilling: list[SimRequest] = []  # the in-flight prefill batch (incl. chunked)
        self.ratio = config.init_new_token_ratio
        self.now = 0.0
        self.tasks: dict[str, TaskRun] = {}
        self.prefix_tokens = {a.name: a.prefix_tokens for a in workload.agents}
        truths = {(t.id, s.id): s.output_tokens for t, s in workload.stages()}
        self.estimator = ServiceEstimator(
            cost,
            true_length=(lambda t, s: truths[(t, s)]) if config.length_hint == "oracle" else None,
        )
        self.rec = Recorder(config.record_timeline)
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._rids = itertools.count()
        self._enqueues = itertools.count()
        self._busy = False
        self._deficit: float | None = None
        self._pins_off = False  # set while the idle-server liveness retry runs
        self._on_task_done = on_task_done
        self._done_tasks = 0

    # -- public -----------------------------------------------------------------------------
    @property
    def free_tokens(self) -> int:
        return self.cfg.kv_budget_tokens - self.cache.gpu_tokens - self.private_tokens

    def match_of(self, req: SimRequest) -> Match:
        """`req`'s prefix match, memoised until the cache's GPU contents change."""
        memo = req.match_memo
        if memo is not None and memo[0] == self.cache.version:
            return memo[1]
        m = self.cache.match(req.prompt)
        req.match_memo = (self.cache.version, m)
        return m

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        for task in self.workload.tasks:
            self._push(task.arrival_s, ARRIVE, task)
        heap = self._heap
        while heap:
            self.now = heap[0][0]
            while heap and heap[0][0] == self.now:
                _, _, kind, payload = heapq.heappop(heap)
                if kind == ARRIVE:
                    self._arrive(payload)
                elif kind == READY:
                    self._send(payload)
                else:
                    self._iteration_done(*payload)
            if not self._busy:
                self._start_iteration()
            if self.cfg.check_invariants:
                self.check_invariants()
        if self._done_tasks != len(self.workload.tasks):
            raise SimulationError(
                f"{len(self.workload.tasks) - self._done_tasks} tasks never finished "
                f"under scheduler {self.policy.name!r}"
            )
        return self.rec.result(self.now, time.perf_counter() - wall0)

    def check_invariants(self) -> None:
        """Re-derive KV accounting and lock counts from scratch; raise on any mismatch."""
        live = list({id(r): r for r in [*self.running, *self.prefilling]}.values())
        held = sum(r.private_tokens for r in live)
        if held != self.private_tokens:
            raise SimulationError(f"private KV {self.private_tokens} != held by requests {held}")
        if self.free_tokens < 0:
            raise SimulationError(f"KV budget exceeded by {-self.free_tokens} tokens")
        locks: dict[int, int] = {}
        for node in [*(r.lock_node for r in live), *self.cache.kept.values()]:
            n = node
            while n is not None and n is not self.cache.root:
                locks[id(n)] = locks.get(id(n), 0) + 1
                n = n.parent
        gpu = evictable = 0
        for n in self.cache.nodes():
            if n.lock != locks.get(id(n), 0):
                raise SimulationError(f"node {n.key}: lock {n.lock} != {locks.get(id(n), 0)}")
            if n.on_gpu:
                gpu += n.tokens
                evictable += n.tokens if n.lock == 0 else 0
                if n.parent is not None and not n.parent.on_gpu:
                    raise SimulationError(f"GPU node {n.key} under a non-GPU parent")
            elif n.lock:
                raise SimulationError(f"locked node {n.key} is not on the GPU")
        if (gpu, evictable) != (self.cache.gpu_tokens, self.cache.evictable_tokens):
            raise SimulationError(
                f"cache says {self.cache.gpu_tokens} GPU / {self.cache.evictable_tokens} "
                f"evictable, tree holds {gpu} / {evictable}"
            )

    # -- events -----------------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, payload))

    def _arrive(self, task: Task) -> None:
        run = TaskRun(task)
        self.tasks[task.id] = run
        for st in run.stages.values():
            if not st.deps:
                self._push(self.now + st.delay_s, READY, (run, st.id))

    def _send(self, payload: tuple[TaskRun, str]) -> None:
        run, stage_id = payload
        st = run.stages[stage_id]
        req = SimRequest(next(self._rids), run, st.stage, self.now)
        st.request = req
        self._enqueue(req)

    def _enqueue(self, req: SimRequest) -> None:
        req.queued_s = self.now
        req.enqueue_seq = next(self._enqueues)
        req.task.set_state(req.stage_id, StageState.WAITING)
        self.waiting.append(req)

    # -- iterations -------------------------------------------------------------------------
    def _start_iteration(self) -> None:
        batch = self._form_prefill()
        if batch is not None:
            items = [(a.cached_before, a.new_tokens) for a in batch.batch]
            load = sum(a.match.host_tokens for a in batch.batch if a.match is not None)
            dur = self.cost.prefill_s(items) + (self.cost.host_load_s(load) if load else 0.0)
            new = sum(a.new_tokens for a in batch.batch)
            self.rec.iteration(self, "prefill", dur, 1, len(batch.batch), new)
            self.prefilling = [a.req for a in batch.batch]
            self._begin(dur, ("prefill", batch, dur))
            return
        if self.running:
            self._retract_if_needed()
            steps, dur = self._plan_decode()
            b = len(self.running)
            self.rec.iteration(self, "decode", dur, steps, b, b * steps)
            self._begin(dur, ("decode", steps, dur))
            return
        if self.waiting:
            if self.cache.kept:  # liveness: pinned prefixes may not starve an idle server
                self.cache.set_kept(frozenset())
                # Retry without pins: re-applying the decision's pins would refuse the same
                # admits again and recurse forever.
                self._pins_off = True
                try:
                    self._start_iteration()
                finally:
                    self._pins_off = False
                return
            if not self._heap:
                raise SimulationError(
                    f"scheduler {self.policy.name!r} admitted nothing while the server was idle "
                    f"and {len(self.waiting)} requests waited"
                )
        elif self.chunked is None:
            # Idle: SGLang resets `new_token_ratio` (`NewTokenRatioTracker.reset`).
            self.ratio = self.cfg.init_new_token_ratio

    def _begin(self, dur: float, payload: tuple[Any, ...]) -> None:
        self._busy = True
        self._push(self.now + dur, ITER, payload)

    def _decide(self) -> Decision:
        view = SimView(self)
        t0 = time.perf_counter()
        decision = self.policy.decide(view)
        self.rec.decision(self.now, time.perf_counter() - t0, len(self.waiting), decision)
        return decision

    def _form_prefill(self) -> PrefillAdder | None:
        self._deficit = None
        if not self.waiting and self.chunked is None:
            return None
        decision = self._decide() if self.waiting else Decision()
        for req in decision.preempt:
            self._preempt(self._own(req))
        if decision.keep_prefixes is not None and not self._pins_off:
            self._keep(decision.keep_prefixes)
        adder = self._adder()
        if self.chunked is not None:
            adder.add_chunked(self.chunked)
        waiting = {r.rid for r in self.waiting}
        slots = self.cfg.max_running_requests - len(self.running)
        for cand in decision.admit:
            req = self._own(cand)
            if req.rid not in waiting or req is self.chunked:
                continue
            if len(adder.batch) >= slots:
                break
            waiting.discard(req.rid)
            res = adder.add_one(req)
            if adder.batch and adder.batch[-1].req is req:
                self._admit(req, adder)
            if res is not AddResult.CONTINUE:
                break
        self._deficit = adder.deficit
        if not adder.batch:
            return None
        self.chunked = adder.new_chunked
        admitted = {a.req.rid for a in adder.batch}
        self.waiting = [r for r in self.waiting if r.rid not in admitted]
        self._allocate(sum(a.new_tokens for a in adder.batch))
        for adm in adder.batch:
            adm.req.private_tokens += adm.new_tokens
            self.cache.touch(adm.req.lock_node or self.cache.root, self.now)
        return adder

    def _keep(self, agents: frozenset[str]) -> None:
        """Pin the prefixes a policy keeps, as far as the admission budget allows: a pin may
        not take memory that running requests have reserved (pins are applied in name order,
        after releasing the ones no longer kept)."""
        keys = frozenset(agent_key(a) for a in agents)
        self.cache.set_kept(frozenset(k for k in self.cache.kept if k in keys))
        room = self._adder().remaining_total
        for key in sorted(keys - self.cache.kept.keys()):
            node = self.cache.child(key)
            if node is None or not node.on_gpu:
                continue
            cost = node.tokens if node.lock == 0 else 0
            if cost <= room:
                self.cache.set_kept(frozenset(self.cache.kept) | {key})
                room -= cost

    def _adder(self) -> PrefillAdder:
        return PrefillAdder(
            self.cache,
            lambda: self.free_tokens,
            self.running,
            self.ratio,
            self.cfg,
            self.match_of,
            self.chunked,
        )

    def _own(self, req: Any) -> SimRequest:
        if not isinstance(req, SimRequest):
            raise SimulationError(f"scheduler {self.policy.name!r} returned a foreign request")
        return req

    def _admit(self, req: SimRequest, adder: PrefillAdder) -> None:
        adm = adder.batch[-1]
        assert adm.match is not None
        req.lock_node = adm.match.node
        req.cached_tokens = adm.match.gpu_tokens + adm.match.host_tokens
        req.extend_tokens = adder.extend_tokens(req, adm.match)
        req.redo_tokens = req.generated
        req.done_prefill = 0
        req.admitted_s = self.now
        if req.first_admitted_s is None:
            req.first_admitted_s = self.now
        req.task.set_state(req.stage_id, StageState.RUNNING)
        if adm.match.host_nodes:
            self._load_back(req, adm.match)
        self.rec.admission(req.prompt_tokens, min(req.cached_tokens, req.prompt_tokens))

    def _load_back(self, req: SimRequest, match: Match) -> None:
        """Bring a just-admitted request's host-tier hit back to the GPU (`init_load_back`).

        The nodes go on the GPU and under the request's lock first, then room is made by
        evicting other nodes, so the loaded chain itself can never be the victim.
        """
        nodes = [n for n in match.host_nodes if not n.on_gpu]
        self.cache.load_back(nodes, self.now)
        last = match.host_nodes[-1]
        self.cache.lock(last)
        self.cache.unlock(match.node)
        req.lock_node = last
        short = -self.free_tokens
        if short > 0:
            self.cache.evict(short)
        if self.free_tokens < 0:
            raise SimulationError(f"KV budget exceeded by {-self.free_tokens} tokens on load-back")

    def _allocate(self, tokens: int) -> None:
        """Take `tokens` of KV for request-private use, evicting LRU cache as needed."""
        short = tokens - self.free_tokens
        if short > 0:
            self.cache.evict(short)
        self.private_tokens += tokens
        if self.free_tokens < 0:
            raise SimulationError(f"KV budget exceeded by {-self.free_tokens} tokens")

    def _retract_if_needed(self) -> None:
        """`update_running_batch`: retract until the next decode step fits."""
        if self.free_tokens + self.cache.evictable_tokens >= len(self.running):
            return
        if self.cache.kept:  # prefixes a policy keeps yield to running requests first
            self.cache.set_kept(frozenset())
            if self.free_tokens + self.cache.evictable_tokens >= len(self.running):
                return
        order = self.policy.retraction_order(SimView(self))
        for victim in order:
            if len(self.running) == 1:
                break
            self._preempt(self._own(victim))
            if self.free_tokens + self.cache.evictable_tokens >= len(self.running):
                break
        decoded = sum(r.generated for r in self.running)
        max_new = sum(r.max_new_tokens for r in self.running)
        n = len(self.running)
        self.ratio = min(1.0, (decoded + self.cfg.retract_decode_steps * n) / (max_new + 1))
        # This iteration's admission pass ran before the retraction freed memory and moved the
        # ratio, so its deficit is stale: decode one step, then admission runs again.
        self._deficit = -math.inf

    def _preempt(self, req: SimRequest) -> None:
        """Free a running request's private KV and requeue it (`release_req` + requeue)."""
        if req is self.chunked:
            self.chunked = None
            self.prefilling = [r for r in self.prefilling if r is not req]
        elif req in self.running:
            self.running.remove(req)
        else:
            return
        self.private_tokens -= req.private_tokens
        req.private_tokens = 0
        if req.lock_node is not None:
            self.cache.unlock(req.lock_node)
            req.lock_node = None
        req.preemptions += 1
        req.admitted_s = None
        self.rec.preemption()
        self._enqueue(req)

    def _plan_decode(self) -> tuple[int, float]:
        """How many decode steps to run as one event, and their total duration."""
        running = self.running
        b = len(running)
        k = min(r.remaining_output for r in running)
        headroom = self.free_tokens + self.cache.evictable_tokens
        if self.waiting:
            # Eviction must not change a waiting request's prefix match mid-run: stop before
            # the LRU order would reach a node on one of their matched paths.
            headroom = max(self.free_tokens + self._evictable_off_paths(k * b), b)
            k = min(k, headroom // b)
            if self.policy.reorders_during_decode or self.policy.acts_while_full:
                floor = self._blocked_floor()
                if floor is None or self.policy.acts_while_full:
                    k = min(k, self.cfg.decision_interval_steps)
                if floor is not None:
                    k = min(k, self._steps_until_fit(floor, k))
            elif self._deficit is not None:
                k = min(k, self._steps_until_fit(self._deficit, k))
        k = max(1, min(k, headroom // b))
        ctx = sum(r.context_tokens for r in running)
        durs = self.cost.decode_steps_s(b, ctx, k)
        cum = np.cumsum(durs)
        if self._heap:
            gap = self._heap[0][0] - self.now
            k = min(k, int(np.searchsorted(cum, gap, side="left")) + 1)
        return k, float(cum[k - 1])

    def _evictable_off_paths(self, want: int) -> int:
        short = want - self.free_tokens
        if short <= 0:
            return 0
        protect: set[int] = set()
        for r in self.waiting:
            n: Node | None = self.match_of(r).node
            while n is not None and id(n) not in protect:
                protect.add(id(n))
                n = n.parent
        return self.cache.evictable_before(protect, short)

    def _blocked_floor(self) -> float | None:
        """If no waiting request fits now, the least growth of `remaining_total` that would
        let one in (so no ranking of the queue matters before then); None if one fits."""
        if len(self.running) + 1 > self.cfg.max_running_requests:
            return float("inf")
        adder = self._adder()
        base = adder.remaining_total
        floor = float("inf")
        for r in self.waiting:
            m = self.match_of(r)
            deficit = adder.need(r, m) - (base - self.cache.unlocked_path_tokens(m.node)) + 1
            if deficit < 1:  # need < remaining_total: it fits now
                return None
            floor = min(floor, deficit)
        return floor

    def _steps_until_fit(self, deficit: float, k_max: int) -> int:
        """Fewest decode steps after which `remaining_total` has grown by `deficit`."""
        j = np.arange(1, k_max + 1, dtype=np.float64)
        cfg = self.cfg
        ratio = np.maximum(self.ratio - cfg.new_token_ratio_decay * j, cfg.min_new_token_ratio)
        base = sum(running_offset(r, self.ratio, cfg.clip_max_new_tokens) for r in self.running)
        offset = np.zeros_like(j)
        for r in self.running:
            left = np.clip(r.max_new_tokens - r.generated - j, 0, cfg.clip_max_new_tokens)
            offset += left * (1.0 if r.ignore_eos else ratio)
        gain = -len(self.running) * j - (offset - base)
        # Admission needs `need < remaining_total`: growth > deficit - 1 (the deficit carries
        # the +1 of the integer form, but ratio-scaled reservations are fractional).
        hit = np.nonzero(gain > deficit - 1)[0]
        return int(hit[0]) + 1 if hit.size else k_max

    def _iteration_done(self, kind: str, what: Any, dur: float) -> None:
        self._busy = False
        if kind == "prefill":
            self._prefill_done(what, dur)
        else:
            self._decode_done(what, dur)

    def _prefill_done(self, adder: PrefillAdder, dur: float) -> None:
        self.prefilling = [self.chunked] if self.chunked is not None else []
        for adm in adder.batch:
            req = adm.req
            req.done_prefill += adm.new_tokens
            req.service_s += dur
            req.task.attained_s += dur
            if req.done_prefill < req.extend_tokens:
                continue  # mid-chunk
            self._cache_prompt(req)
            self._allocate(1)
            req.private_tokens += 1
            req.generated += 1
            if req.first_token_s is None:
                req.first_token_s = self.now
            if req.remaining_output <= 0:
                self._finish(req)
            else:
                self.running.append(req)

    def _cache_prompt(self, req: SimRequest) -> None:
        """`cache_unfinished_req`: the computed prompt joins the tree; the lock moves to it.

        The prompt's private KV becomes cache (or, where another request inserted the same
        segments meanwhile, is freed as a duplicate); redone output tokens stay private.
        """
        assert req.lock_node is not None
        idx = self._matched_segments(req)
        last, _ = self.cache.insert(req.lock_node, req.prompt[idx:], self.now)
        prompt_private = req.extend_tokens - req.redo_tokens
        self.private_tokens -= prompt_private
        req.private_tokens -= prompt_private
        self.cache.lock(last)
        self.cache.unlock(req.lock_node)
        req.lock_node = last

    @staticmethod
    def _matched_segments(req: SimRequest) -> int:
        done = 0
        for i, seg in enumerate(req.prompt):
            if done >= req.cached_tokens:
                return i
            done += seg.tokens
        return len(req.prompt)

    def _decode_done(self, steps: int, dur: float) -> None:
        b = len(self.running)
        self._allocate(b * steps)
        for req in self.running:
            req.generated += steps
            req.private_tokens += steps
            req.service_s += dur
            req.task.attained_s += dur
        cfg = self.cfg
        self.ratio = max(self.ratio - cfg.new_token_ratio_decay * steps, cfg.min_new_token_ratio)
        self.estimator.observe_decode(dur / steps, steps)
        finished = [r for r in self.running if r.remaining_output <= 0]
        if finished:
            self.running = [r for r in self.running if r.remaining_output > 0]
            for req in finished:
                self._finish(req)

    def _finish(self, req: SimRequest) -> None:
        """`cache_finished_req`: prompt + output join the tree; the request's locks go."""
        assert req.lock_node is not None
        last, _ = self.cache.insert(req.lock_node, [req.output_segment], self.now)
        self.private_tokens -= req.private_tokens
        req.private_tokens = 0
        self.cache.unlock(req.lock_node)
        self.cache.touch(last, self.now)
        req.lock_node = None
        req.finish_s = self.now
        self.estimator.observe(req.agent, req.kind, req.generated)
        self.rec.request(req)
        run = req.task
        st = run.stages[req.stage_id]
        run.set_state(st.id, StageState.DONE)
        run.pending -= 1
        for child_id in st.children:
            child = run.stages[child_id]
            child.remaining_deps -= 1
            if child.remaining_deps == 0:
                run.set_state(child_id, StageState.DELAYED)
                self._push(self.now + child.delay_s, READY, (run, child_id))
        if run.pending == 0:
            run.finish_s = self.now
            del self.tasks[run.id]
            self.rec.task(run)
            self._done_tasks += 1
            if self._on_task_done is not None:
                self._on_task_done(self._done_tasks)
