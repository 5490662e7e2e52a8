"""`--engine sglang-cpu`, the project side: checks, the driver subprocess, the run directories.

The driver (`driver.py`) runs in SGLang's CPU venv (`make sglang-env`, `.venvs/sglang`, or the
interpreter in `TOPAS_SGLANG_PYTHON`). One subprocess serves every pending cell of a plan, so
SGLang's import (about 10 s) is paid once; each cell's tables come back through a temporary
folder and are written to the cell's run directory exactly as the simulator writes its own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from topas_bench.analysis.metrics import RunTables, run_info
from topas_bench.errors import TopasError
from topas_bench.invariants import cost_floor, jct_floors
from topas_bench.plan import CellResult, RunPlan, stored_cell, workload_digest
from topas_bench.results import TABLES, write_run
from topas_bench.runners.sglang_cpu.job import Cell, Job, ServerSettings
from topas_bench.runners.sim.cost import CostModel
from topas_bench.unloaded import with_unloaded_jct
from topas_bench.workloads.trace import dumps_workload

ENV_PYTHON = "TOPAS_SGLANG_PYTHON"
MAKE_TARGET = "make sglang-env"

#: (cell index, tasks done) as the driver reports them.
Progress = Callable[[int, int], None]


def sglang_python() -> Path:
    """The SGLang venv's interpreter: `TOPAS_SGLANG_PYTHON`, else the checkout's
    `.venvs/sglang` (built by `make sglang-env`)."""
    if env := os.environ.get(ENV_PYTHON):
        return Path(env)
    root = Path(__file__).resolve().parents[4]
    return root / ".venvs" / "sglang" / "bin" / "python"


def check_plan(plan: RunPlan) -> None:
    """Everything that would stop the reference engine, before anything starts."""
    py = sglang_python()
    if not py.exists():
        raise TopasError(
            f"--engine sglang-cpu needs SGLang 0.5.23's CPU venv ({py} is missing): run "
            f"`{MAKE_TARGET}` in the checkout, or set {ENV_PYTHON} to its python"
        )
    if plan.sim.host_tier_tokens:
        raise TopasError(
            "--host-tier-tokens is a simulator setting; the sglang-cpu reference runs SGLang "
            "without a host tier (HiCache)"
        )
    if plan.sim.length_hint != "none":
        raise TopasError(
            "--length-hint oracle is a simulator setting; SGLang's scheduler sees only "
            "max_new_tokens, as a real server does"
        )


def run_cell(
    plan: RunPlan,
    scheduler: str,
    *,
    force: bool = False,
    on_task_done: Callable[[int], None] | None = None,
) -> CellResult:
    progress = (lambda _i, done: on_task_done(done)) if on_task_done is not None else None
    return run_cells(plan, [scheduler], force=force, progress=progress)[0]


def run_cells(
    plan: RunPlan,
    schedulers: Sequence[str],
    *,
    force: bool = False,
    progress: Progress | None = None,
) -> list[CellResult]:
    """Every scheduler's cell of `plan`, stored ones reused unless `force`, in order."""
    check_plan(plan)
    digest = workload_digest(plan.workload)
    results: dict[str, CellResult] = {}
    pending: list[str] = []
    for name in schedulers:
        run_dir = plan.identity(name).run_dir(plan.out)
        stored = None if force else stored_cell(name, run_dir, digest)
        if stored is not None:
            results[name] = stored
        else:
            pending.append(name)
    if pending:
        plan.out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".sglang-cpu-", dir=plan.out))
        try:
            job = _job(plan, pending, tmp)
            _drive(job, tmp, progress)
            for i, name in enumerate(pending):
                results[name] = _store(plan, name, Path(job.cells[i].out), digest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return [results[name] for name in schedulers]


def _job(plan: RunPlan, schedulers: Sequence[str], tmp: Path) -> Job:
    trace = tmp / "workload.jsonl"
    trace.write_text(dumps_workload(plan.workload))
    preset = plan.preset.source if "@" in plan.preset.name and plan.preset.source else None
    cells = tuple(
        Cell(name, str(tmp / f"cell{i}"), dict(plan.scheduler_params.get(name, {})))
        for i, name in enumerate(schedulers)
    )
    job = Job(str(trace), preset or plan.preset.name, ServerSettings.of(plan.sim), cells)
    job.write(tmp / "job.json")
    return job


def _drive(job: Job, tmp: Path, progress: Progress | None) -> None:
    log = tmp / "driver.log"
    cmd = [
        str(sglang_python()),
        "-m",
        "topas_bench.runners.sglang_cpu.driver",
        str(tmp / "job.json"),
    ]
    env = {**os.environ, "PYTHONPATH": _src_path()}
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                try:
                    msg = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if progress is not None and "tasks_done" in msg:
                    progress(int(msg["cell"]), int(msg["tasks_done"]))
        except BaseException:
            proc.kill()
            raise
        finally:
            code = proc.wait()
    if code != 0:
        tail = log.read_text().strip().splitlines()[-1:] or ["(no output)"]
        raise TopasError(f"the sglang-cpu driver failed (exit {code}): {tail[0]}")


def _src_path() -> str:
    """This checkout's sources first, so the driver runs the same code as this process."""
    here = str(Path(__file__).resolve().parents[3])
    rest = os.environ.get("PYTHONPATH")
    return here if not rest else here + os.pathsep + rest


def _store(plan: RunPlan, scheduler: str, cell_dir: Path, digest: str) -> CellResult:
    info = json.loads((cell_dir / "counters.json").read_text())
    tables = {name: pd.read_parquet(cell_dir / f"{name}.parquet") for name in TABLES}
    counters = {k: float(v) for k, v in info["counters"].items()}
    # the same yardstick as the simulator's cells (`unloaded`), so goodput compares
    tables["tasks"] = with_unloaded_jct(tables["tasks"], plan.workload, plan.preset, plan.sim)
    recorded = run_info(
        RunTables(tables["tasks"], tables["requests"], tables["decisions"], counters)
    )
    summary = recorded["summary"]
    ident = plan.identity(scheduler)
    run_dir = ident.run_dir(plan.out)
    write_run(
        run_dir, ident, tables,
        {
            **recorded, "counters": counters, "sim_time_s": info["sim_time_s"],
            "wall_s": info["wall_s"], "load": plan.load, "capacity_tps": plan.capacity_tps,
            "workload_digest": digest,
        },
        jct_floor_s=jct_floors(plan.workload, cost_floor(CostModel(plan.preset))),
    )  # fmt: skip
    return CellResult(scheduler, run_dir, summary, info["sim_time_s"], info["wall_s"])


__all__ = ["check_plan", "run_cell", "run_cells", "sglang_python"]
