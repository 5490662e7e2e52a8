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

This module holds SGLang's subclasses: `TopasPrefillAdder`, `TopasSchedulePolicy` and the
`Scheduler` that `make_scheduler_class` builds for the plugin. They act through a `Bridge`
(`bridge.py`: the policy, its tracker, kept prefixes and contexts, the decision being applied,
independent of how a `Scheduler` is built, so CPU tests drive it with SGLang's real classes),
which shows the policy an `SglangView` (`view.py`). Only these three modules import SGLang's
scheduler.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Callable
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
from sglang.srt.runtime_context import get_memory  # type: ignore[import-not-found]

from topas_bench.runners.sglang.bridge import Bridge, DecisionHook
from topas_bench.schedulers.base import Policy

SGLANG_VERSION = "0.5.23"
logger = logging.getLogger("topas_bench.sglang")


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
