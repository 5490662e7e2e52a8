"""The simulator's client and event heap: tasks arrive, a stage's request is sent after its
dependencies and the client's delay, the server receives what was sent at its next iteration,
and a finished request releases its children (mini-sglang's scheduler `io`; SGLang's
`process_input_requests` and `_add_request_to_queue`).

Events live in a heap of `(time, seq, kind, payload)`; `seq` is per simulator, so runs are
deterministic and nothing leaks between runs. Kinds: a task arrives (`ARRIVE`), a stage's
request is sent (`READY`), an engine iteration ends (`ITER`). A replica of a simulated cluster
(`runners.cluster.replica`) hands this half to the cluster.
"""

from __future__ import annotations

import heapq
from typing import Any

from topas_bench.runners.sim.core import ITER, READY
from topas_bench.runners.sim.residency import Residency
from topas_bench.runners.sim.state import SimRequest
from topas_bench.runners.workflow import TaskRun
from topas_bench.schedulers.base import StageState
from topas_bench.workloads.model import Task


class Events(Residency):
    """The client half of `engine.Simulator`: events, requests received, tasks released."""

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

    def _begin(self, dur: float, payload: tuple[Any, ...]) -> None:
        self._busy = True
        self._push(self.now + dur, ITER, payload)

    def _arrive(self, task: Task) -> None:
        run = self.tasks[task.id] = TaskRun(task)
        for st in run.first_stages():
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
            self._observe_tool(req, t)
            self._enqueue(req, t)
            req.arrival_processed_tokens = counter
        self.inbox = []

    def _observe_tool(self, req: SimRequest, t: float) -> None:
        """What a server sees of the client's tool time: from the finish of the last call the
        request depends on to its receipt (the estimator's `observe_tool`)."""
        stages = req.task.stages
        ends = []
        for d in stages[req.stage_id].deps:
            dep = stages[d].request
            if dep is None or dep.finish_s is None:
                return
            ends.append(dep.finish_s)
        if ends:
            self.estimator.observe_tool(req.agent, req.kind, t - max(ends))

    def _enqueue(self, req: SimRequest, at_s: float | None = None) -> None:
        """`_add_request_to_queue`: new, retracted and preempted requests join at the end."""
        req.queued_s = self.now if at_s is None else at_s
        req.enqueue_seq = next(self._enqueues)
        req.arrival_processed_tokens = self.processed_tokens
        req.task.set_state(req.stage_id, StageState.WAITING)
        self.waiting.append(req)

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
        for child in run.stage_done(req.stage_id):
            self._push(self.now + child.delay_s, READY, (run, child.id))
        if run.done:
            run.finish_s = self.now
            del self.tasks[run.id]
            self.rec.task(run)
            self._done_tasks += 1
            if self._on_task_done is not None:
                self._on_task_done(self._done_tasks)
