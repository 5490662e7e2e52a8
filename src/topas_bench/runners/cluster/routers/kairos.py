"""Kairos's memory-aware time-slot dispatcher as a router.

Kairos (arXiv 2508.06948; code Chen-Jin-yuan/Kairos, `framework/balancer/memory_perceptor.py`,
`MemoryPerceptorManager.try_add_request`, and `balancer.py`, `select_req_and_decide_llm`) keeps
per instance a table of time slots (0.5 s, aligned to the clock) holding the requests it
dispatched there, each from its dispatch until its agent's predicted execution time has passed,
with its prompt plus a linear decode growth. A request is tried on every instance: where its
slots, with it added, all stay within the instance's token limit, it fits, and the instance
whose projected peak over those slots is lowest takes it; where none fits, it waits at the
balancer. The table entry is removed when the response ends.

Here, with the router's own bookkeeping (it reads no replica's queue or cache, `base.py`):

- predicted time per agent: the mean latency (route to response end) of the agent's last
  `WINDOW` responses the router saw (Kairos's `PREDICT_TIME_TABLE`, "profiled on benchmark and
  testbed", left empty in its code); before the first, the estimator's prefill plus expected
  output at the cost model's batch-1 time per token;
- growth: the expected output (`ServiceEstimator`, fed with the output lengths the router saw)
  spread evenly over the predicted time (Kairos's `Decode_slop`, also empty);
- tokens: each request's prompt beyond its agent's prefix, plus each agent's prefix once per
  replica while it has a request there (Kairos's vLLM shared nothing; its `cal_bias` corrects
  the projection by the instance's real KV use, which the router cannot read);
- limit: `mem_fraction` x the replica's KV budget (`MAX_TOKENS`).

Ours: when no replica fits, the request goes to the lowest projected peak (a router answers at
once; Kairos holds it in its queue, where the replica's own scheduler holds it here). Kairos
also skips instances whose metrics show requests waiting; that reads a queue, so not here.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.runners.cluster.routers.base import Cluster, Route, Router, check_number
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.schedulers.kairos import WINDOW, slot_peak, slot_starts

Flight = tuple[float, float, float, float]  # start s, end s, own tokens, tokens per second


class KairosDispatch(Router):
    """Kairos's dispatcher: the replica where the request's projected KV over its time slots
    fits, lowest projected peak first."""

    name = "kairos"

    @dataclass(frozen=True)
    class Params:
        """slot_s: the slot length, seconds (Kairos's `PREDICT_INTERVAL`). mem_fraction: the
        share of a replica's KV budget the projection may fill (`MAX_TOKENS`, ours)."""

        slot_s: float = 0.5
        mem_fraction: float = 1.0

        def __post_init__(self) -> None:
            check_number("kairos", "slot_s", self.slot_s, 0.01, integer=False)
            check_number("kairos", "mem_fraction", self.mem_fraction, 0.0, integer=False)
            if self.mem_fraction == 0:
                raise ValueError("mem_fraction must be > 0, got 0")

    def __init__(self, cluster: Cluster, params: Any = None) -> None:
        super().__init__(cluster, params)
        if cluster.cost is None or cluster.kv_budget_tokens < 1:
            raise TopasError("the kairos router needs the servers' cost model and budget")
        self.est = ServiceEstimator(cluster.cost)
        self.limit = self.p.mem_fraction * cluster.kv_budget_tokens
        self._latency: dict[str, deque[float]] = {}
        self._flights: list[dict[int, Flight]] = [{} for _ in range(self.n)]
        self._agents: list[Counter[str]] = [Counter() for _ in range(self.n)]
        self._sent: dict[int, float] = {}
        self._rank = {k: i for i, k in enumerate(self.order)}
        self.fits = 0
        self.spills = 0

    def predicted_s(self, req: Route) -> float:
        """The agent's mean observed latency; before any, prefill plus expected output."""
        seen = self._latency.get(req.agent)
        if seen:
            return sum(seen) / len(seen)
        out = self.est.residual_tokens(req.agent, req.kind, 0)
        return self.est.prefill_s(req.prompt_tokens) + out * self.est.tpot_s

    def flight(self, req: Route, k: int, now_s: float) -> Flight:
        """What `req` adds to replica k's table if sent there now."""
        prefix = self.cluster.prefix_tokens.get(req.agent, 0)
        lasts = self.predicted_s(req)
        out = self.est.residual_tokens(req.agent, req.kind, 0)
        own = max(req.prompt_tokens - prefix, 0)
        if not self._agents[k][req.agent]:
            own += prefix
        return (now_s, now_s + lasts, float(own), out / max(lasts, 1e-9))

    def peak(self, req: Route, k: int, now_s: float) -> float:
        """The highest projected KV of replica k over the slots `req` would occupy."""
        new = self.flight(req, k, now_s)
        slots = slot_starts(now_s, self.p.slot_s, new[1] - now_s)
        base = sum(self.cluster.prefix_tokens.get(a, 0) for a, c in self._agents[k].items() if c)
        return float(slot_peak(slots, now_s, [*self._flights[k].values(), new], base).max())

    def choose(self, req: Route, now_s: float) -> int:
        peaks = {k: self.peak(req, k, now_s) for k in self.order}
        fits = [k for k in self.order if peaks[k] <= self.limit]
        self.fits += bool(fits)
        self.spills += not fits
        return min(fits or self.order, key=lambda k: (peaks[k], self._rank[k]))

    def route(self, req: Route, now_s: float) -> int:
        k = super().route(req, now_s)
        self._flights[k][req.rid] = self.flight(req, k, now_s)
        self._agents[k][req.agent] += 1
        self._sent[req.rid] = now_s
        return k

    def release(self, req: Route, replica: int, now_s: float, output_tokens: int) -> None:
        super().release(req, replica, now_s, output_tokens)
        del self._flights[replica][req.rid]
        self._agents[replica][req.agent] -= 1
        seen = self._latency.setdefault(req.agent, deque(maxlen=WINDOW))
        seen.append(now_s - self._sent.pop(req.rid))
        self.est.observe(req.agent, req.kind, output_tokens)

    def stats(self) -> dict[str, Any]:
        return {"fits": self.fits, "spills": self.spills}
