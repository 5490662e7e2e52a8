"""One server of a simulated cluster: the single-server simulator with its client handed over.

`Replica` is `runners.sim.engine.Simulator` (its own scheduler instance, KV budget, radix
cache, estimator and records) with the client half replaced: events go on the cluster's heap
(`Hub.push`), requests come from the cluster's router (`Simulator._send`), and a finished
request is reported back (`Hub.request_done`) so the router can count it out. Every replica
sees every live task's progress (the cluster's one dict of `TaskRun`s, as the single simulated
server does).

Closed-form decode runs. A single server knows the next client event and stops a run of decode
steps there (`Simulator._run_horizon_s`). A replica of N > 1 cannot know it: the next request
to reach it depends on the router's choices until then, and stopping at every client event of
the cluster would cost N times the events. It runs on instead and is cut (`interrupt`) when a
request is routed to it mid-run, after the step that ends first at or after the send time:
where SGLang would next attempt a prefill, and what the single server's bound gives. A cut must
leave the replica as if the run had been planned that long: its KV allocation, the
new-token ratio's decay and its records are taken back. Eviction cannot be, so a run that may be
cut never evicts: it stops where free memory ends, and the step that needs eviction runs alone.
A replica of a one-replica cluster keeps the single server's bound (every client event can reach
it), which makes `--replicas 1` the single-server simulator, event for event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel
from topas_bench.runners.sim.engine import ITER, Simulator
from topas_bench.runners.sim.state import SimRequest
from topas_bench.runners.workflow import TaskRun
from topas_bench.schedulers.base import Policy
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.workloads.model import Workload


class Hub(Protocol):
    """What a replica reads of the cluster (`sim.ClusterSim`)."""

    tasks: dict[str, TaskRun]
    rids: Any  # the cluster's request-id counter (an iterator)
    single: bool  # a one-replica cluster: keep the single server's run bound

    def push(self, t: float, kind: int, payload: Any) -> int: ...
    def next_event_s(self) -> float | None: ...
    def request_done(self, replica: int, req: SimRequest) -> None: ...


class Replica(Simulator):
    def __init__(
        self,
        index: int,
        hub: Hub,
        agents: Workload,
        policy: Policy,
        cost: CostModel,
        config: SimConfig,
        estimator: ServiceEstimator,
        on_task_done: Callable[[int], None],
    ) -> None:
        """`agents`: the workload's agents (its tasks are the cluster's, not the replica's)."""
        super().__init__(agents, policy, cost, config, on_task_done)
        self.index = index
        self.hub = hub
        self.tasks = hub.tasks
        self._rids = hub.rids
        self.estimator = estimator
        self.busy_s = 0.0  # seconds of iterations
        self.cuts = 0  # decode runs cut short by a routed request
        self._iter_seq = -1  # the heap entry of the iteration in flight (older ones are stale)
        self._decoding = False
        self._run: tuple[float, float, npt.NDArray[np.float64]] = (0.0, 0.0, np.empty(0))

    # -- the client half, handed to the cluster ---------------------------------------------
    def _push(self, t: float, kind: int, payload: Any) -> None:
        if kind == ITER:
            self._iter_seq = self.hub.push(t, ITER, (self.index, payload))
            self._decoding = payload[0] == "decode"
        else:
            self.hub.push(t, kind, payload)

    def _next_event_s(self) -> float | None:
        return self.hub.next_event_s()

    def _run_horizon_s(self) -> float | None:
        return self.hub.next_event_s() if self.hub.single else None

    def _finish(self, req: SimRequest, committed: int) -> None:
        super()._finish(req, committed)
        self.hub.request_done(self.index, req)

    def send(self, run: TaskRun, stage_id: str, now_s: float) -> SimRequest:
        """The router sent the stage's request here (`Simulator._send`)."""
        self.now = now_s
        self._send((run, stage_id))
        req: SimRequest | None = run.stages[stage_id].request
        assert req is not None
        return req

    def iteration_done(self, seq: int, payload: tuple[Any, ...], now_s: float) -> bool:
        """The iteration behind heap entry `seq` ended; False if that entry was cut short."""
        if seq != self._iter_seq:
            return False
        self.now = now_s
        self.busy_s += payload[2]
        self._iteration_done(*payload)
        return True

    def step(self, now_s: float) -> None:
        """An iteration boundary with nothing in flight: the next iteration, if any."""
        if not self._busy:
            self.now = now_s
            self._step()

    @property
    def idle(self) -> bool:
        return not self._busy

    # -- cutting decode runs ----------------------------------------------------------------
    def _decode_run(
        self, b: int, ctx: int
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        durs, ends = super()._decode_run(b, ctx)
        if not self.hub.single and len(ends) > 1 and not self.batch_is_full:
            k = max(1, self.free_tokens // b)  # a run that may be cut never evicts
            durs, ends = durs[:k], ends[:k]
        self._run = (self.now, self.ratio, durs)  # the ratio after the run's first decay
        return durs, ends

    def interrupt(self, t: float) -> None:
        """A request reached the replica at `t`: a decode run in flight that SGLang would leave
        for a prefill attempt (the latch is clear) ends after the step ending first at or after
        `t`, as if it had been planned so."""
        if not self._busy or not self._decoding or self.batch_is_full or self._ends is None:
            return
        ends = self._ends
        keep = int(ends.searchsorted(t, side="left")) + 1
        drop = len(ends) - keep
        if drop <= 0:
            return
        start, ratio, durs = self._run
        self.cuts += 1
        b = len(self.running)
        self.private_tokens -= b * drop
        for req in self.running:
            req.private_tokens -= drop
        self.ratio = ratio
        self._decay_run(keep - 1)
        end = float(ends[keep - 1])
        self.rec.shorten_last(drop, end - start, b * drop)
        self._ends = ends[:keep]
        self._run = (start, ratio, durs[:keep])
        self._push(end, ITER, ("decode", durs[:keep], end - start))
