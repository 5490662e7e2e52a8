"""The router registry: name -> router class. Adding a router = one file + one line here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from topas_bench.registry import Registry
from topas_bench.runners.cluster.routers.affinity import AgentAffinity
from topas_bench.runners.cluster.routers.base import Cluster, Route, Router, parse_params
from topas_bench.runners.cluster.routers.cache_aware import CacheAware
from topas_bench.runners.cluster.routers.kairos import KairosDispatch
from topas_bench.runners.cluster.routers.simple import LeastLoad, RoundRobin
from topas_bench.runners.cluster.routers.workflow import WorkflowAware

ROUTERS: Registry[type[Router]] = Registry("router")
for _r in (RoundRobin, LeastLoad, CacheAware, AgentAffinity, WorkflowAware, KairosDispatch):
    ROUTERS.add(_r.name, _r)

#: sglang-router's default policy, and the router a cluster gets when none is named.
DEFAULT_ROUTER = "cache-aware"


def check_router(name: str, params: Mapping[str, Any]) -> None:
    """Raise on an unknown router name or a bad parameter, before anything runs."""
    parse_params(ROUTERS.get(name), params)


def make_router(name: str, cluster: Cluster, params: Mapping[str, Any] | None = None) -> Router:
    """A fresh router for `cluster`."""
    cls = ROUTERS.get(name)
    return cls(cluster, parse_params(cls, params or {}))


__all__ = ["DEFAULT_ROUTER", "ROUTERS", "Cluster", "Route", "Router", "check_router", "make_router"]
