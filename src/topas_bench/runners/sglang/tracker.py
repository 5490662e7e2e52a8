"""Server-side task progress for the SGLang plugin: the requests, stages and tasks a policy sees.

Engine-neutral (no SGLang import): it reads an engine request only through `EngineReq`, so the
same code runs under SGLang's real `Req` in the plugin and under plain objects in unit tests.
At every scheduling point the adapter calls `sync(waiting, running)`; the tracker then moves
each request between WAITING, RUNNING and DONE (a RUNNING request seen waiting again was
preempted or retracted), feeds finished requests to the service-time estimator, and updates
the task DAGs built from the requests' metadata (`metadata.RequestMeta`). Their tasks and stages
are the workflow's (`runners.workflow`: the same views and DAG release as the simulator's),
built here from metadata and lazily.

Stages the server has not seen yet are BLOCKED while a dependency is unfinished, else DELAYED
(the client's tool delay is running). A task leaves when all its stages are done, or when it
has been idle for `idle_ttl_s` (its client went away).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence, Sized
from typing import Any, Protocol

from topas_bench.runners.sglang.metadata import (
    DEFAULT_LIMITS,
    Limits,
    RequestMeta,
    StageMeta,
    decode,
    gc_paused,
    independent,
    is_large,
)
from topas_bench.runners.workflow import WorkflowStage, WorkflowTask
from topas_bench.schedulers.base import StageState
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.workloads.model import Segment


class EngineReq(Protocol):
    """What the tracker reads from an engine's request object (SGLang's `Req` satisfies it)."""

    rid: str
    origin_input_ids: Sized
    output_ids: Sized
    sampling_params: Any

    def finished(self) -> bool: ...


class TrackedRequest:
    """A request as a policy sees it (satisfies `RequestView`)."""

    __slots__ = (
        "admitted_s",
        "agent",
        "engine",
        "first_admitted_s",
        "kind",
        "meta",
        "preemptions",
        "queued_s",
        "ready_s",
        "rid",
        "served_s",
        "stage_id",
        "state",
        "task_id",
    )

    def __init__(self, rid: int, engine: EngineReq, meta: RequestMeta, now_s: float) -> None:
        self.rid = rid
        self.engine = engine
        self.meta = meta
        self.task_id = meta.task_id
        self.stage_id = meta.stage_id
        self.agent = meta.agent
        self.kind = meta.kind
        self.ready_s = now_s
        self.queued_s = now_s
        self.admitted_s: float | None = None
        self.first_admitted_s: float | None = None
        self.preemptions = 0
        self.served_s = 0.0  # seconds of the batches it was in (`Tracker.served`)
        self.state = StageState.WAITING

    @property
    def prompt(self) -> Sequence[Segment]:
        return self.meta.segments

    @property
    def prompt_tokens(self) -> int:
        return len(self.engine.origin_input_ids)

    @property
    def generated(self) -> int:
        return len(self.engine.output_ids)

    @property
    def max_new_tokens(self) -> int:
        return int(getattr(self.engine.sampling_params, "max_new_tokens", None) or 0)

    @property
    def service_s(self) -> float:
        return self.served_s

    def start(self, now_s: float) -> None:
        self.state = StageState.RUNNING
        self.admitted_s = now_s
        if self.first_admitted_s is None:
            self.first_admitted_s = now_s

    def stop(self, now_s: float, state: StageState) -> None:
        self.state = state
        if state == StageState.WAITING:
            self.preemptions += 1
            self.queued_s = now_s
            self.admitted_s = None


_BLOCKED, _DELAYED = StageState.BLOCKED, StageState.DELAYED  # (enum lookups, per stage)


class TrackedStage(WorkflowStage[StageMeta, TrackedRequest]):
    """A stage of a task built from metadata. Its children's ids and the stages whose outputs
    its prompt carries are worked out on first use: a DAG may have 100,000 stages, most of
    which no policy ever asks about. An output adds what its request generated."""

    __slots__ = ("_children", "_dag", "_kids", "_peers")

    def __init__(self, meta: StageMeta, kids: list[int], dag: Sequence[StageMeta]) -> None:
        self.spec = meta
        self.sent_tokens = meta.prompt_tokens
        self._kids = kids  # indices into `dag`
        self._dag = dag
        self._peers: Mapping[str, TrackedStage] = {}  # its task's stages (`TrackedTask`)
        self._children: tuple[str, ...] | None = None
        self.state = _BLOCKED if meta.deps else _DELAYED
        self.request = None

    @property
    def children(self) -> tuple[str, ...]:
        if self._children is None:
            self._children = tuple([self._dag[c].id for c in self._kids])
        return self._children

    def _carried(self) -> Sequence[tuple[WorkflowStage[Any, Any], int]]:
        if not self.spec.outputs:
            return ()
        out: list[tuple[WorkflowStage[Any, Any], int]] = []
        for sid in self.spec.outputs:
            up = self._peers.get(sid)
            if up is not None:
                out.append((up, up.request.generated if up.request is not None else 0))
        return out


class TrackedTask(WorkflowTask[TrackedStage]):
    """A live task whose DAG comes from the first request's metadata."""

    __slots__ = ("last_seen_s",)

    def __init__(self, meta: RequestMeta, arrival_s: float) -> None:
        self.id = meta.task_id
        self.workflow = meta.workflow
        self.arrival_s = arrival_s
        self.attained_s = 0.0
        self.version = 0
        self.last_seen_s = arrival_s
        dag = meta.stages
        order, children = _topo(dag)
        self._stages = {dag[i].id: TrackedStage(dag[i], children[i], dag) for i in order}
        for st in self._stages.values():
            if st.spec.outputs:
                st._peers = self._stages
        self._done = 0


def _topo(stages: Sequence[StageMeta]) -> tuple[list[int], list[list[int]]]:
    """The stages' indices in dependency order, and each stage's children (indices, in
    declaration order). Order: by depth (the longest dependency chain above a stage), ties in
    declaration order. A cycle, or a dependency on a stage that is not there, leaves the
    stages it blocks at the end in declaration order rather than failing. Linear (Kahn)."""
    index = {s.id: i for i, s in enumerate(stages)}
    missing = [len(s.deps) for s in stages]  # dependencies not yet placed, per stage
    children: list[list[int]] = [[] for _ in stages]
    for i, s in enumerate(stages):
        for d in s.deps:
            j = index.get(d)
            if j is not None:
                children[j].append(i)
    depth = [0] * len(stages)
    ready = [i for i, n in enumerate(missing) if n == 0]
    for i in ready:  # `ready` grows while it is walked: a FIFO queue
        below = depth[i] + 1
        for c in children[i]:
            if depth[c] < below:
                depth[c] = below
            missing[c] -= 1
            if missing[c] == 0:
                ready.append(c)
    if len(ready) == len(stages):  # a DAG: stable bucket sort by depth, linear
        buckets: list[list[int]] = [[] for _ in range(max(depth, default=0) + 1)]
        for i, level in enumerate(depth):
            buckets[level].append(i)
        return [i for b in buckets for i in b], children
    placed = set(ready)
    order = sorted(ready, key=lambda i: (depth[i], i))
    return order + [i for i in range(len(stages)) if i not in placed], children


class Tracker:
    """Requests and tasks the server has seen, and the warning counts for bad metadata."""

    def __init__(
        self,
        estimator: ServiceEstimator,
        clock: Callable[[], float],
        unix_clock: Callable[[], float],
        idle_ttl_s: float = 3600.0,
        limits: Limits = DEFAULT_LIMITS,
    ) -> None:
        self.estimator = estimator
        self.limits = limits
        self.clock = clock
        self._unix_offset = unix_clock() - clock()
        self.idle_ttl_s = idle_ttl_s
        self.requests: dict[str, TrackedRequest] = {}
        self.tasks: dict[str, TrackedTask] = {}
        #: agent -> the token ids of its shared prefix (first request of the agent seen)
        self.agent_prefixes: dict[str, tuple[int, ...]] = {}
        #: reason -> requests served as independent tasks because of it (a warning metric)
        self.untagged: dict[str, int] = {}
        self._ids = itertools.count()

    def add(self, req: EngineReq) -> TrackedRequest:
        """A new request entered the server. Never raises on bad metadata: anything wrong with
        it (or any failure while building its task) serves the request as an independent
        one-stage task and counts the reason in `untagged`."""
        now = self.clock()
        try:
            custom = getattr(req.sampling_params, "custom_params", None)
            with gc_paused(is_large(custom)):
                meta, reason = decode(custom, self.limits)
                if meta is not None and meta.prefix_tokens > len(req.origin_input_ids):
                    meta, reason = None, "malformed: prefix longer than the prompt"
                if meta is not None:
                    return self._track(req, meta, now)
        except Exception as e:  # a bug of ours or a request we cannot read: degrade, not crash
            reason = f"internal: {type(e).__name__} while tracking the request"
        reason = reason or "missing"
        self.untagged[reason] = self.untagged.get(reason, 0) + 1
        return self._track(req, independent(req.rid, len(req.origin_input_ids)), now)

    def _track(self, req: EngineReq, meta: RequestMeta, now: float) -> TrackedRequest:
        task = self.tasks.get(meta.task_id)
        if task is None:
            arrival = meta.arrival_unix_s - self._unix_offset if meta.arrival_unix_s >= 0 else now
            task = self.tasks[meta.task_id] = TrackedTask(meta, min(arrival, now))
        tr = TrackedRequest(next(self._ids), req, meta, now)
        stage = task.stages.get(meta.stage_id)
        if stage is not None:
            stage.request = tr
            task.set_state(meta.stage_id, StageState.WAITING)
        task.last_seen_s = now
        if meta.agent and meta.agent not in self.agent_prefixes and meta.prefix_tokens:
            ids = list(req.origin_input_ids)  # type: ignore[call-overload]
            self.agent_prefixes[meta.agent] = tuple(int(t) for t in ids[: meta.prefix_tokens])
        self.requests[req.rid] = tr
        return tr

    def get(self, req: EngineReq) -> TrackedRequest:
        tr = self.requests.get(req.rid)
        return tr if tr is not None else self.add(req)

    def admitted(self, req: EngineReq) -> None:
        """The engine just admitted `req` into a prefill batch."""
        tr = self.get(req)
        if tr.state == StageState.WAITING:
            tr.start(self.clock())
            self._set(tr, StageState.RUNNING)

    def sync(self, waiting: Sequence[EngineReq], running: Sequence[EngineReq]) -> None:
        """Bring every request's state up to date with the engine's queues."""
        now = self.clock()
        in_wait = {r.rid for r in waiting}
        in_run = {r.rid for r in running}
        for r in [*waiting, *running]:
            self.get(r)
        for rid, tr in list(self.requests.items()):
            if tr.engine.finished():
                self._finish(rid, tr, now)
            elif rid in in_wait:
                if tr.state == StageState.RUNNING:
                    self._stop(tr, now, StageState.WAITING)
            elif tr.state == StageState.WAITING and (rid in in_run or tr.generated > 0):
                # Admitted (it may be mid-prefill, in neither queue, until its batch ends).
                tr.start(now)
                self._set(tr, StageState.RUNNING)
        self._expire(now)

    def served(self, req: EngineReq, seconds: float) -> None:
        """`req` was in a batch (prefill or decode) that took `seconds`: attained service."""
        tr = self.requests.get(req.rid)
        if tr is None:
            return
        tr.served_s += seconds
        task = self.tasks.get(tr.task_id)
        if task is not None:
            task.attained_s += seconds

    def requeued(self, req: EngineReq) -> None:
        """The engine sent a running request back to its waiting queue (retracted or
        preempted), now."""
        tr = self.requests.get(req.rid)
        if tr is not None and tr.state == StageState.RUNNING:
            self._stop(tr, self.clock(), StageState.WAITING)

    def finished(self, reqs: Sequence[EngineReq]) -> None:
        """Requests of a batch whose results were just processed: the finished ones leave,
        in batch order, feeding the estimator as they go."""
        now = self.clock()
        for r in reqs:
            tr = self.requests.get(r.rid)
            if tr is not None and r.finished():
                self._finish(r.rid, tr, now)

    def _stop(self, tr: TrackedRequest, now: float, state: StageState) -> None:
        tr.stop(now, state)
        self._set(tr, state)

    def _set(self, tr: TrackedRequest, state: StageState) -> None:
        task = self.tasks.get(tr.task_id)
        if task is not None and tr.stage_id in task.stages:
            task.set_state(tr.stage_id, state)
            task.last_seen_s = self.clock()

    def _finish(self, rid: str, tr: TrackedRequest, now: float) -> None:
        self._stop(tr, now, StageState.DONE)
        del self.requests[rid]
        if tr.generated > 0:
            self.estimator.observe(tr.agent, tr.kind, tr.generated)
        task = self.tasks.get(tr.task_id)
        if task is None:
            return
        if tr.stage_id in task.stages:
            task.stage_done(tr.stage_id)
        if task.done:
            del self.tasks[task.id]

    def _expire(self, now: float) -> None:
        live = {tr.task_id for tr in self.requests.values()}
        for tid, task in list(self.tasks.items()):
            if tid not in live and now - task.last_seen_s > self.idle_ttl_s:
                del self.tasks[tid]
