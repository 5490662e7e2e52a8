"""The one run harness: every engine's cells go through it (docs/design.md, "The seams").

For each scheduler of a plan it looks the cell up (`cell.stored.lookup`: its identity and
directory), reuses a stored cell of that identity unless forced, and asks the plan's engine to
serve the rest (`plan.Server.serve`: the engine returns tables, nothing else). Then, the same for
every engine: each task's unloaded JCT (`unloaded`), the summary (`analysis.metrics.run_info`),
the run information and the writing, checked against the workload's JCT floors
(`cell.write.write_run`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from topas_bench.analysis.metrics import RunTables, run_info
from topas_bench.cell.identity import cell_identity, workload_digest
from topas_bench.cell.stored import CellResult, cached_cell, lookup
from topas_bench.cell.write import write_run
from topas_bench.errors import TopasError
from topas_bench.horizon import check_served
from topas_bench.invariants import cost_floor, jct_floors, no_floor
from topas_bench.plan import Cell, CellProgress, RunPlan, Served
from topas_bench.results import TABLES
from topas_bench.runners.engines import ENGINES
from topas_bench.runners.sim.cost import CostModel
from topas_bench.unloaded import with_unloaded_jct


def run_cell(
    plan: RunPlan,
    scheduler: str,
    *,
    force: bool = False,
    on_task_done: Callable[[int], None] | None = None,
    compact: bool = False,
) -> CellResult:
    """One scheduler of `plan` (`run_cells`); `on_task_done(n)` as its tasks finish."""
    progress = None if on_task_done is None else lambda _, done: on_task_done(done)
    return run_cells(plan, [scheduler], force=force, progress=progress, compact=compact)[0]


def run_cells(
    plan: RunPlan,
    schedulers: Sequence[str],
    *,
    force: bool = False,
    progress: CellProgress | None = None,
    compact: bool = False,
) -> list[CellResult]:
    """Every scheduler's cell of `plan`, in order: the stored result of a cell with the same
    identity and workload sample, unless `force`; else served by the plan's engine, all
    pending cells in one call (`progress(i, done)` counts the i-th pending cell's tasks).
    `compact` stores new cells' tables smaller (`cell.write.write_run`)."""
    digest = workload_digest(plan.workload)
    results: dict[str, CellResult] = {}
    pending: list[Cell] = []
    redone: dict[str, str] = {}
    for name in schedulers:
        found = lookup(plan, name, digest, force=force)
        if found.reusable:
            results[name] = cached_cell(name, found.run_dir)
            continue
        if found.redone is not None:  # stale or corrupt: start afresh
            redone[name] = found.redone
        params = plan.scheduler_params.get(name, {})
        pending.append(Cell(name, params, found.run_dir, fresh=found.fresh))
    if pending:
        served = ENGINES.get(plan.engine).server().serve(plan, pending, progress)
        for cell, out in zip(pending, served, strict=True):
            stored = _store(plan, cell, out, digest, compact)
            results[cell.scheduler] = replace(stored, redone=redone.get(cell.scheduler))
    return [results[name] for name in schedulers]


def _store(
    plan: RunPlan, cell: Cell, served: Served, digest: str, compact: bool = False
) -> CellResult:
    """Write a served cell (docs/design.md section 8): the tasks with their unloaded JCT (for
    goodput; a real server's is the cost model's estimate), `run.json` with the summary,
    counters, times and the engine's own fields. A cell whose clock went past the limit
    (`horizon.check_served`) is refused, not written."""
    if served.failed is None:
        check_served(served.tables)
    tasks = with_unloaded_jct(
        served.tables["tasks"], plan.workload, plan.preset, plan.sim, digest=digest
    )
    tables = {**served.tables, "tasks": tasks.reset_index(drop=True)}
    if served.failed is not None:  # kept for the rerun that retries it; no run.json
        cell.run_dir.mkdir(parents=True, exist_ok=True)
        for name in TABLES:
            tables[name].to_parquet(cell.run_dir / f"{name}.parquet", index=False)
        raise TopasError(served.failed)
    counters = served.counters
    recorded = run_info(RunTables(tasks, tables["requests"], tables["decisions"], counters))
    info = {
        **recorded,
        "counters": counters,
        "sim_time_s": served.sim_time_s,
        "wall_s": served.wall_s,
        "load": plan.load,
        "capacity_tps": plan.capacity_tps,
        **({"load_reference": list(plan.load_reference)} if plan.load is not None else {}),
        "workload_digest": digest,
        **served.info,
    }
    # a real server's speed is unknown: only the client's own delays bound a JCT
    floor = no_floor if plan.options.real_server else cost_floor(CostModel(plan.preset))
    ident = cell_identity(plan, cell.scheduler)
    floors = jct_floors(plan.workload, floor)
    write_run(cell.run_dir, ident, tables, info, jct_floor_s=floors, compact=compact)
    return CellResult(
        cell.scheduler, cell.run_dir, recorded["summary"], served.sim_time_s, served.wall_s,
        extra=served.extra,
    )  # fmt: skip


__all__ = ["run_cell", "run_cells"]
