"""One cell on the simulator (`--engine sim`): run the scheduler, write the run directory.

With `--replicas`/`--router` the plan runs on the simulated cluster (`runners.cluster`).
"""

from __future__ import annotations

from collections.abc import Callable

from topas_bench.plan import CellResult, RunPlan, stored_cell, workload_digest
from topas_bench.runners.sim.cell import write_sim_cell
from topas_bench.runners.sim.cost import CostModel
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.registry import make_policy


def run_cell(
    plan: RunPlan,
    scheduler: str,
    *,
    force: bool = False,
    on_task_done: Callable[[int], None] | None = None,
) -> CellResult:
    if plan.cluster is not None:  # N replicas behind a router: an engine made of engines
        from topas_bench.runners.cluster.runner import run_cell as run_cluster_cell

        return run_cluster_cell(plan, scheduler, force=force, on_task_done=on_task_done)
    ident = plan.identity(scheduler)
    run_dir = ident.run_dir(plan.out)
    digest = workload_digest(plan.workload)
    if not force and (stored := stored_cell(scheduler, run_dir, digest)) is not None:
        return stored
    policy = make_policy(scheduler, **plan.scheduler_params.get(scheduler, {}))
    sim = Simulator(plan.workload, policy, CostModel(plan.preset), plan.sim, on_task_done)
    res = sim.run()
    counters = {
        "preemptions": float(res.preemptions),
        "admitted_prompt_tokens": float(res.prefill_tokens),
        "cached_prompt_tokens": float(res.cached_tokens),
        "iterations": float(res.iterations),
    }
    tables = {
        "requests": res.requests, "tasks": res.tasks,
        "timeline": res.timeline, "decisions": res.decisions,
    }  # fmt: skip
    return write_sim_cell(
        plan, scheduler, ident, digest, tables, counters, res.sim_time_s, res.wall_s
    )
