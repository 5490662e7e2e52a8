"""The discrete-event simulator of one SGLang server (docs/design.md section 4), mirroring SGLang
0.5.23.

Each iteration is `Scheduler.get_next_batch_to_run` (non-overlap loop, page size 1):
1. A prefill attempt (`_get_new_batch_prefill_raw`) unless the `batch_is_full` latch is set (or
   the queue is empty) and no chunked request is in flight. An attempt runs the queue's prefix
   bookkeeping (`SchedulePolicy.calc_priority`: LPM matches every waiting request, the
   cache-agnostic policies refresh the first 128 every 32nd call), asks the policy, then admits
   in queue order through `PrefillAdder` (`admission.py`), matching each candidate first.
2. Else one decode step for the running batch (`update_running_batch`): retract when the step
   does not fit (`retract_decode`), else decay `new_token_ratio`; steps in which nothing else
   can happen run in closed form, as one event.

`Simulator` is built in layers, one manager a module, each using only the ones below it (as
mini-sglang splits its scheduler into managers):
- `core`: the state they share, and the engine's error;
- `residency`: KV memory, the radix cache's inserts and locks, kept prefixes and contexts;
- `events`: the client and the event heap (arrivals, sends, receipt, a task's DAG release);
- `decode`: the running batch's decode steps, retraction and preemption;
- `prefill`: prefill attempts (admission) and their batches' end;
- here: the loop, and the policy's decision at an attempt.
"""

from __future__ import annotations

import heapq
import time
from typing import Any

from topas_bench.runners.records import SimResult
from topas_bench.runners.sim import standing
from topas_bench.runners.sim.core import ARRIVE, ITER, READY, SimulationError, Step
from topas_bench.runners.sim.pins import set_prefix_priorities
from topas_bench.runners.sim.prefill import Prefill
from topas_bench.runners.sim.view import SimView
from topas_bench.schedulers.base import Decision

__all__ = ["ARRIVE", "ITER", "READY", "SimulationError", "Simulator", "Step"]


class Simulator(Prefill):
    """Runs one workload under one policy on one simulated server."""

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

    def _iteration_done(self, kind: str, what: Any, dur: float) -> None:
        self._busy = False
        if kind == "prefill":
            self._prefill_done(what, dur)
        else:
            self._decode_done(what, dur)

    def _calc_priority(self) -> Decision | None:
        """`SchedulePolicy.calc_priority` on the waiting queue (`calc_priority.QueuePass`: the
        prefix bookkeeping and SGLang's own order for `needs.schedule_policy`), then the
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
