"""The simulator's prefill attempts: admission from the waiting queue into a prefill batch and
the batch's end (SGLang 0.5.23's `Scheduler._get_new_batch_prefill_raw` and
`process_batch_result_prefill`; mini-sglang's `PrefillManager`). The budget of one pass is
`admission.PrefillAdder`; the queue's order and the policy's decision are the engine's
(`engine.Simulator._calc_priority`).

The `batch_is_full` latch is set when an attempt runs out of memory (NO_TOKEN) or request
slots, and cleared only when a request leaves the running batch (it finishes, is retracted or
preempted, a chunked prefill batch ends) or the batch is empty; arrivals do not clear it. A
policy with `acts_while_full` clears it before every attempt (SGLang's
`enable_priority_preemption` door).
"""

from __future__ import annotations

import numpy as np

from topas_bench.runners.sim import standing
from topas_bench.runners.sim.admission import AddResult, PrefillAdder
from topas_bench.runners.sim.core import SimulationError
from topas_bench.runners.sim.decode import Decode
from topas_bench.runners.sim.state import SimRequest
from topas_bench.schedulers.base import Decision, StageState


class Prefill(Decode):
    """The prefill half of `engine.Simulator`'s iterations."""

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

    def _slots(self) -> int:
        """`get_num_allocatable_reqs`: request slots left for new prefills."""
        return self.cfg.max_running_requests - len(self.running)

    def _calc_priority(self) -> Decision | None:
        """The queue's order and the policy's decision for an attempt (`engine.Simulator`)."""
        raise NotImplementedError

    def _liveness(self, adder: PrefillAdder) -> bool:
        """Kept prefixes may not starve an idle server: with nothing admitted or running,
        release them and retry (as the plugin's adapter does)."""
        if adder.batch or self.running or not (self.pins or self.contexts):
            return False
        self._release_pins()
        return True

    def _apply_preemptions(
        self, decision: Decision | None, adder: PrefillAdder
    ) -> list[SimRequest]:
        """The plugin's adder releases the policy's preemptions first (`preempt_to_schedule`).
        A policy whose class declares it never preempts (`Capabilities.preempts`) is held to
        it."""
        if decision is None or not decision.preempt:
            return []
        if not self.policy.capabilities.preempts:
            raise SimulationError(
                f"scheduler {self.policy.name!r} declares that it never preempts, but its "
                f"decision preempts {len(decision.preempt)} running request(s)"
            )
        rids = {self._own(r).rid for r in decision.preempt}
        out = []
        for req in list(self.running):
            if req.rid in rids:
                adder.release(req)
                self._release(req, len(self.running) - 1)
                out.append(req)
        return out

    def _admit(self, req: SimRequest, adder: PrefillAdder) -> None:
        adm = adder.batch[-1]
        assert adm.match is not None
        req.lock_node = adm.match.node
        if self.policy.refreshes_contexts:
            self.contexts.refresh(adm.match.node, self.now)
        req.prefix_len = adm.match.gpu_tokens
        req.cached_tokens = adm.match.gpu_tokens + adm.match.host_tokens
        req.admitted_s = self.now
        if req.first_admitted_s is None:
            req.first_admitted_s = self.now
        req.task.set_state(req.stage_id, StageState.RUNNING)
        if adm.match.host_nodes:
            self._load_back(req, adm.match)
        self.rec.admission(req.prompt_tokens, min(req.cached_tokens, req.prompt_tokens))

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
