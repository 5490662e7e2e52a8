"""The simulator's running batch: decode steps, retraction and preemption (SGLang 0.5.23's
`Scheduler.update_running_batch`, `ScheduleBatch.retract_decode`, `NewTokenRatioTracker`;
mini-sglang's `DecodeManager`).

A decode iteration retracts when the next step does not fit (`retract_decode`), else decays
`new_token_ratio`. Decode steps in which nothing else can happen are advanced in closed form,
as one event: while the latch is set (or nothing waits) up to the first finish, the next client
event (unless latched) and the memory headroom; across a standing decision
(`runners.sim.standing`) up to the first attempt the decision does not cover. Whenever SGLang
would attempt a prefill, the simulator does too, one iteration at a time, so a policy is
consulted exactly where a real server consults it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from topas_bench.runners.sim import standing
from topas_bench.runners.sim.core import ITER, SimulationError
from topas_bench.runners.sim.events import Events
from topas_bench.runners.sim.state import SimRequest
from topas_bench.runners.sim.view import SimView


class Decode(Events):
    """The decode half of `engine.Simulator`'s iterations."""

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
        if k > 1 and self.uploads:  # so is an upload's time
            k = min(k, int(ends.searchsorted(self.uploads[0][0], side="left")) + 1)
        if k > 1 and attempt and stand is not None:
            k = standing.run_steps(self, stand, k, durs, ends)
            self._stand_run = stand if k > 1 else None
        return durs[:k], ends[:k]

    def _decode_fits(self, b: int) -> bool:
        """`check_decode_mem`: evict what the next step needs; does it fit now?"""
        self._evict_for(b)
        return self.free_tokens >= b

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
