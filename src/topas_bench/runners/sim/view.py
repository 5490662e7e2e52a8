"""The simulator's implementation of the read-only `EngineView` a policy sees."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

from topas_bench.runners.sim.admission import PrefillAdder, running_offset
from topas_bench.schedulers.base import PrefixLocation, PrefixView, RequestView, TaskView
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.workloads.model import agent_key

if TYPE_CHECKING:
    from topas_bench.runners.sim.engine import Simulator
    from topas_bench.runners.sim.state import SimRequest


class SimView:
    """A view of a `Simulator` at one scheduling point (prefix matches are memoised by it)."""

    __slots__ = ("_adder", "_sim")

    def __init__(self, sim: Simulator) -> None:
        self._sim = sim
        self._adder: PrefillAdder | None = None

    @property
    def now_s(self) -> float:
        return self._sim.now

    @property
    def kv_budget_tokens(self) -> int:
        return self._sim.cfg.kv_budget_tokens

    @property
    def running_tokens(self) -> int:
        return self._sim.private_tokens

    @property
    def locked_tokens(self) -> int:
        return self._sim.cache.protected_tokens

    @property
    def evictable_tokens(self) -> int:
        return self._sim.cache.evictable_tokens

    @property
    def free_tokens(self) -> int:
        return self._sim.free_tokens

    @property
    def host_capacity_tokens(self) -> int:
        return self._sim.cfg.host_tier_tokens

    @property
    def reserved_tokens(self) -> float:
        sim = self._sim
        clip = sim.cfg.clip_max_new_tokens
        return sum(running_offset(r, sim.ratio, clip) for r in sim.running)

    @property
    def waiting(self) -> Sequence[RequestView]:
        return self._sim.waiting

    @property
    def running(self) -> Sequence[RequestView]:
        return self._sim.running

    @property
    def tasks(self) -> Mapping[str, TaskView]:
        return self._sim.tasks

    @property
    def estimator(self) -> ServiceEstimator:
        return self._sim.estimator

    def cached_tokens(self, req: RequestView) -> int:
        return self._sim.match_of(self._req(req)).gpu_tokens

    def admission_need(self, req: RequestView) -> int:
        sim = self._sim
        if self._adder is None:
            self._adder = PrefillAdder(sim.cache, lambda: sim.free_tokens, (), sim.ratio, sim.cfg)
        r = self._req(req)
        return self._adder.need(r, sim.match_of(r))

    def lock_cost(self, req: RequestView) -> int:
        sim = self._sim
        return sim.cache.unlocked_path_tokens(sim.match_of(self._req(req)).node)

    def reload_s(self, agent: str) -> float:
        sim = self._sim
        node = sim.cache.child(agent_key(agent))
        if node is not None and node.on_gpu:
            return 0.0
        if node is not None and node.on_host:
            return sim.cost.host_load_s(node.tokens)
        return sim.estimator.prefill_s(sim.prefix_tokens[agent])

    def prefixes(self) -> Sequence[PrefixView]:
        cache = self._sim.cache
        out = []
        for agent in self._sim.workload.agents:
            key = agent_key(agent.name)
            node = cache.child(key)
            kept = key in cache.kept
            if node is None:
                out.append(
                    PrefixView(agent.name, agent.prefix_tokens, PrefixLocation.NONE, 0, False)
                )
                continue
            where = PrefixLocation.GPU if node.on_gpu else PrefixLocation.HOST
            out.append(PrefixView(agent.name, node.tokens, where, node.lock - int(kept), kept))
        return out

    @staticmethod
    def _req(req: RequestView) -> SimRequest:
        # Policies only hand back requests this view gave them (the engine checks on apply).
        return cast("SimRequest", req)
