"""The virtual-clock loop around SGLang's `Scheduler`, and the workflow client it serves.

One pass mirrors `Scheduler.event_loop_normal` (0.5.23): requests the client has sent by now
enter through `process_input_requests` (the receive path minus the socket), then
`get_next_batch_to_run`; a batch runs (`run_batch` on the scripted worker), the clock advances
by the cost model's duration of that batch, and `process_batch_result` finishes it. With no
batch the scheduler idles (`on_idle`: its leak checks and the `new_token_ratio` reset) and the
clock jumps to the client's next event. Nothing sleeps; nothing reads the wall clock.

The client side is the simulator's: a task's stages are sent when their dependencies have
finished plus the stage's delay, with the same prompts (as token ids, `tokens.TokenIds`),
`max_new_tokens` and `ignore_eos` (exact-length calls), and task metadata in `custom_params`.
Requests are the simulator's (`runners.sim.state`), tasks the workflow's (`runners.workflow`: a
task's DAG is released by `TaskRun.stage_done`), and the loop writes its records through the
simulator's recorder (`runners.records.Recorder`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

import pandas as pd
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput  # type: ignore[import-not-found]
from sglang.srt.sampling.sampling_params import SamplingParams  # type: ignore[import-not-found]

from topas_bench.runners.records import Recorder
from topas_bench.runners.sglang import metadata
from topas_bench.runners.sglang_cpu.tokens import TokenIds
from topas_bench.runners.sim.cost import CostModel
from topas_bench.runners.sim.engine import Step
from topas_bench.runners.sim.state import SimRequest
from topas_bench.runners.workflow import TaskRun
from topas_bench.schedulers.base import Decision
from topas_bench.workloads.model import Workload, agent_key, output_key

ARRIVE, READY = 0, 1


class Clock:
    """The virtual clock, shared with the plugin's task tracker (which reads it as time)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def sglang_rid(req: SimRequest) -> str:
    """The request's id on SGLang's side (its `Req.rid`): its task and stage."""
    return f"{req.task_id}/{req.stage_id}"


class ReferenceLoop:
    """Serves one workload through one constructed scheduler; `run()` returns the tables."""

    def __init__(
        self,
        workload: Workload,
        tokens: TokenIds,
        cost: CostModel,
        clock: Clock,
        *,
        record_timeline: bool = True,
        on_task_done: Callable[[int], None] | None = None,
        trace: list[Step] | None = None,
        routing_key: bool = False,
    ) -> None:
        self.trace = trace
        #: Send each request's agent as its `routing_key` (SGLang's `routing-key` policy).
        self.routing_key = routing_key
        self.sched: Any = None  # the scheduler, built with this loop's script and hooks
        self.w = workload
        self.tokens = tokens
        self.cost = cost
        self.clock = clock
        self.record_timeline = record_timeline
        self.on_task_done = on_task_done
        self.prefix_tokens = {a.name: a.prefix_tokens for a in workload.agents}
        #: SGLang's rid -> the request (`SimRequest`: admitted while `admitted_s` is set)
        self.calls: dict[str, SimRequest] = {}
        self.script: dict[str, list[int]] = {}  # rid -> scripted output ids (the worker's)
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._calls_seq = itertools.count()
        self.rec = Recorder(record_timeline)
        self.done_tasks = 0

    # -- the client ---------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, payload))

    def _deliver(self) -> list[Any]:
        """Client events up to now: tasks arrive, stages are sent. Returns the new requests."""
        out = []
        now = self.clock.now
        while self._heap and self._heap[0][0] <= now:
            t, _, kind, payload = heapq.heappop(self._heap)
            if kind == ARRIVE:
                run = TaskRun(payload)
                for st in payload.stages:  # the task's order (`TaskRun.stages` is topological)
                    if not st.deps:
                        self._push(payload.arrival_s + st.delay_s, READY, (run, st.id))
            else:
                run, stage_id = payload
                stage = run.stages[stage_id].stage
                call = SimRequest(next(self._calls_seq), run, stage, t, stage.max_new_tokens)
                rid = sglang_rid(call)
                self.calls[rid] = call
                self.script[rid] = self.tokens.segment(
                    output_key(run.id, stage_id), call.output_target
                )
                out.append(self._tokenized(call))
        return out

    def _tokenized(self, call: SimRequest) -> Any:
        task = call.task.task
        stage = task.stage(call.stage_id)
        params = metadata.encode(
            task, stage, task.arrival_s, self.prefix_tokens.get(stage.agent, 0)
        )
        sp = SamplingParams(
            max_new_tokens=stage.max_new_tokens,
            ignore_eos=stage.max_new_tokens == stage.output_tokens,
            temperature=0.0,
            custom_params=params,
        )
        sp.normalize(None)  # the tokenizer manager's job before a request reaches the scheduler
        sp.verify(self.tokens.vocab_size)
        return TokenizedGenerateReqInput(
            rid=sglang_rid(call), input_text=None, input_ids=self.tokens.prompt(stage.prompt),
            input_embeds=None, mm_inputs=None, token_type_ids=None, sampling_params=sp,
            return_logprob=False, logprob_start_len=-1, top_logprobs_num=0,
            token_ids_logprob=None, stream=False,
            routing_key=stage.agent if self.routing_key else None,
        )  # fmt: skip

    # -- the server loop ----------------------------------------------------------------
    def on_requeue(self, req: Any, is_retracted: bool) -> None:
        """A request re-enters the waiting queue: retracted (decode ran out of memory) or
        preempted by the policy. New requests enter here too (not in flight yet)."""
        call = self.calls.get(req.rid)
        if call is not None and call.admitted_s is not None:
            call.preemptions += 1
            call.admitted_s = None
            self.rec.preemption()

    def run(self) -> dict[str, pd.DataFrame]:
        for task in self.w.tasks:
            self._push(task.arrival_s, ARRIVE, task)
        s = self.sched
        s.last_batch = None
        total = len(self.w.tasks)
        while self.done_tasks < total:
            new = self._deliver()
            if new:
                s.process_input_requests(new)
            plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
            s.running_batch = plan.running_batch
            batch = plan.batch_to_run
            if batch is None:
                s._sched_idled = True
                s.on_idle()  # before `last_batch` is cleared, as `event_loop_normal` orders it
                s.last_batch = None
                if not self._heap:
                    raise RuntimeError(
                        f"SGLang's scheduler is idle with {len(s.waiting_queue)} waiting "
                        f"requests and nothing left to arrive"
                    )
                self.clock.now = max(self.clock.now, self._heap[0][0])
                continue
            self._iteration(batch)
        return self.rec.tables()

    def _iteration(self, batch: Any) -> None:
        s = self.sched
        extend = batch.forward_mode.is_extend()
        start = self.clock.now
        if extend:
            items = list(zip(batch.prefix_lens, batch.extend_lens, strict=True))
            dur = self.cost.prefill_s(items)
            for req, cached in zip(batch.reqs, batch.prefix_lens, strict=True):
                call = self.calls[req.rid]
                if call.admitted_s is None:  # a fresh admission (not a chunk continuation)
                    call.admitted_s = start
                    if call.first_admitted_s is None:
                        call.first_admitted_s = start
                    call.cached_tokens = int(cached)
                    self.rec.admission(call.prompt_tokens, min(int(cached), call.prompt_tokens))
            new = int(sum(batch.extend_lens))
        else:
            ctx = sum(len(r.origin_input_ids) + len(r.output_ids) for r in batch.reqs)
            dur = self.cost.decode_step_s(len(batch.reqs), ctx)
            new = len(batch.reqs)
        if self.trace is not None:
            free = int(s.token_to_kv_pool_allocator.available_size())
            evictable = int(s.tree_cache.evictable_size())
            what: Any = len(batch.reqs)
            if extend:
                what = tuple(
                    (r.rid, int(c), int(n))
                    for r, c, n in zip(
                        batch.reqs, batch.prefix_lens, batch.extend_lens, strict=True
                    )
                )
            kind = "prefill" if extend else "decode"
            self.trace.append((kind, what, free, evictable, len(s.waiting_queue)))
        result = s.run_batch(batch)
        self.clock.now = start + dur
        s.process_batch_result(batch, result)
        s.last_batch = batch
        reqs = list(batch.reqs)
        for req in reqs:
            call = self.calls[req.rid]
            call.service_s += dur
            call.task.attained_s += dur
            if call.first_token_s is None and len(req.output_ids) > 0:
                call.first_token_s = self.clock.now
        self._record_iteration("prefill" if extend else "decode", dur, reqs, new)
        for req in reqs:
            if req.finished() and self.calls[req.rid].finish_s is None:
                self._finish(self.calls[req.rid], len(req.output_ids))

    def _finish(self, call: SimRequest, generated: int) -> None:
        now = self.clock.now
        call.finish_s = now
        call.generated = generated
        self.rec.request(call)
        run = call.task
        for child in run.stage_done(call.stage_id):
            self._push(now + child.delay_s, READY, (run, child.id))
        if run.done:
            run.finish_s = now
            self.rec.task(run)
            self.done_tasks += 1
            if self.on_task_done is not None:
                self.on_task_done(self.done_tasks)

    def _record_iteration(self, kind: str, dur: float, reqs: list[Any], new: int) -> None:
        if not self.record_timeline:
            self.rec.iteration(1, None)
            return
        s = self.sched
        batch = len(reqs)
        agents = len({self.calls[r.rid].agent for r in reqs})
        budget = int(s.max_total_num_tokens)
        free = int(s.token_to_kv_pool_allocator.available_size())
        cache = int(s.tree_cache.evictable_size()) + int(s.tree_cache.protected_size())
        used = budget - free
        waiting = len(s.waiting_queue)
        last = self.rec.last_row
        # Consecutive decode steps of an unchanged batch and queue merge into one row, as the
        # simulator's closed-form decode runs do.
        if (
            kind == "decode" and last is not None and last[1] == "decode"
            and last[4] == batch and last[9] == waiting and last[11] == agents
        ):  # fmt: skip
            row = (
                last[0], "decode", last[2] + 1, last[3] + dur, batch, last[5] + new, used,
                cache, used - cache, waiting, last[10], agents,
            )  # fmt: skip
            self.rec.iteration(1, row, merge=True)
            return
        self.rec.iteration(1, (
            self.clock.now - dur, kind, 1, dur, batch, new, used, cache, used - cache, waiting,
            self._resident(), agents,
        ))  # fmt: skip

    def _resident(self) -> str:
        from topas_bench.runners.sglang.view import device_prefix_len

        names = []
        for a in self.w.agents:
            ids = self.tokens.segment(agent_key(a.name), a.prefix_tokens)
            if device_prefix_len(self.sched.tree_cache, ids) >= len(ids):
                names.append(a.name)
        return "|".join(names)

    def decision(self, wall_s: float, waiting: int, d: Decision) -> None:
        self.rec.decision(self.clock.now, wall_s, waiting, d)
