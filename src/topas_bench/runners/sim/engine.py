"""The discrete-event simulator of one SGLang server (docs/design.md section 4), mirroring SGLang
0.5.23.

Events live in a heap of `(time, seq, kind, payload)`; `seq` is per simulator, so runs are
deterministic and nothing leaks between runs. Kinds: a task arrives, a stage's request is sent
(after its dependencies and the client's delay), an engine iteration ends.

Each iteration is `Scheduler.get_next_batch_to_run` (non-overlap loop, page size 1):
1. A prefill attempt (`_get_new_batch_prefill_raw`) unless the `batch_is_full` latch is set (or
   the queue is empty) and no chunked request is in flight. The latch is set when an attempt
   runs out of memory (NO_TOKEN) or request slots, and cleared only when a request leaves the
   running batch (it finishes, is retracted or preempted, a chunked prefill batch ends) or the
   batch is empty; arrivals do not clear it. A policy with `acts_while_full` clears it before
   every attempt (SGLang's `enable_priority_preemption` door). An attempt runs the queue's
   prefix bookkeeping (`SchedulePolicy.calc_priority`: LPM matches every waiting request, the
   cache-agnostic policies refresh the first 128 every 32nd call), asks the policy, then admits
   in queue order through `PrefillAdder` (`admission.py`), matching each candidate first.
2. Else one decode step for the running batch (`update_running_batch`): retract when the step
   does not fit (`retract_decode`), else decay `new_token_ratio`.
Decode steps in which nothing else can happen are advanced in closed form, as one event: while
the latch is set (or nothing waits) up to the first finish, the next client event (unless
latched) and the memory headroom. Whenever SGLang would attempt a prefill, the simulator does
too, one iteration at a time, so a policy is consulted exactly where a real server consults it.

KV bookkeeping is SGLang's: a batch allocates its extend tokens when it forms; a prefill's
tokens join the radix tree when it ends (`checkpoint_kv_cache`), the request's lock moving to
them; a decode step allocates one token per request for the last token's KV; a finished request
inserts its prompt and all outputs but the last (`release_kv_cache`), a retracted or preempted
one frees its private KV and releases its lock without inserting, then evicts enough cache to
leave `remaining requests * retract_decode_steps` tokens free (`release_req`).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from topas_bench.errors import TopasError
from topas_bench.runners.sim import standing
from topas_bench.runners.sim.admission import AddResult, PrefillAdder, running_offset
from topas_bench.runners.sim.calc_priority import QueuePass
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel
from topas_bench.runners.sim.pins import ContextPins, Prefetcher, set_prefix_priorities
from topas_bench.runners.sim.radix import Match, Node, RadixCache
from topas_bench.runners.sim.records import Recorder, SimResult
from topas_bench.runners.sim.standing import Stand
from topas_bench.runners.sim.state import SimRequest, TaskRun
from topas_bench.runners.sim.view import SimView
from topas_bench.schedulers.base import Decision, Policy, StageState
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.workloads.model import Task, Workload, agent_key
from topas_bench.workloads.pieces import Piece, take

ARRIVE, READY, ITER = 0, 1, 2
#: One iteration as it starts (its KV allocated): kind, the prefill batch's
#: `(request, cached tokens, new tokens)` or the decode batch size, free KV, evictable cache,
#: waiting requests. The reference engine records the same (`sglang_cpu.loop`).
Step = tuple[str, Any, int, int, int]


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
        *,
        trace: list[Step] | None = None,
        stand: bool = True,
    ) -> None:
        self.workload = workload
        #: With a trace, every iteration is recorded (`Step`) and runs alone, one decode step
        #: per event, for lockstep comparisons with the reference engine.
        self.trace = trace
        #: Run decode in closed form across standing decisions (`runners.sim.standing`);
        #: False asks the policy at every attempt (the step-by-step path, for comparisons).
        self.stand = stand
        self._stand: Stand | None = None  # what the last attempt's decision offers
        self._stand_run: Stand | None = None  # the stand the decode run in flight covers
        self._run_start_s = 0.0  # when the decode run in flight started
        self._decided: standing.Marker | None = None  # the state the last decision saw
        self.policy = policy
        self.needs = policy.needs  # what it needs of the server, read once (`ServerNeeds`)
        self.cost = cost
        self.cfg = config
        self.cache = RadixCache(
            config.host_tier_tokens, self.needs.eviction, self.needs.protected_threshold,
        )  # fmt: skip
        self.queue_pass = QueuePass(
            self.needs.schedule_policy, self.needs.eviction, self.needs.seed
        )
        #: `Scheduler.processed_tokens_counter` (`hrrn`'s clock): `extend_num_tokens` of every
        #: batch run so far; a decode batch counts what the running batch's first prefill had.
        self.processed_tokens = 0
        self.decode_extend_tokens = 0
        self.private_tokens = 0
        self.waiting: list[SimRequest] = []  # SGLang's waiting_queue, in its order
        self.running: list[SimRequest] = []  # the running (decode) batch, in its order
        self.chunked: SimRequest | None = None
        self.prefilling: list[SimRequest] = []  # the in-flight prefill batch
        self.batch_is_full = False
        self.ratio = config.init_new_token_ratio
        self.pins: dict[str, Node] = {}  # agent -> its locked prefix node (kept prefixes)
        self.contexts = ContextPins(self.cache)  # finished contexts kept for a while
        #: Requests finished in the last iteration, whose context the policy may keep.
        self.finished_pending: list[SimRequest] = []
        self._asks_ttl = type(policy).context_ttl is not Policy.context_ttl
        self.prefetcher = Prefetcher(self.cache, cost.host_load_s)
        self.inbox: list[SimRequest] = []  # sent while the server was busy: not received yet
        self.agents_seen: set[str] = set()  # agents of the requests received so far
        self._ends: npt.NDArray[np.float64] | None = None  # step ends of the iteration run
        #: The prefill-token counter before that run, and what each of its steps added.
        self._ends_counter = (0, 0)
        self.now = 0.0
        self.tasks: dict[str, TaskRun] = {}
        self.prefix_tokens = {a.name: a.prefix_tokens for a in workload.agents}
        #: (tree version, agent -> its prefix's (GPU, host) tokens): the view's probes
        self.prefix_probes: tuple[int, dict[str, tuple[int, int]]] = (-1, {})
        #: `TpModelWorker.get_worker_info`: the longest request the server accepts.
        self.max_req_len = min(config.context_length - 1, config.kv_budget_tokens - 1)
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
        self._on_task_done = on_task_done
        self._done_tasks = 0
        self._resident: tuple[int, str] = (-1, "")  # (cache version, resident agents)

    # -- public -----------------------------------------------------------------------------
    @property
    def free_tokens(self) -> int:
        return self.cfg.kv_budget_tokens - self.cache.gpu_tokens - self.private_tokens

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        for task in self.workload.tasks:
            self._push(task.arrival_s, ARRIVE, task)
        heap = self._heap
        while heap:
            self._advance()
            if not self._busy:
                self._step()
            if self.cfg.check_invariants:
                self.check_invariants()
        if self._done_tasks != len(self.workload.tasks):
            raise SimulationError(
                f"{len(self.workload.tasks) - self._done_tasks} tasks never finished "
                f"under scheduler {self.policy.name!r}"
            )
        return self.rec.result(self.now, time.perf_counter() - wall0)

    def _advance(self) -> int:
        """Move the clock to the next event and handle every event at that instant; returns
        how many iterations ended there."""
        heap = self._heap
        self.now = heap[0][0]
        ended = 0
        while heap and heap[0][0] == self.now:
            _, _, kind, payload = heapq.heappop(heap)
            if kind == ARRIVE:
                self._arrive(payload)
            elif kind == READY:
                self._send(payload)
            else:
                self._iteration_done(*payload)
                ended += 1
        return ended

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

    # -- the client ---------------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, payload))

    def _next_event_s(self) -> float | None:
        """When the next event of the run happens (None: none is due); an idle server with
        waiting requests and nothing due is stuck."""
        return self._heap[0][0] if self._heap else None

    def _run_horizon_s(self) -> float | None:
        """The next moment a request may reach the server, where a closed-form run of decode
        steps must stop (None: no bound). One server: the next event of the run. A replica of
        a cluster (`runners.cluster.replica`) answers for itself."""
        return self._next_event_s()

    def _arrive(self, task: Task) -> None:
        run = TaskRun(task)
        self.tasks[task.id] = run
        for st in run.stages.values():
            if not st.deps:
                self._push(self.now + st.delay_s, READY, (run, st.id))

    def _send(self, payload: tuple[TaskRun, str]) -> None:
        run, stage_id = payload
        st = run.stages[stage_id]
        # `Scheduler.init_req_max_new_tokens`: the server clips the client's cap to fit.
        max_new = max(0, min(st.stage.max_new_tokens, self.max_req_len - st.prompt_tokens - 1))
        req = SimRequest(next(self._rids), run, st.stage, self.now, max_new)
        st.request = req
        self.inbox.append(req)

    def _receive(self) -> None:
        """`process_input_requests` at the top of an iteration: requests sent during the last
        one join the queue as of the step boundary that first followed them."""
        ends = self._ends
        for req in self.inbox:
            t = self.now
            counter = self.processed_tokens
            if ends is not None and req.sent_s < self.now:
                j = int(ends.searchsorted(req.sent_s, side="left"))
                t = float(ends[j])
                counter = self._ends_counter[0] + self._ends_counter[1] * (j + 1)
            req.ready_s = t
            self.agents_seen.add(req.agent)
            self._enqueue(req, t)
            req.arrival_processed_tokens = counter
        self.inbox = []

    def _enqueue(self, req: SimRequest, at_s: float | None = None) -> None:
        """`_add_request_to_queue`: new, retracted and preempted requests join at the end."""
        req.queued_s = self.now if at_s is None else at_s
        req.enqueue_seq = next(self._enqueues)
        req.arrival_processed_tokens = self.processed_tokens
        req.task.set_state(req.stage_id, StageState.WAITING)
        self.waiting.append(req)

    # -- one iteration ------------------------------------------------------------------------
    def _step(self) -> None:
        self._receive()
        self._maintain_contexts()
        adder = self._prefill_attempt()
        if adder is not None:
            self._start_prefill(adder)
            return
        if self.running:
            self._start_decode()
            return
        if self.waiting and self._next_event_s() is None:
            raise SimulationError(
                f"scheduler {self.policy.name!r} admitted nothing while the server was idle "
                f"and {len(self.waiting)} requests waited"
            )
        if not self.waiting and self.chunked is None:
            self.ratio = self.cfg.init_new_token_ratio  # `on_idle`, fully idle: reset

    def _slots(self) -> int:
        """`get_num_allocatable_reqs`: request slots left for new prefills."""
        return self.cfg.max_running_requests - len(self.running)

    def _prefill_attempt(self) -> PrefillAdder | None:
        """`_get_new_batch_prefill_raw`: the admission pass, or None when none runs or it
        admits nobody."""
        self._stand = None
        if self.needs.acts_while_full or not self.running:
            self.batch_is_full = False
        if (self.batch_is_full or not self.waiting) and self.chunked is None:
            return None
        if self._slots() <= 0 and self.chunked is None:
            self.batch_is_full = True
            return None
        decision = self._calc_priority()
        adder = PrefillAdder(
            self.cache, lambda: self.free_tokens, self.running, self.ratio, self.cfg
        )
        preempted = self._apply_preemptions(decision, adder)
        still_chunked = False
        if self.chunked is not None:
            limit = self.queue_pass.chunk_limit(self.chunked, self.waiting, adder.rem_chunk)
            still_chunked = adder.add_chunked(self.chunked, limit)
        admit = None if decision is None else {r.rid for r in decision.admit}
        for req in self.waiting:
            if adder.budget_state() is AddResult.OTHER:
                break
            if len(adder.batch) >= self._slots():
                self.batch_is_full = True
                break
            match = self._match(req.fill(), req.fill_tokens - 1)  # `init_next_round_input`
            if admit is not None and req.rid not in admit:
                res = AddResult.OTHER  # the plugin's adder: nobody past the policy's admits
            else:
                res = adder.add_one(req, match)
                if res is AddResult.NO_TOKEN and self._liveness(adder):
                    res = adder.add_one(req, self._match(req.fill(), req.fill_tokens - 1))
            if adder.batch and adder.batch[-1].req is req:
                self._admit(req, adder)
            if res is not AddResult.CONTINUE:
                if res is AddResult.NO_TOKEN:
                    self.batch_is_full = bool(adder.batch) or bool(self.running)
                break
        if not adder.batch:
            for req in preempted:
                self._enqueue(req)
            if self.stand and decision is not None and not preempted:
                self._stand = standing.offer(self, decision, self._decided)
            return None
        admitted = {a.req.rid for a in adder.batch}
        self.waiting = [r for r in self.waiting if r.rid not in admitted]
        for req in preempted:
            self._enqueue(req)
        if not still_chunked:
            self.chunked = adder.new_chunked
        return adder

    def _liveness(self, adder: PrefillAdder) -> bool:
        """Kept prefixes may not starve an idle server: with nothing admitted or running,
        release them and retry (as the plugin's adapter does)."""
        if adder.batch or self.running or not (self.pins or self.contexts):
            return False
        self._release_pins()
        return True

    def _calc_priority(self) -> Decision | None:
        """`SchedulePolicy.calc_priority` on the waiting queue (`calc_priority.QueuePass`: the
        prefix bookkeeping and SGLang's own order for the policy's `sglang_policy`), then the
        policy's decision (the plugin's `Bridge.decide`): its admits first, in its order, the
        rest after."""
        self.waiting = self.queue_pass.run(
            self.waiting, self.cache, self._match_req, self.processed_tokens
        )
        if not self.waiting:
            return None
        view = SimView(self)
        t0 = time.perf_counter()
        decision = self.policy.decide(view)
        self.rec.decision(self.now, time.perf_counter() - t0, len(self.waiting), decision)
        if decision.stands is not None:
            self._decided = standing.marker(self)
        waiting = {r.rid: r for r in self.waiting}
        first = [waiting.pop(r.rid) for r in map(self._own, decision.admit) if r.rid in waiting]
        self.waiting = first + [r for r in self.waiting if r.rid in waiting]
        if decision.keep_prefixes is not None:
            self._keep(decision.keep_prefixes)
        if decision.prefix_priority is not None:
            set_prefix_priorities(self.cache, decision.prefix_priority, self.prefix_tokens)
        if decision.prefetch and self.cfg.host_tier_tokens:
            self.prefetcher.run(
                decision.prefetch, self.prefix_tokens, self.now, lambda: self.free_tokens,
                self._evict_for,
            )  # fmt: skip
        return decision

    def _match_req(self, req: SimRequest) -> tuple[int, Node]:
        m = self.cache.match(req.fill())
        return m.gpu_tokens, m.node

    def _apply_preemptions(
        self, decision: Decision | None, adder: PrefillAdder
    ) -> list[SimRequest]:
        """The plugin's adder releases the policy's preemptions first (`preempt_to_schedule`)."""
        if decision is None or not decision.preempt:
            return []
        rids = {self._own(r).rid for r in decision.preempt}
        out = []
        for req in list(self.running):
            if req.rid in rids:
                adder.release(req)
                self._release(req, len(self.running) - 1)
                out.append(req)
        return out

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
        then ask the policy about the requests that finished in the last one
        (`Policy.context_ttl`; the adapter does the same in `get_new_batch_prefill`)."""
        if self.contexts:
            self.contexts.expire(self.now, self.tasks)
        pending, self.finished_pending = self.finished_pending, []
        if not pending:
            return
        view = SimView(self)
        for req in pending:
            if req.task_id not in self.tasks or req.context_node is None:
                continue
            ttl = self.policy.context_ttl(req, view)
            if ttl > 0:
                expires = self.now + ttl
                self.contexts.pin(req.rid, req.context_node, req.task_id, expires, self._pin_room())

    def _match(self, key: list[Piece], limit: int | None = None) -> Match:
        return self.cache.match(key, limit)

    def _own(self, req: Any) -> SimRequest:
        if not isinstance(req, SimRequest):
            raise SimulationError(f"scheduler {self.policy.name!r} returned a foreign request")
        return req

    def _admit(self, req: SimRequest, adder: PrefillAdder) -> None:
        adm = adder.batch[-1]
        assert adm.match is not None
        req.lock_node = adm.match.node
        req.prefix_len = adm.match.gpu_tokens
        req.cached_tokens = adm.match.gpu_tokens + adm.match.host_tokens
        req.admitted_s = self.now
        if req.first_admitted_s is None:
            req.first_admitted_s = self.now
        req.task.set_state(req.stage_id, StageState.RUNNING)
        if adm.match.host_nodes:
            self._load_back(req, adm.match)
        self.rec.admission(req.prompt_tokens, min(req.cached_tokens, req.prompt_tokens))

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

    def _start_prefill(self, adder: PrefillAdder) -> None:
        self._alloc(sum(a.new_tokens for a in adder.batch))
        for adm in adder.batch:
            adm.req.private_tokens += adm.new_tokens
        items = [(a.cached_before, a.new_tokens) for a in adder.batch]
        load = sum(a.match.host_tokens for a in adder.batch if a.match is not None)
        dur = self.cost.prefill_s(items) + (self.cost.host_load_s(load) if load else 0.0)
        dur += self.prefetcher.stall([a.req.lock_node for a in adder.batch], self.now)
        new = sum(a.new_tokens for a in adder.batch)
        self._ends_counter = (self.processed_tokens, new)
        self.processed_tokens += new
        self.rec.iteration(1, self._row("prefill", dur, 1, [a.req for a in adder.batch], new))
        self.prefilling = [a.req for a in adder.batch]
        if self.trace is not None:
            batch = tuple(
                (f"{a.req.task_id}/{a.req.stage_id}", a.cached_before, a.new_tokens)
                for a in adder.batch
            )
            self.trace.append(self._trace_step("prefill", batch))
        self._ends = np.array([self.now + dur])
        self._begin(dur, ("prefill", adder, dur))

    def _start_decode(self) -> None:
        """`update_running_batch`, then as many decode steps as nothing can interrupt."""
        b = len(self.running)
        if (self.pins or self.contexts) and not self._decode_fits(b):
            self._release_pins()  # running requests win over kept prefixes (the adapter)
        if not self._decode_fits(b):
            self._retract()
        else:
            self._decay(1)
        b = len(self.running)
        ctx = sum(r.context_tokens for r in self.running)
        durs, ends = self._decode_run(b, ctx)
        steps = len(ends)
        self._decay_run(steps - 1)  # the later steps' (the first step's is above)
        self._alloc(b * steps)
        self._ends_counter = (self.processed_tokens, self.decode_extend_tokens)
        self.processed_tokens += self.decode_extend_tokens * steps
        for req in self.running:
            req.private_tokens += steps
        dur = float(ends[-1]) - self.now
        if self.trace is not None:
            self.trace.append(self._trace_step("decode", b))
        self.rec.iteration(steps, self._row("decode", dur, steps, self.running, b * steps))
        self._busy = True
        self._ends = ends
        self._run_start_s = self.now
        self._push(float(ends[-1]), ITER, ("decode", durs, dur))

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

    def _trace_step(self, kind: str, batch: Any) -> Step:
        return (kind, batch, self.free_tokens, self.cache.evictable_tokens, len(self.waiting))

    def _decay(self, steps: int) -> None:
        """`NewTokenRatioTracker.decay_step`, `steps` times."""
        if steps > 0:
            decayed = self.ratio - self.cfg.new_token_ratio_decay * steps
            self.ratio = max(decayed, self.cfg.min_new_token_ratio)

    def _decay_run(self, steps: int) -> None:
        """The decay of a decode run's later `steps`: one step at a time across a standing
        decision (as the attempts it covers would have seen it, to the last bit), else in
        one product."""
        if self._stand_run is None:
            self._decay(steps)
            return
        self.ratio = standing.decayed(self.ratio, steps, self.cfg)[-1]

    def _decode_fits(self, b: int) -> bool:
        """`check_decode_mem`: evict what the next step needs; does it fit now?"""
        self._evict_for(b)
        return self.free_tokens >= b

    def _decode_run(
        self, b: int, ctx: int
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Durations and end times of the decode steps to run as one event (ends accumulated
        one step at a time, as a real clock advances): 1 step whenever SGLang would attempt a
        prefill before the next; else up to the first finish and the memory headroom and,
        unless the latch is set (then arrivals change nothing), the next client event."""
        k = 1
        attempt = (
            self.trace is not None
            or self.chunked is not None
            or (self.waiting and (not self.batch_is_full or self.needs.acts_while_full))
        )
        stand = self._stand
        self._stand = self._stand_run = None
        if attempt and stand is not None and stand.marker == standing.marker(self):
            # the attempts until the next one the decision does not cover: never evict
            k = min(min(r.remaining_output for r in self.running), self.free_tokens // b)
            k = max(k, 1)
        elif not attempt:
            k = min(r.remaining_output for r in self.running)
            k = max(min(k, (self.free_tokens + self.cache.evictable_tokens) // b), 1)
        durs = self.cost.decode_steps_s(b, ctx, k)
        ends = np.cumsum(np.concatenate(([self.now], durs)))[1:]
        nxt = self._run_horizon_s()
        if k > 1 and nxt is not None and not self.batch_is_full:
            k = min(k, int(ends.searchsorted(nxt, side="left")) + 1)
        if k > 1 and self.contexts:  # a context's release is seen at the next iteration
            k = min(k, int(ends.searchsorted(self.contexts.next_expiry(), side="left")) + 1)
        if k > 1 and attempt and stand is not None:
            k = standing.run_steps(self, stand, k, durs, ends)
            self._stand_run = stand if k > 1 else None
        return durs[:k], ends[:k]

    def _retract(self) -> None:
        """`retract_decode`: retract in the policy's order (at least one request) until the
        next step fits, keeping at least one; then re-estimate `new_token_ratio`."""
        order = [self._own(r) for r in self.policy.retraction_order(SimView(self))]
        first = True
        for victim in order:
            if len(self.running) == 1:
                break
            if not first and self._decode_fits(len(self.running)):
                break
            first = False
            self._release(victim, len(self.running) - 1)
            self._enqueue(victim)
        if not self._decode_fits(len(self.running)):
            raise SimulationError(
                "out of KV memory even after retracting every other request (SGLang aborts "
                "the last one)"
            )
        decoded = sum(r.generated for r in self.running)
        max_new = sum(r.max_new_tokens for r in self.running)
        n = len(self.running)
        self.ratio = min(1.0, (decoded + self.cfg.retract_decode_steps * n) / (max_new + 1))
        self.batch_is_full = False

    def _release(self, req: SimRequest, remaining: int) -> None:
        """`release_req` for a running request sent back to the queue (retraction or policy
        preemption): free its private KV, release its lock, make room for the `remaining`."""
        self.running.remove(req)
        self.private_tokens -= req.private_tokens
        req.private_tokens = 0
        if req.lock_node is not None:
            self.cache.unlock(req.lock_node)
            req.lock_node = None
        req.prefix_len = 0
        req.inserted_len = 0  # `Req.reset_for_retract`
        req.preemptions += 1
        req.admitted_s = None
        self.rec.preemption()
        self.batch_is_full = False
        self._evict_for(remaining * self.cfg.retract_decode_steps)

    def _begin(self, dur: float, payload: tuple[Any, ...]) -> None:
        self._busy = True
        self._push(self.now + dur, ITER, payload)

    # -- iteration ends -------------------------------------------------------------------------
    def _iteration_done(self, kind: str, what: Any, dur: float) -> None:
        self._busy = False
        if kind == "prefill":
            self._prefill_done(what, dur)
        else:
            self._decode_done(what, dur)

    def _prefill_done(self, adder: PrefillAdder, dur: float) -> None:
        """`process_batch_result_prefill`, then the next step's merge of the batch into the
        running batch: the chunked request's chunk joins the tree (`stash_chunked_request`),
        and a chunked or finished request leaving the batch clears the latch. An empty running
        batch is replaced by the prefill batch (`running_batch = last_batch`), whose latch is
        a new batch's: clear, and its `extend_num_tokens` stays with it (`prepare_for_decode`
        keeps it), so each decode step of it adds them to the prefill-token counter again."""
        self.prefilling = []
        replaced = not self.running
        if replaced:
            self.batch_is_full = False
        chunk: tuple[SimRequest, int] | None = None
        for adm in adder.batch:
            req = adm.req
            req.service_s += dur
            req.task.attained_s += dur
            end = adm.cached_before + adm.new_tokens
            if end < req.fill_tokens:
                chunk = (req, end)
                continue
            if req.first_token_s is None:
                req.first_token_s = self.now
            req.generated += 1
            if req.remaining_output <= 0:
                self._finish(req, end)
                self.batch_is_full = False
            else:
                self._checkpoint(req, end)
                self.running.append(req)
        if chunk is not None:
            self._checkpoint(*chunk)
            self.batch_is_full = False
        if replaced and self.running:
            self.decode_extend_tokens = sum(a.new_tokens for a in adder.batch)

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

    def _decode_done(self, durs: npt.NDArray[np.float64], dur: float) -> None:
        steps = len(durs)
        if self._stand_run is not None:  # the attempts the run covered, before its last step
            standing.replay(self, self._stand_run, steps - 1)
            self._stand_run = None
            assert self._ends is not None
            standing.serve(self.running, self._ends, self._run_start_s, steps)
        else:
            for req in self.running:
                req.generated += steps
                req.service_s += dur
                req.task.attained_s += dur
        # step by step, as the plugin observes a real server's steps
        self.estimator.observe_decode_steps(durs.tolist())
        finished = [r for r in self.running if r.remaining_output <= 0]
        if finished:
            self.running = [r for r in self.running if r.remaining_output > 0]
            for req in finished:
                self._finish(req, req.fill_tokens - 1)
            self.batch_is_full = False

    def _finish(self, req: SimRequest, committed: int) -> None:
        """`release_kv_cache(checkpoint=True)`: the fill up to the last computed token (the
        prompt and every output but the last) joins the tree; the request's locks go."""
        assert req.lock_node is not None
        req.context_node = self._insert(req, committed)
        self.private_tokens -= req.private_tokens
        req.private_tokens = 0
        self.cache.unlock(req.lock_node)
        req.lock_node = None
        req.finish_s = self.now
        if self._asks_ttl:
            self.finished_pending.append(req)
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
