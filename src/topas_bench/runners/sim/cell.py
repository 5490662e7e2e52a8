"""Writing a simulated cell, one server's or a cluster's (`runners.sim.runner`,
`runners.cluster.runner`): the same tables, summary and `run.json` fields for both."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from topas_bench.analysis.metrics import RunTables, run_info
from topas_bench.invariants import cost_floor, jct_floors
from topas_bench.plan import CellResult, RunPlan
from topas_bench.results import RunIdentity, write_run
from topas_bench.runners.sim.cost import CostModel
from topas_bench.unloaded import with_unloaded_jct


def write_sim_cell(
    plan: RunPlan,
    scheduler: str,
    ident: RunIdentity,
    digest: str,
    tables: dict[str, pd.DataFrame],
    counters: dict[str, float],
    sim_time_s: float,
    wall_s: float,
    extra: Mapping[str, Any] | None = None,
) -> CellResult:
    """Write a simulated cell (one server or a cluster): the tasks get their unloaded JCT (for
    goodput), `run.json` the summary, counters, times and `extra`; the result names them."""
    run_dir = ident.run_dir(plan.out)
    tasks = with_unloaded_jct(tables["tasks"], plan.workload, plan.preset, plan.sim)
    tables = {**tables, "tasks": tasks}
    recorded = run_info(RunTables(tasks, tables["requests"], tables["decisions"], counters))
    info = {
        **recorded,
        "counters": counters,
        "sim_time_s": sim_time_s,
        "wall_s": wall_s,
        "load": plan.load,
        "capacity_tps": plan.capacity_tps,
        "workload_digest": digest,
        **(extra or {}),
    }
    floors = jct_floors(plan.workload, cost_floor(CostModel(plan.preset)))
    write_run(run_dir, ident, tables, info, jct_floor_s=floors)
    return CellResult(scheduler, run_dir, recorded["summary"], sim_time_s, wall_s)
