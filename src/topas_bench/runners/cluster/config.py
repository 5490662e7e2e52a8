"""A cluster setting: how many replicas, which router, its parameters (`--replicas`, `--router`).

It enters a run's identity as engine parameters (`engine_params`), so cells of different
replica counts or routers never share a directory, with `CLUSTER_VERSION`: bump it whenever a
change to the cluster code (client, routers, replica cuts) can change a result, so older
cluster cells are rerun; the single-server engine's version stays as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.runners.cluster.routers import DEFAULT_ROUTER, check_router

CLUSTER_VERSION = 1
#: The most replicas a run takes: each is a whole simulated server (its scheduler, KV pool and
#: radix tree), and the router scans them all per call; 1,024 serve dag4's 200 tasks in 12 s
#: (187 MB), 4,096 in 36 s, 10,000 in 51 s (467 MB) on the project's VM.
MAX_REPLICAS = 1024


@dataclass(frozen=True)
class ClusterConfig:
    """replicas: servers, each with its own scheduler instance and the run's KV budget.
    router: a `routers.ROUTERS` name. router_params: its parameters (`Router.Params`)."""

    replicas: int
    router: str = DEFAULT_ROUTER
    router_params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int):
            raise TopasError(f"--replicas must be a positive integer, got {self.replicas!r}")
        if self.replicas < 1:
            raise TopasError(f"--replicas must be a positive integer, got {self.replicas}")
        if self.replicas > MAX_REPLICAS:
            raise TopasError(
                f"--replicas {self.replicas:,}: at most {MAX_REPLICAS:,} (each is a whole "
                "simulated server; 10,000 took 51 s and 467 MB for 200 tasks)"
            )
        check_router(self.router, self.router_params)
        object.__setattr__(self, "router_params", dict(self.router_params))

    @classmethod
    def from_flags(
        cls, replicas: int | None, router: str | None, router_params: Mapping[str, Any]
    ) -> ClusterConfig | None:
        """The setting of `--replicas`/`--router`/`--router-param`, or None (one server)."""
        if replicas is None:
            if router is not None or router_params:
                raise TopasError("--router and --router-param need --replicas N")
            return None
        return cls(replicas, router or DEFAULT_ROUTER, dict(router_params))

    def engine_params(self) -> dict[str, Any]:
        """What the setting adds to a run's identity."""
        params: dict[str, Any] = {
            "replicas": self.replicas,
            "router": self.router,
            "cluster_version": CLUSTER_VERSION,
        }
        if self.router_params:
            params["router_params"] = dict(sorted(self.router_params.items()))
        return params

    def describe(self) -> str:
        extra = ", ".join(f"{k}={v}" for k, v in sorted(self.router_params.items()))
        return f"{self.replicas} replicas behind router {self.router}" + (
            f" ({extra})" if extra else ""
        )
