"""`kairos`: agent priority from latency distributions, memory-aware admission over time slots.

Kairos (Chen, Shi, Chen and Guo, "Kairos: Low-latency Multi-Agent Serving with Shared LLMs and
Excessive Loads in the Public Cloud", arXiv 2508.06948; code Chen-Jin-yuan/Kairos) puts a
balancer between the agents and the LLM instances. Read in its code:

- **Priority** (`background_profile/priority_determination/priority_determination.py`,
  `agent_wasserstein_mds_sort`): each agent has a distribution of latencies, one sample per
  workflow run (the frontend's end time minus the agent's action time: the workflow's latency
  remaining when the agent is called). An "Ideal" agent with 50 zero samples joins them; the
  pairwise 1-Wasserstein distances are embedded on a line (MDS, one component); agents are
  ranked by their distance to Ideal on that line, nearest first. The rank is the request's
  priority (`balancer.py`, `PRIORITY_TABLE`), and the balancer's queue is sorted by
  (priority, the time the agent sent the request) (`ThreadSafeDeque.sort_priority`).
- **Memory-aware admission** (`framework/balancer/memory_perceptor.py`, `try_add_request`):
  time is cut into slots (`PREDICT_INTERVAL` = 0.5 s, aligned to the clock); a request occupies
  the slots from the current one until its predicted execution time (`PREDICT_TIME_TABLE`, per
  agent) has passed, with its prompt plus `Decode_slop` tokens per second since it started;
  adding the new request, each of its slots must stay within `MAX_TOKENS`, counting a bias
  (`cal_bias`: the instance's real KV use minus the projection of the current slot, times
  `Bias_factor`, or `2 - Bias_factor` when negative). The head of the priority queue waits
  until it fits: nothing behind it passes (`select_req_and_decide_llm`).

The public code leaves `PRIORITY_TABLE`, `PREDICT_TIME_TABLE`, `MAX_TOKENS`, `Decode_slop` and
`Bias_factor` empty ("Profiled on benchmark and testbed"; `Request.get_cumulative_memory_usage`
is not defined). Here they are derived online from what every scheduler sees:

- latency samples: when a task ends, each of its stages gives its agent one sample, the task's
  end minus the time the stage's request was sent (the profile's quantity). A task's end is the
  first decision that finds it gone (the view has no finish time; at load that is the next
  iteration). The last `WINDOW` samples per agent are kept; the ranking is recomputed when
  samples arrive. Agents without samples rank after all others (Kairos's table has no entry).
  MDS is classical (Torgerson) scaling, deterministic, where Kairos calls scikit-learn's SMACOF
  with a fixed seed;
- predicted time: the shared estimator's expected remaining service of the request (prefill if
  not admitted, plus expected output x time per output token);
- `Decode_slop`: one token per decode step, 1 / the estimator's time per output token;
- `MAX_TOKENS`: `mem_fraction` x the KV budget; real use: tokens held by running requests plus
  cached tokens they lock; a request's projection: its prompt and generated tokens (running), or
  what admitting it adds (waiting: its uncached prompt and the cached tokens it would lock, as
  the engine counts them; Kairos's vLLM had no prefix cache to share).

Ours: a running request's slots end at now + its expected residual service (Kairos fixes them
when it is dispatched); with nothing running the head is admitted whatever its projection (Kairos
would wait forever for a request larger than `MAX_TOKENS`); a refused head that the engine's own
budget would refuse too is passed on, so the engine latches as under FCFS. `slot_s` 0.5 and
`bias_factor` 1 are Kairos's; `mem_fraction` 1 is ours. Not tuned.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from topas_bench.schedulers.base import Decision, OrderingPolicy, RequestView
from topas_bench.schedulers.validate import number
from topas_bench.schedulers.view import EngineView

F64 = npt.NDArray[np.float64]
#: Latency samples kept per agent (ours; Kairos profiles offline).
WINDOW = 256
#: Kairos's "Ideal" agent: 50 samples of zero latency.
IDEAL = np.zeros(50)


def wasserstein(u: F64, v: F64) -> float:
    """The 1-Wasserstein distance between two empirical distributions on the line: the area
    between their CDFs."""
    both = np.sort(np.concatenate([u, v]))
    deltas = np.diff(both)
    cu = np.searchsorted(np.sort(u), both[:-1], side="right") / len(u)
    cv = np.searchsorted(np.sort(v), both[:-1], side="right") / len(v)
    return float(np.sum(np.abs(cu - cv) * deltas))


def line_positions(dist: F64) -> F64:
    """Classical MDS of a distance matrix onto one axis: the top eigenvector of the
    double-centred squared distances, scaled by the root of its eigenvalue."""
    n = len(dist)
    j = np.eye(n) - 1.0 / n
    b = -0.5 * j @ (dist**2) @ j
    values, vectors = np.linalg.eigh(b)
    return np.asarray(vectors[:, -1] * math.sqrt(max(values[-1], 0.0)), dtype=np.float64)


def rank_agents(samples: Mapping[str, Sequence[float]]) -> dict[str, int]:
    """Kairos's ranking: agents by their distance to the Ideal (zero-latency) agent on the MDS
    line of pairwise Wasserstein distances, nearest first (rank 0); ties by name."""
    agents = sorted(a for a, s in samples.items() if len(s) > 0)
    if not agents:
        return {}
    dists = [np.asarray(samples[a], dtype=np.float64) for a in agents] + [IDEAL]
    n = len(dists)
    matrix = np.zeros((n, n))
    for i in range(n):
        for k in range(i + 1, n):
            matrix[i, k] = matrix[k, i] = wasserstein(dists[i], dists[k])
    pos = line_positions(matrix)
    gap = {a: round(abs(float(pos[i] - pos[-1])), 9) for i, a in enumerate(agents)}
    return {a: r for r, a in enumerate(sorted(agents, key=lambda a: (gap[a], a)))}


def slot_peak(
    slots: F64, now_s: float, flights: Sequence[tuple[float, float, float, float]], base: float
) -> F64:
    """Projected KV tokens in each slot (start times `slots`): `base` plus, for every
    (start_s, end_s, tokens, rate) in flight, `tokens + rate x (slot - start)` while its slots
    last (`slot < end_s`; growth counted from now at the earliest). Kairos's
    `get_cumulative_memory_usage` summed over its interval table."""
    if not flights:
        return np.full(len(slots), base, dtype=np.float64)
    start, end, tokens, rate = np.asarray(flights, dtype=np.float64).T
    at = slots[:, None]
    grown = tokens + rate * np.maximum(at - np.maximum(start, now_s), 0.0)
    out: F64 = base + np.where(at < end, grown, 0.0).sum(axis=1)
    return out


def slot_starts(now_s: float, slot_s: float, lasts_s: float) -> F64:
    """Start times of the slots a request sent now occupies: from the current slot (aligned to
    the clock, as Kairos's `current_time - current_time % interval`) while before now + its
    predicted time; at least the current one."""
    first = now_s - math.fmod(now_s, slot_s)
    count = max(math.ceil((now_s + lasts_s - first) / slot_s), 1)
    return first + slot_s * np.arange(count, dtype=np.float64)


class Kairos(OrderingPolicy):
    """Agents ranked by Wasserstein distance of their remaining-latency distributions to zero;
    admission while projected KV over future time slots fits."""

    name = "kairos"

    slot_s = number(0.5, 0.01, high=3600.0)
    bias_factor = number(1.0, high=2.0)
    mem_fraction = number(1.0, strict=True)

    def setup(self) -> None:
        self._samples: dict[str, deque[float]] = {}
        self._sends: dict[str, tuple[int, list[tuple[str, float]]]] = {}  # task -> version, sends
        self.ranks: dict[str, int] = {}

    # -- priority ----------------------------------------------------------------------------
    def observe(self, view: EngineView) -> None:
        """Record the send times of live tasks' requests; a task gone since the last decision
        ended: each of its stages' agents gets the latency that remained after its send."""
        sends: dict[str, tuple[int, list[tuple[str, float]]]] = {}
        for tid, task in view.tasks.items():
            old = self._sends.get(tid)
            if old is not None and old[0] == task.version:
                sends[tid] = old
                continue
            sent = [(st.agent, st.request.ready_s) for st in task.stages.values() if st.request]
            sends[tid] = (task.version, sent)
        ended = [tid for tid in self._sends if tid not in sends]
        for tid in ended:
            for agent, sent_s in self._sends[tid][1]:
                window = self._samples.setdefault(agent, deque(maxlen=WINDOW))
                window.append(max(view.now_s - sent_s, 0.0))
        self._sends = sends
        if ended:
            self.ranks = rank_agents(self._samples)

    def sort_key(self, req: RequestView, view: EngineView) -> tuple[Any, ...]:
        return (self.ranks.get(req.agent, len(self.ranks)), req.ready_s, req.rid)

    # -- admission ---------------------------------------------------------------------------
    def decide(self, view: EngineView) -> Decision:
        self.observe(view)
        queue = super().decide(view).admit
        if not queue:
            return Decision(admit=())
        est = view.estimator
        rate = 1.0 / est.tpot_s
        now = view.now_s
        flights = [
            (now, now + est.residual_service_s(r), float(r.prompt_tokens + r.generated), rate)
            for r in view.running
        ]
        real = view.running_tokens + view.locked_tokens
        bias = real - sum(f[2] for f in flights)
        bias *= self.bias_factor if bias > 0 else 2.0 - self.bias_factor
        limit = self.mem_fraction * view.kv_budget_tokens
        admit: list[RequestView] = []
        for r in queue:
            lasts = est.residual_service_s(r, view.cached_tokens(r))
            slots = slot_starts(now, self.slot_s, lasts)
            adds = max(r.prompt_tokens + r.generated - view.cached_tokens(r), 1)
            adds += view.lock_cost(r)
            own = (now, now + lasts, float(adds), rate)
            # (with nothing running or admitted, the head goes whatever its projection)
            if flights and float(slot_peak(slots, now, [*flights, own], bias).max()) > limit:
                if self._engine_refuses(r, admit, view):
                    admit.append(r)  # the engine's NO_TOKEN latches, as under FCFS
                break
            admit.append(r)
            flights.append(own)
        return Decision(admit=admit)

    @staticmethod
    def _engine_refuses(r: RequestView, admitted: Sequence[RequestView], view: EngineView) -> bool:
        """Whether the engine's own admission budget has no room for `r` after `admitted`."""
        budget = view.free_tokens + view.evictable_tokens - view.reserved_tokens
        costs = view.admission_costs([*admitted, r])
        return sum(costs) >= budget
