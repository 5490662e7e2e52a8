"""The router interface: which replica serves a request, decided when the client sends it.

A router sees only what a real router in front of the servers can see: the request (its prompt,
and the task metadata the client attaches), the cluster's shape (`Cluster`), and its own
bookkeeping. It never reads a replica's queue or cache: sglang-router counts requests in flight
itself (`loads`: +1 when a request is routed, -1 when its response ends) and keeps its own
approximation of what each worker caches. Every router is deterministic: ties break on the
lower position in `order` (sglang-router's registry order; replica index order in the
simulator).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from topas_bench.errors import TopasError
from topas_bench.schedulers.view import TaskView
from topas_bench.workloads.pieces import Piece


@dataclass(frozen=True, slots=True)
class Route:
    """A request as the router sees it.

    key: what prefix matching compares, in the router's units (`tree.TOKENS`: the prompt's
      token runs; `tree.TEXT`: the prompt's text, for the real router's requests).
    pieces: the prompt's token runs (`workloads.pieces`).
    task: the live task (its DAG and each stage's state), as the client knows it; None when
      the router is fed bare requests.
    """

    rid: int
    task_id: str
    stage_id: str
    agent: str
    kind: str
    key: Any
    pieces: tuple[Piece, ...] = ()
    prompt_tokens: int = 0
    output_tokens_hint: int = 0
    task: TaskView | None = None


@dataclass(frozen=True)
class Cluster:
    """What a router knows of the cluster before the first request.

    replicas: how many servers. order: registry order of the replicas for ties (default
    0..N-1). kv_budget_tokens: each replica's KV budget. prefix_tokens: each agent's shared
    prefix. cost: the servers' cost model (`runners.sim.cost.CostModel`), for routers that
    estimate service times (the workflow-aware one).
    """

    replicas: int
    order: tuple[int, ...] = ()
    kv_budget_tokens: int = 0
    prefix_tokens: Mapping[str, int] = field(default_factory=dict)
    cost: Any = None

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise TopasError(f"--replicas must be a positive integer, got {self.replicas}")
        if not self.order:
            object.__setattr__(self, "order", tuple(range(self.replicas)))
        if sorted(self.order) != list(range(self.replicas)):
            raise TopasError(f"router order {self.order} is not a permutation of the replicas")


class Router:
    """Base class: in-flight counts and the registry order; subclasses implement `choose`.

    `Params` (a frozen dataclass) holds a router's parameters with their defaults and units;
    `route` counts the request in flight on the chosen replica, `release` when it ends.
    """

    name: ClassVar[str] = ""

    @dataclass(frozen=True)
    class Params:
        pass

    def __init__(self, cluster: Cluster, params: Any = None) -> None:
        self.cluster = cluster
        self.n = cluster.replicas
        self.order = cluster.order
        self.p: Any = params if params is not None else self.Params()
        self.loads = [0] * self.n  # requests in flight per replica, as the router counts them

    def route(self, req: Route, now_s: float) -> int:
        k = self.choose(req, now_s)
        self.loads[k] += 1
        return k

    def release(self, req: Route, replica: int, now_s: float, output_tokens: int) -> None:
        """The response of `req` (served by `replica`, `output_tokens` long) ended."""
        self.loads[replica] -= 1

    def choose(self, req: Route, now_s: float) -> int:
        raise NotImplementedError

    def least_loaded(self, among: Sequence[int] | None = None) -> int:
        """The replica with the fewest requests in flight; the first in `order` on ties (Rust's
        `min_by_key` over the registry)."""
        loads = self.loads
        if among is None:
            return min(self.order, key=loads.__getitem__)
        rank = {k: i for i, k in enumerate(self.order)}
        return min(among, key=lambda k: (loads[k], rank[k]))

    def imbalanced(self, high: int, low: int, abs_threshold: float, rel_threshold: float) -> bool:
        """sglang-router's test (`cache_aware.rs`): both strict, the relative one in f32."""
        f32 = np.float32
        return high - low > abs_threshold and bool(f32(high) > f32(low) * f32(rel_threshold))

    def stats(self) -> dict[str, Any]:
        """Router-specific figures for `run.json` (what it placed where, how often it spilled)."""
        return {}


def parse_params(router: type[Router], params: Mapping[str, Any]) -> Any:
    """`router.Params` from `params`; an unknown name or a bad value is a `TopasError`."""
    known = [f.name for f in dataclasses.fields(router.Params)]
    for key in params:
        if key not in known:
            raise TopasError(
                f"router {router.name!r}: unknown parameter {key!r}"
                + (f"; valid: {', '.join(known)}" if known else " (it takes none)")
            )
    try:
        return router.Params(**params)
    except (TypeError, ValueError) as e:
        raise TopasError(f"router {router.name!r}: {e}") from None


def check_number(router: str, name: str, value: object, low: float, *, integer: bool) -> None:
    """A `Params` field check: a number (an integer if `integer`) >= `low`."""
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or value < low:
        what = "an integer" if integer else "a number"
        raise ValueError(f"{name} must be {what} >= {low:g}, got {value!r}")
