"""Workflow-aware routing: each request to the replica where it is expected to start soonest,
placing agent prefixes and task histories with TOPAS's cost terms.

For request r of task i, agent a, every replica k is scored in seconds (lower is better):

    score_k = wait_k + reload_k

- `reload_k` is TOPAS's move cost J_move for this request: the prefill time of the prompt
  tokens replica k is not expected to hold (`ServiceEstimator.prefill_s`). What a replica holds
  is the router's estimate, built from the workflow rather than from text: per replica an LRU
  of agent prefixes (the agent's prefix segment) and task histories (the pieces of the task's
  latest call there, prompt and output), as large as the KV budget; r's hit is its longest
  common prefix with the agent's entry or the task's entry (`workloads.pieces.common`).
- `wait_k` is the admission wait from TOPAS's memory accounting: the requests in flight on k
  need each agent's prefix once plus their own KV (prompt beyond the prefix and the expected
  output, `ServiceEstimator.residual_tokens`), and r needs its own; what exceeds the KV budget
  must drain first, at a budget's worth of tokens per mean expected service time of the
  requests in flight (`ServiceEstimator`, the estimator every TOPAS decision uses, fed here
  with the output lengths of the responses the router has seen).

A replica that holds the agent's prefix or the task's history wins while its queue is short; a
replica whose queue would make r wait longer than the reload costs loses it, so an agent is
placed on more replicas exactly when its load outweighs the prefill of its prefix. Ties go to
the first replica in registry order.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.runners.cluster.routers.base import Cluster, Route, Router, check_number
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.workloads.model import agent_key, output_key
from topas_bench.workloads.pieces import Piece, common, length

Key = tuple[str, str]  # ("agent", name) or ("task", id)


class WorkflowAware(Router):
    name = "workflow-aware"

    @dataclass(frozen=True)
    class Params:
        """residency_share: the share of a replica's KV budget its estimated cache may fill."""

        residency_share: float = 1.0

        def __post_init__(self) -> None:
            check_number("workflow-aware", "residency_share", self.residency_share, 0.0,
                         integer=False)  # fmt: skip

    def __init__(self, cluster: Cluster, params: Any = None) -> None:
        super().__init__(cluster, params)
        if cluster.cost is None or cluster.kv_budget_tokens < 1:
            raise TopasError("the workflow-aware router needs the servers' cost model and budget")
        self.est = ServiceEstimator(cluster.cost)
        self.budget = cluster.kv_budget_tokens
        self.capacity = int(self.p.residency_share * self.budget)
        n = self.n
        self._flight: dict[int, tuple[int, float]] = {}  # rid -> (own KV tokens, service s)
        self._kv = [0] * n  # own KV of the requests in flight
        self._svc = [0.0] * n  # their expected service, seconds
        self._agents: list[Counter[str]] = [Counter() for _ in range(n)]  # in flight, by agent
        self._prefix_kv = [0] * n  # each agent with a request in flight: its prefix, once
        self._held: list[OrderedDict[Key, tuple[tuple[Piece, ...], int]]] = [
            OrderedDict() for _ in range(n)
        ]  # estimated cache: key -> (pieces, tokens charged), least recently used first
        self._held_tokens = [0] * n
        self._where: dict[Key, set[int]] = {}
        self._rank = {k: i for i, k in enumerate(self.order)}

    # -- choosing ---------------------------------------------------------------------------
    def choose(self, req: Route, now_s: float) -> int:
        prefix = self.cluster.prefix_tokens.get(req.agent, 0)
        out = self.est.residual_tokens(req.agent, req.kind, 0)
        keys: list[Key] = [("agent", req.agent), ("task", req.task_id)]
        hits: dict[int, int] = {}
        for key in keys:
            for k in self._where.get(key, ()):
                hit = common(self._held[k][key][0], req.pieces, req.prompt_tokens)
                hits[k] = max(hits.get(k, 0), hit)
        full = self.est.prefill_s(req.prompt_tokens)
        best, best_score = self.order[0], float("inf")
        for k in self.order:
            hit = hits.get(k, 0)
            reload = self.est.prefill_s(req.prompt_tokens - hit, hit) if hit else full
            score = self._wait_s(k, req, prefix, out) + reload
            if score < best_score:
                best, best_score = k, score
        return best

    def _wait_s(self, k: int, req: Route, prefix: int, out: float) -> float:
        shared = prefix if self._agents[k][req.agent] else 0
        need = req.prompt_tokens - shared + out
        excess = self._prefix_kv[k] + self._kv[k] + need - self.budget
        if excess <= 0:
            return 0.0
        count = self.loads[k]
        mean_svc = (self._svc[k] + self._service_s(req, out)) / (count + 1)
        return excess / self.budget * mean_svc

    def _service_s(self, req: Route, out: float) -> float:
        return self.est.prefill_s(req.prompt_tokens) + out * self.est.tpot_s

    # -- bookkeeping -------------------------------------------------------------------------
    def route(self, req: Route, now_s: float) -> int:
        k = super().route(req, now_s)
        prefix = self.cluster.prefix_tokens.get(req.agent, 0)
        out = self.est.residual_tokens(req.agent, req.kind, 0)
        own = int(req.prompt_tokens - prefix + out)
        svc = self._service_s(req, out)
        self._flight[req.rid] = (own, svc)
        self._kv[k] += own
        self._svc[k] += svc
        if not self._agents[k][req.agent]:
            self._prefix_kv[k] += prefix
        self._agents[k][req.agent] += 1
        if prefix:
            self._hold(k, ("agent", req.agent), ((agent_key(req.agent), 0, prefix),), prefix)
        self._hold(k, ("task", req.task_id), req.pieces, req.prompt_tokens - prefix)
        return k

    def release(self, req: Route, replica: int, now_s: float, output_tokens: int) -> None:
        super().release(req, replica, now_s, output_tokens)
        own, svc = self._flight.pop(req.rid)
        self._kv[replica] -= own
        self._svc[replica] -= svc
        self._agents[replica][req.agent] -= 1
        if not self._agents[replica][req.agent]:
            self._prefix_kv[replica] -= self.cluster.prefix_tokens.get(req.agent, 0)
        self.est.observe(req.agent, req.kind, output_tokens)
        prefix = self.cluster.prefix_tokens.get(req.agent, 0)
        fill = (*req.pieces, (output_key(req.task_id, req.stage_id), 0, output_tokens))
        self._hold(replica, ("task", req.task_id), fill, length(fill) - prefix)

    def _hold(self, k: int, key: Key, pieces: tuple[Piece, ...], tokens: int) -> None:
        """Replica k now holds `pieces` under `key` (most recently used); evict the least
        recently used entries beyond the capacity."""
        held = self._held[k]
        old = held.pop(key, None)
        if old is not None:
            self._held_tokens[k] -= old[1]
        held[key] = (pieces, max(tokens, 0))
        self._held_tokens[k] += max(tokens, 0)
        self._where.setdefault(key, set()).add(k)
        while self._held_tokens[k] > self.capacity and len(held) > 1:
            gone, (_, size) = held.popitem(last=False)
            self._held_tokens[k] -= size
            where = self._where[gone]
            where.discard(k)
            if not where:
                del self._where[gone]

    def stats(self) -> dict[str, Any]:
        return {
            "replicas_per_agent": {
                key[1]: len(ks) for key, ks in sorted(self._where.items()) if key[0] == "agent"
            }
        }
