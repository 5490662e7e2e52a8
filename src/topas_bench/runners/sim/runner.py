"""The simulator behind the harness (`--engine sim`): serve a workload under a policy.

With `--replicas`/`--router` the plan runs on the simulated cluster (`runners.cluster`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from topas_bench.plan import Cell, CellProgress, RunPlan, Served, cell_progress
from topas_bench.runners.sim.cost import CostModel
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.registry import make_policy
from topas_bench.spec import RunSpec


class SimServer:
    """`plan.Server` for the simulator: one cell at a time, in this process."""

    def prepare(self, spec: RunSpec) -> RunSpec:
        return spec  # nothing outside this process to check

    def serve(
        self, plan: RunPlan, cells: Sequence[Cell], progress: CellProgress | None
    ) -> Iterator[Served]:
        for i, cell in enumerate(cells):
            if plan.cluster is not None:  # N replicas behind a router: an engine of engines
                from topas_bench.runners.cluster.runner import serve_cluster

                yield serve_cluster(plan, cell, cell_progress(progress, i))
            else:
                yield serve_one(plan, cell, cell_progress(progress, i))


def serve_one(plan: RunPlan, cell: Cell, on_task_done: Callable[[int], None] | None) -> Served:
    policy = make_policy(cell.scheduler, **cell.params)
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
    return Served(tables, counters, res.sim_time_s, res.wall_s)


SERVER = SimServer()
