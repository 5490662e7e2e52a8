"""The simulator's state, which its managers share (`engine.Simulator` is built on it in layers:
this, `residency`, `events`, `decode`, `prefill`, then the engine's loop; each layer uses only
the ones below it).

The state is SGLang 0.5.23's `Scheduler`'s as far as the simulator mirrors it: the waiting
queue, the running batch, the chunked request and the in-flight prefill batch, the
`batch_is_full` latch, `new_token_ratio`, the radix cache and the private (uncached) KV, and
`processed_tokens_counter`; then the client's (event heap, tasks in flight), the policy's
(kept prefixes and contexts, the last standing decision) and the records'.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from topas_bench.errors import TopasError
from topas_bench.runners.records import Recorder
from topas_bench.runners.sim import standing
from topas_bench.runners.sim.calc_priority import QueuePass
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel
from topas_bench.runners.sim.pins import ContextPins, Prefetcher
from topas_bench.runners.sim.radix import Node, RadixCache
from topas_bench.runners.sim.standing import Stand
from topas_bench.runners.sim.state import SimRequest
from topas_bench.runners.workflow import TaskRun
from topas_bench.schedulers.base import Policy
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.workloads.model import Workload
from topas_bench.workloads.pieces import Piece

ARRIVE, READY, ITER = 0, 1, 2
#: One iteration as it starts (its KV allocated): kind, the prefill batch's
#: `(request, cached tokens, new tokens)` or the decode batch size, free KV, evictable cache,
#: waiting requests. The reference engine records the same (`sglang_cpu.loop`).
Step = tuple[str, Any, int, int, int]


class SimulationError(TopasError):
    """The simulation cannot make progress (a policy or engine bug)."""


class SimCore:
    """The state of one simulated server running one workload under one policy."""

    def __init__(
        self,
        workload: Workload,
        policy: Policy,
        cost: CostModel,
        config: SimConfig,
        on_task_done: Callable[[int], None] | None = None,
        *,
        trace: list[Step] | None = None,
        stand: bool = True,
    ) -> None:
        self.workload = workload
        #: With a trace, every iteration is recorded (`Step`) and runs alone, one decode step
        #: per event, for lockstep comparisons with the reference engine.
        self.trace = trace
        #: Run decode in closed form across standing decisions (`runners.sim.standing`);
        #: False asks the policy at every attempt (the step-by-step path, for comparisons).
        self.stand = stand
        self._stand: Stand | None = None  # what the last attempt's decision offers
        self._stand_run: Stand | None = None  # the stand the decode run in flight covers
        self._run_start_s = 0.0  # when the decode run in flight started
        self._decided: standing.Marker | None = None  # the state the last decision saw
        self.policy = policy
        self.needs = policy.needs  # what it needs of the server, read once (`ServerNeeds`)
        self.cost = cost
        self.cfg = config
        self.cache = RadixCache(
            config.host_tier_tokens, self.needs.eviction, self.needs.protected_threshold,
        )  # fmt: skip
        self.queue_pass = QueuePass(
            self.needs.schedule_policy, self.needs.eviction, self.needs.seed
        )
        #: `Scheduler.processed_tokens_counter` (`hrrn`'s clock): `extend_num_tokens` of every
        #: batch run so far; a decode batch counts what the running batch's first prefill had.
        self.processed_tokens = 0
        self.decode_extend_tokens = 0
        self.private_tokens = 0
        self.waiting: list[SimRequest] = []  # SGLang's waiting_queue, in its order
        self.running: list[SimRequest] = []  # the running (decode) batch, in its order
        self.chunked: SimRequest | None = None
        self.prefilling: list[SimRequest] = []  # the in-flight prefill batch
        self.batch_is_full = False
        self.ratio = config.init_new_token_ratio
        self.pins: dict[str, Node] = {}  # agent -> its locked prefix node (kept prefixes)
        self.contexts = ContextPins(self.cache)  # finished contexts kept for a while
        #: Requests finished in the last iteration, whose context the policy may keep.
        self.finished_pending: list[SimRequest] = []
        self._asks_ttl = (
            type(policy).context_ttl is not Policy.context_ttl
            or type(policy).context_action is not Policy.context_action
        )
        #: Offloaded contexts to load back to the GPU: a heap of (when, request id, its path).
        self.uploads: list[tuple[float, int, str, list[Piece]]] = []
        self.prefetcher = Prefetcher(self.cache, cost.host_load_s)
        self.inbox: list[SimRequest] = []  # sent while the server was busy: not received yet
        self.agents_seen: set[str] = set()  # agents of the requests received so far
        self._ends: npt.NDArray[np.float64] | None = None  # step ends of the iteration run
        #: The prefill-token counter before that run, and what each of its steps added.
        self._ends_counter = (0, 0)
        self.now = 0.0
        self.tasks: dict[str, TaskRun] = {}
        self.prefix_tokens = {a.name: a.prefix_tokens for a in workload.agents}
        #: (tree version, agent -> its prefix's (GPU, host) tokens): the view's probes
        self.prefix_probes: tuple[int, dict[str, tuple[int, int]]] = (-1, {})
        #: `TpModelWorker.get_worker_info`: the longest request the server accepts.
        self.max_req_len = min(config.context_length - 1, config.kv_budget_tokens - 1)
        truths = {(t.id, s.id): s.output_tokens for t, s in workload.stages()}
        oracle = config.length_hint == "oracle" or policy.oracle_lengths
        self.estimator = ServiceEstimator(
            cost,
            true_length=(lambda t, s: truths[(t, s)]) if oracle else None,
        )
        self.rec = Recorder(config.record_timeline)
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = itertools.count()
        self._rids = itertools.count()
        self._enqueues = itertools.count()
        self._busy = False
        self._on_task_done = on_task_done
        self._done_tasks = 0
        self._resident: tuple[int, str] = (-1, "")  # (cache version, resident agents)

    @property
    def free_tokens(self) -> int:
        return self.cfg.kv_budget_tokens - self.cache.gpu_tokens - self.private_tokens

    def _own(self, req: Any) -> SimRequest:
        if not isinstance(req, SimRequest):
            raise SimulationError(f"scheduler {self.policy.name!r} returned a foreign request")
        return req

    def _trace_step(self, kind: str, batch: Any) -> Step:
        return (kind, batch, self.free_tokens, self.cache.evictable_tokens, len(self.waiting))
