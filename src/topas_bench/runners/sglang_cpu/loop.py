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
The loop writes the same records as the simulator (`runners.sim.records`).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

import pandas as pd
from sglang.srt.managers.io_struct import TokenizedGenerateReqInput  # type: ignore[import-not-found]
from sglang.srt.sampling.sampling_params import SamplingParams  # type: ignore[import-not-found]

from topas_bench.runners.sglang import metadata
from topas_bench.runners.sglang_cpu.tokens import TokenIds
from topas_bench.runners.sim.cost import CostModel
from topas_bench.runners.sim.engine import Step
from topas_bench.runners.sim.records import (
    DECISION_COLUMNS,
    REQUEST_COLUMNS,
    TASK_COLUMNS,
    TIMELINE_COLUMNS,
)
from topas_bench.workloads.model import Task, Workload, agent_key, output_key

ARRIVE, READY = 0, 1


class Clock:
    """The virtual clock, shared with the plugin's task tracker (which reads it as time)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Call:
    """One stage's request: what the client and the recorder know about it."""

    __slots__ = (
        "admitted_s", "agent", "cached_tokens", "finish_s", "first_admitted_s", "first_token_s",
        "in_flight", "kind", "output_tokens", "preemptions", "prompt_tokens", "ready_s", "rid",
        "seq", "service_s", "stage_id", "task",
    )  # fmt: skip

    def __init__(self, seq: int, task: TaskState, stage_id: str, now_s: float) -> None:
        stage = task.task.stage(stage_id)
        self.seq = seq
        self.rid = f"{task.task.id}/{stage_id}"
        self.task = task
        self.stage_id = stage_id
        self.agent = stage.agent
        self.kind = stage.kind
        self.prompt_tokens = stage.prompt_tokens
        self.output_tokens = min(stage.output_tokens, stage.max_new_tokens)
        self.ready_s = now_s
        self.admitted_s: float | None = None
        self.first_admitted_s: float | None = None
        self.first_token_s: float | None = None
        self.finish_s: float | None = None
        self.preemptions = 0
        self.service_s = 0.0
        self.cached_tokens = 0
        self.in_flight = False  # admitted and not since sent back to the waiting queue


class TaskState:
    __slots__ = ("attained_s", "finish_s", "pending", "remaining_deps", "task")

    def __init__(self, task: Task) -> None:
        self.task = task
        self.remaining_deps = {s.id: len(s.deps) for s in task.stages}
        self.pending = len(task.stages)
        self.attained_s = 0.0
        self.finish_s: float | None = None


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
        self.calls: dict[str, Call] = {}
        self.script: dict[str, list[int]] = {}  # rid -> scripted output ids (the worker's)
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._calls_seq = itertools.count()
        self._requests: list[tuple[Any, ...]] = []
        self._tasks: list[tuple[Any, ...]] = []
        self._timeline: list[tuple[Any, ...]] = []
        self._decisions: list[tuple[Any, ...]] = []
        self.iterations = 0
        self.preemptions = 0
        self.prompt_tokens = 0
        self.hit_tokens = 0
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
                ts = TaskState(payload)
                for st in payload.stages:
                    if not st.deps:
                        self._push(payload.arrival_s + st.delay_s, READY, (ts, st.id))
            else:
                ts, stage_id = payload
                call = Call(next(self._calls_seq), ts, stage_id, t)
                self.calls[call.rid] = call
                self.script[call.rid] = self.tokens.segment(
                    output_key(ts.task.id, stage_id), call.output_tokens
                )
                out.append(self._tokenized(call))
        return out

    def _tokenized(self, call: Call) -> Any:
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
            rid=call.rid, input_text=None, input_ids=self.tokens.prompt(stage.prompt),
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
        if call is not None and call.in_flight:
            call.in_flight = False
            call.preemptions += 1
            call.admitted_s = None
            self.preemptions += 1

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
        return self._tables()

    def _iteration(self, batch: Any) -> None:
        s = self.sched
        extend = batch.forward_mode.is_extend()
        start = self.clock.now
        if extend:
            items = list(zip(batch.prefix_lens, batch.extend_lens, strict=True))
            dur = self.cost.prefill_s(items)
            for req, cached in zip(batch.reqs, batch.prefix_lens, strict=True):
                call = self.calls[req.rid]
                if not call.in_flight:  # a fresh admission (not a chunk continuation)
                    call.in_flight = True
                    call.admitted_s = start
                    if call.first_admitted_s is None:
                        call.first_admitted_s = start
                    call.cached_tokens = int(cached)
                    self.prompt_tokens += call.prompt_tokens
                    self.hit_tokens += min(int(cached), call.prompt_tokens)
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
        self.iterations += 1
        reqs = list(batch.reqs)
        for req in reqs:
            call = self.calls[req.rid]
            call.service_s += dur
            call.task.attained_s += dur
            if call.first_token_s is None and len(req.output_ids) > 0:
                call.first_token_s = self.clock.now
        self._timeline_row("prefill" if extend else "decode", dur, reqs, new)
        for req in reqs:
            if req.finished() and self.calls[req.rid].finish_s is None:
                self._finish(self.calls[req.rid], len(req.output_ids))

    def _finish(self, call: Call, generated: int) -> None:
        now = self.clock.now
        call.finish_s = now
        self._requests.append(
            (call.seq, call.task.task.id, call.stage_id, call.agent, call.kind,
             call.prompt_tokens, generated, call.cached_tokens, call.ready_s,
             call.first_admitted_s, call.admitted_s, call.first_token_s, call.finish_s,
             call.preemptions, call.service_s, "ok")
        )  # fmt: skip
        ts = call.task
        ts.pending -= 1
        task = ts.task
        for st in task.stages:
            if call.stage_id in st.deps:
                ts.remaining_deps[st.id] -= 1
                if ts.remaining_deps[st.id] == 0:
                    self._push(now + st.delay_s, READY, (ts, st.id))
        if ts.pending == 0:
            ts.finish_s = now
            self._tasks.append(
                (task.id, task.workflow, task.arrival_s, now, now - task.arrival_s,
                 len(task.stages), ts.attained_s)
            )  # fmt: skip
            self.done_tasks += 1
            if self.on_task_done is not None:
                self.on_task_done(self.done_tasks)

    def _timeline_row(self, kind: str, dur: float, reqs: list[Any], new: int) -> None:
        if not self.record_timeline:
            return
        s = self.sched
        batch = len(reqs)
        agents = len({self.calls[r.rid].agent for r in reqs})
        budget = int(s.max_total_num_tokens)
        free = int(s.token_to_kv_pool_allocator.available_size())
        cache = int(s.tree_cache.evictable_size()) + int(s.tree_cache.protected_size())
        used = budget - free
        waiting = len(s.waiting_queue)
        last = self._timeline[-1] if self._timeline else None
        # Consecutive decode steps of an unchanged batch and queue merge into one row, as the
        # simulator's closed-form decode runs do.
        if (
            kind == "decode" and last is not None and last[1] == "decode"
            and last[4] == batch and last[9] == waiting and last[11] == agents
        ):  # fmt: skip
            self._timeline[-1] = (
                last[0], "decode", last[2] + 1, last[3] + dur, batch, last[5] + new, used,
                cache, used - cache, waiting, last[10], agents,
            )  # fmt: skip
            return
        self._timeline.append(
            (self.clock.now - dur, kind, 1, dur, batch, new, used, cache, used - cache, waiting,
             self._resident(), agents)
        )  # fmt: skip

    def _resident(self) -> str:
        from topas_bench.runners.sglang.adapter import device_prefix_len

        names = []
        for a in self.w.agents:
            ids = self.tokens.segment(agent_key(a.name), a.prefix_tokens)
            if device_prefix_len(self.sched.tree_cache, ids) >= len(ids):
                names.append(a.name)
        return "|".join(names)

    def decision(self, wall_s: float, waiting: int, admit: int, preempt: int) -> None:
        self._decisions.append((self.clock.now, wall_s, waiting, admit, preempt))

    def _tables(self) -> dict[str, pd.DataFrame]:
        return {
            "requests": pd.DataFrame(self._requests, columns=REQUEST_COLUMNS),
            "tasks": pd.DataFrame(self._tasks, columns=TASK_COLUMNS),
            "timeline": pd.DataFrame(self._timeline, columns=TIMELINE_COLUMNS),
            "decisions": pd.DataFrame(self._decisions, columns=DECISION_COLUMNS),
        }
