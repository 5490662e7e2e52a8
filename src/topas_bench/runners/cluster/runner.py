"""One cell served on the simulated cluster (`--engine sim --replicas N --router NAME`).

The cell holds the single-server layout (docs/design.md section 8): `requests`, `tasks`, `timeline`
and `decisions` tables and `run.json`, each table over all replicas with a `replica` column
(a task's: the replica that served its last stage; `replicas_used`: how many replicas served
its stages). `run.json`'s summary is the whole cluster's, its counters the sums over replicas,
and `cluster` holds the setting, the router's own figures and one summary per replica
(`per_replica`): requests, busy fraction, mean requests in the system, prefix hit rate,
preemptions, tasks finished there and their mean JCT, mean request latency.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from topas_bench.plan import Cell, RunPlan, Served
from topas_bench.runners.cluster.routers import Cluster, make_router
from topas_bench.runners.cluster.sim import ClusterResult, ClusterSim
from topas_bench.runners.records import replica_summary
from topas_bench.runners.sim.cost import CostModel
from topas_bench.schedulers.registry import make_policy


def serve_cluster(
    plan: RunPlan, cell: Cell, on_task_done: Callable[[int], None] | None = None
) -> Served:
    """Serve `plan`'s workload on its cluster, one instance of `cell`'s policy per replica."""
    cfg = plan.cluster
    assert cfg is not None
    cost = CostModel(plan.preset)
    prefixes = {a.name: a.prefix_tokens for a in plan.workload.agents}
    cluster = Cluster(
        cfg.replicas, kv_budget_tokens=plan.kv_budget_tokens, prefix_tokens=prefixes, cost=cost
    )
    router = make_router(cfg.router, cluster, cfg.router_params)
    policies = [make_policy(cell.scheduler, **cell.params) for _ in range(cfg.replicas)]
    res = ClusterSim(plan.workload, policies, cost, plan.sim, router, on_task_done).run()
    requests = res.table("requests")
    tasks = with_replicas_used(res.table("tasks"), requests)
    counters = {
        "preemptions": float(sum(r.preemptions for r in res.replicas)),
        "admitted_prompt_tokens": float(sum(r.prefill_tokens for r in res.replicas)),
        "cached_prompt_tokens": float(sum(r.cached_tokens for r in res.replicas)),
        "iterations": float(sum(r.iterations for r in res.replicas)),
    }
    tables = {
        "requests": requests, "tasks": tasks, "timeline": res.table("timeline"),
        "decisions": res.table("decisions"),
    }  # fmt: skip
    replicas = per_replica(res, requests, tasks)
    setting = {
        **cfg.engine_params(),
        "router_params": dict(cfg.router_params),
        "router_stats": res.router,
        "per_replica": replicas,
    }
    return Served(
        tables, counters, res.sim_time_s, res.wall_s, info={"cluster": setting},
        extra={"per_replica": replicas},
    )  # fmt: skip


def with_replicas_used(tasks: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """`tasks` with `replicas_used`: how many replicas served its stages."""
    used = requests.groupby("task_id")["replica"].nunique()
    return tasks.assign(replicas_used=tasks["task_id"].map(used).astype("int64"))


def per_replica(
    res: ClusterResult, requests: pd.DataFrame, tasks: pd.DataFrame
) -> list[dict[str, Any]]:
    """One summary per replica (module docstring); rates over the run's span."""
    span = float(tasks["finish_s"].max() - tasks["arrival_s"].min()) if len(tasks) else 0.0
    out = []
    for i, r in enumerate(res.replicas):
        q = requests[requests["replica"] == i]
        t = tasks[tasks["replica"] == i]
        out.append(replica_summary(i, q, t, span, res.busy_s[i], r.cached_tokens,
                                   r.prefill_tokens, r.preemptions))  # fmt: skip
    return out
