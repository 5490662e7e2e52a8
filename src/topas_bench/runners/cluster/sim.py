"""The simulated cluster: one client, a router, N replicas, one event heap and one clock.

The client is the single simulator's, lifted out: a task arrives, its stages become ready after
their dependencies and tool delays, and each ready stage's request is routed (`routers`) to a
replica (`replica.Replica`), which receives it at its next iteration boundary. Heap entries are
`(time, seq, kind, payload)` with one `seq` counter for the whole cluster, so a run is
deterministic; an iteration's entry names its replica. After the events of one instant, the
replicas they touched (and any idle one with requests waiting) take their next iteration, in
replica order. Request ids are the cluster's, unique across replicas.

With one replica this is the single-server simulator exactly (the same events in the same
order; tests/test_cluster.py checks it row for row).
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from topas_bench.runners.cluster.replica import Replica
from topas_bench.runners.cluster.routers import Route, Router
from topas_bench.runners.records import SimResult
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel
from topas_bench.runners.sim.engine import ARRIVE, READY, SimulationError
from topas_bench.runners.sim.state import SimRequest
from topas_bench.runners.workflow import TaskRun
from topas_bench.schedulers.base import Policy
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.workloads.model import Task, Workload
from topas_bench.workloads.pieces import pieces


class _Ids:
    """A request-id counter whose next value can be read before it is taken."""

    def __init__(self) -> None:
        self.next = 0

    def __iter__(self) -> _Ids:
        return self

    def __next__(self) -> int:
        n = self.next
        self.next += 1
        return n


@dataclass(frozen=True)
class ClusterResult:
    """Each replica's `SimResult` (its requests, tasks finished there, timeline, decisions),
    the router's figures, and the run's simulated and wall time."""

    replicas: list[SimResult]
    busy_s: list[float]
    router: dict[str, Any]
    sim_time_s: float
    wall_s: float
    routed: list[int] = field(default_factory=list)

    def table(self, name: str) -> pd.DataFrame:
        """One of `requests`, `tasks`, `timeline`, `decisions` over all replicas, with a
        `replica` column; rows in the order of the single simulator's (requests and tasks by
        finish time, the rest by time), ties by replica."""
        frames = [getattr(r, name).assign(replica=i) for i, r in enumerate(self.replicas)]
        df: pd.DataFrame = pd.concat(frames, ignore_index=True)
        by = {"requests": "finish_s", "tasks": "finish_s"}.get(name, "t_s")
        if not df.empty:
            df = df.sort_values([by, "replica"], kind="stable").reset_index(drop=True)
        return df


class ClusterSim:
    """Runs one workload on `len(policies)` replicas behind `router`."""

    def __init__(
        self,
        workload: Workload,
        policies: Sequence[Policy],
        cost: CostModel,
        config: SimConfig,
        router: Router,
        on_task_done: Callable[[int], None] | None = None,
    ) -> None:
        if len(policies) != router.n:
            raise SimulationError(f"{len(policies)} policies for a router of {router.n} replicas")
        self.workload = workload
        self.router = router
        self.single = len(policies) == 1
        self.tasks: dict[str, TaskRun] = {}
        self.rids = _Ids()
        self.now = 0.0
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._routes: dict[int, tuple[Route, int]] = {}
        self._on_task_done = on_task_done
        self._done = 0
        self.routed = [0] * router.n
        self._truths: dict[tuple[str, str], int] | None = None
        agents = replace(workload, tasks=())
        done = self._task_done
        self.replicas = [
            Replica(i, self, agents, p, cost, config, self._estimator(cost, config, p), done)
            for i, p in enumerate(policies)
        ]

    def _estimator(self, cost: CostModel, config: SimConfig, policy: Policy) -> ServiceEstimator:
        """A replica's own estimator; with the oracle hint or an oracle variant
        (`Policy.oracle_lengths`, as the single server's), every replica reads one lookup of
        true lengths (a replica's own would hold every stage of the workload N times)."""
        if config.length_hint != "oracle" and not policy.oracle_lengths:
            return ServiceEstimator(cost)
        if self._truths is None:
            self._truths = {(t.id, s.id): s.output_tokens for t, s in self.workload.stages()}
        truths = self._truths
        return ServiceEstimator(cost, true_length=lambda t, s: truths[(t, s)])

    # -- what replicas call -----------------------------------------------------------------
    def push(self, t: float, kind: int, payload: Any) -> int:
        seq = next(self._seq)
        heapq.heappush(self._heap, (t, seq, kind, payload))
        return seq

    def next_event_s(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def request_done(self, replica: int, req: SimRequest) -> None:
        route, k = self._routes.pop(req.rid)
        self.router.release(route, k, self.now, req.generated)

    def _task_done(self, _: int) -> None:
        self._done += 1
        if self._on_task_done is not None:
            self._on_task_done(self._done)

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> ClusterResult:
        wall0 = time.perf_counter()
        for task in self.workload.tasks:
            self.push(task.arrival_s, ARRIVE, task)
        heap, replicas = self._heap, self.replicas
        stalled: set[int] = set()  # idle replicas with requests waiting: stepped every instant
        check = replicas[0].cfg.check_invariants
        while heap:
            now = self.now = heap[0][0]
            touched = set(stalled)
            while heap and heap[0][0] == now:
                _, seq, kind, payload = heapq.heappop(heap)
                if kind == ARRIVE:
                    self._arrive(payload)
                elif kind == READY:
                    touched.add(self._send(*payload))
                elif replicas[payload[0]].iteration_done(seq, payload[1], now):
                    touched.add(payload[0])
            for k in sorted(touched) if not self.single else (0,):
                rep = replicas[k]
                rep.step(now)
                if rep.idle and rep.waiting:
                    stalled.add(k)
                else:
                    stalled.discard(k)
                if check:
                    rep.check_invariants()
        if self._done != len(self.workload.tasks):
            raise SimulationError(
                f"{len(self.workload.tasks) - self._done} tasks never finished under scheduler "
                f"{replicas[0].policy.name!r} behind router {self.router.name!r}"
            )
        wall = time.perf_counter() - wall0
        return ClusterResult(
            [r.rec.result(self.now, wall) for r in replicas], [r.busy_s for r in replicas],
            self.router.stats(), self.now, wall, self.routed,
        )  # fmt: skip

    def _arrive(self, task: Task) -> None:
        run = self.tasks[task.id] = TaskRun(task)
        for st in run.first_stages():
            self.push(self.now + st.delay_s, READY, (run, st.id))

    def _send(self, run: TaskRun, stage_id: str) -> int:
        st = run.stages[stage_id]
        key = tuple(pieces(st.stage.prompt))
        route = Route(
            self.rids.next, run.id, stage_id, st.agent, st.kind, key, key, st.prompt_tokens,
            task=run,
        )  # fmt: skip
        k = self.router.route(route, self.now)
        rep = self.replicas[k]
        req = rep.send(run, stage_id, self.now)
        self._routes[req.rid] = (route, k)
        self.routed[k] += 1
        if not self.single:
            rep.interrupt(self.now)
        return k
