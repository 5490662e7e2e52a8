"""The simulator's implementation of the read-only `EngineView` a policy sees.

It answers exactly what the plugin's view answers on a real server
(`runners.sglang.view.SglangView`), so a policy decides the same way in both engines:
prefix hits are read-only device matches of the request's prompt and outputs so far; agents are
those seen in requests so far; `lock_cost` uses the adapter's approximation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, cast

from topas_bench.runners.sim.admission import running_offset
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel
from topas_bench.runners.sim.radix import Node, RadixCache
from topas_bench.runners.sim.state import SimRequest
from topas_bench.runners.workflow import TaskRun
from topas_bench.schedulers.base import RequestView
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.schedulers.view import PrefixLocation, PrefixView, TaskView
from topas_bench.workloads.model import agent_key


class Simulator(Protocol):
    """What the view reads of the engine (`engine.Simulator`)."""

    now: float
    cfg: SimConfig
    cost: CostModel
    cache: RadixCache
    ratio: float
    private_tokens: int
    waiting: list[SimRequest]
    running: list[SimRequest]
    tasks: dict[str, TaskRun]
    estimator: ServiceEstimator
    pins: dict[str, Node]
    prefix_tokens: dict[str, int]
    prefix_probes: tuple[int, dict[str, tuple[int, int]]]
    agents_seen: set[str]

    @property
    def free_tokens(self) -> int: ...


class SimView:
    """A view of a `Simulator` at one scheduling point."""

    __slots__ = ("_running_agents", "_sim")

    def __init__(self, sim: Simulator) -> None:
        self._sim = sim
        self._running_agents: set[str] | None = None

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
        # Memoised on the request while the tree and its fill are unchanged (decode-only
        # iterations change neither): a probe is read-only, so the answer is the same.
        r: SimRequest = req  # type: ignore[assignment]  # policies hand back our requests
        version, fill, hit = r.probe_memo
        cache = self._sim.cache
        if version != cache.version or fill != r.fill_tokens:
            hit = cache.probe(r.fill())[0]
            r.probe_memo = (cache.version, r.fill_tokens, hit)
        return hit

    def admission_need(self, req: RequestView) -> int:
        """`add_one_req`'s total: extend + clipped max_new + one page."""
        r: SimRequest = req  # type: ignore[assignment]
        clip = self._sim.cfg.clip_max_new_tokens
        extend = max(r.fill_tokens - self.cached_tokens(r), 1)
        return extend + min(max(r.max_new_tokens - r.generated, 0), clip) + 1

    def lock_cost(self, req: RequestView) -> int:
        """Cached tokens admitting `req` would lock; the agent's prefix is taken as already
        locked while one of its requests runs or it is kept (the adapter's approximation)."""
        r: SimRequest = req  # type: ignore[assignment]
        hit = self.cached_tokens(r)
        sim = self._sim
        if r.agent and (r.agent in sim.pins or r.agent in self._running()):
            return max(hit - sim.prefix_tokens.get(r.agent, 0), 0)
        return hit

    def _running(self) -> set[str]:
        """The agents of the running requests (memoised: a view lives for one decision)."""
        if self._running_agents is None:
            self._running_agents = {x.agent for x in self._sim.running}
        return self._running_agents

    def admission_costs(self, reqs: Sequence[RequestView]) -> list[int]:
        """`admission_need(r) + lock_cost(r)` of each request in one pass: the two methods'
        arithmetic with the cached tokens asked once per request (a decision asks it of the
        whole queue)."""
        sim = self._sim
        clip = sim.cfg.clip_max_new_tokens
        shielded = self._running() | sim.pins.keys()
        prefix_tokens = sim.prefix_tokens
        cached = self.cached_tokens
        out = []
        for req in reqs:
            r: SimRequest = req  # type: ignore[assignment]
            hit = cached(r)
            # (conditional expressions for max and min: the same numbers, a decision asks
            # this of hundreds of requests)
            extend = r.prompt_tokens + r.generated - hit
            left = r.max_new_tokens - r.generated
            left = 0 if left < 0 else clip if left > clip else left
            cost = (extend if extend > 1 else 1) + left + 1
            agent = r.agent
            if agent and agent in shielded:
                beyond = hit - prefix_tokens.get(agent, 0)
                cost += beyond if beyond > 0 else 0
            else:
                cost += hit
            out.append(cost)
        return out

    def _resident(self, agent: str) -> tuple[int, int]:
        # memoised while the tree is unchanged (its version): probes are read-only
        sim = self._sim
        version, probes = sim.prefix_probes
        if version != sim.cache.version:
            version, probes = sim.prefix_probes = (sim.cache.version, {})
        hit = probes.get(agent)
        if hit is None:
            tokens = sim.prefix_tokens[agent]
            hit = probes[agent] = sim.cache.probe([(agent_key(agent), 0, tokens)])
        return hit

    def absent_reload_s(self, agent: str) -> float:
        sim = self._sim
        tokens = sim.prefix_tokens.get(agent, 0)
        if not tokens:
            return 0.0
        if sim.cfg.host_tier_tokens:
            return sim.cost.host_load_s(tokens)
        return sim.estimator.prefill_s(tokens)

    def reload_s(self, agent: str) -> float:
        sim = self._sim
        tokens = sim.prefix_tokens.get(agent, 0)
        if agent not in sim.agents_seen or not tokens:
            return 0.0
        gpu, host = self._resident(agent)
        if gpu >= tokens:
            return 0.0
        if gpu + host >= tokens:
            return sim.cost.host_load_s(tokens - gpu)
        return sim.estimator.prefill_s(tokens)

    def prefixes(self) -> Sequence[PrefixView]:
        sim = self._sim
        users: dict[str, int] = {}
        for r in sim.running:
            users[r.agent] = users.get(r.agent, 0) + 1
        out = []
        for agent in sorted(sim.agents_seen):
            tokens = sim.prefix_tokens.get(agent, 0)
            if not tokens:
                continue
            gpu, host = self._resident(agent)
            if gpu >= tokens:
                where = PrefixLocation.GPU
            elif gpu + host >= tokens:
                where = PrefixLocation.HOST
            else:
                where = PrefixLocation.NONE
            locks = users.get(agent, 0) if where is PrefixLocation.GPU else 0
            out.append(PrefixView(agent, tokens, where, locks, agent in sim.pins))
        return out

    @staticmethod
    def _req(req: RequestView) -> SimRequest:
        # Policies only hand back requests this view gave them (the engine checks on apply).
        return cast("SimRequest", req)
