"""Run a sweep: plan every group in this process, run its cells on an executor, resumably.

A cell is (group, scheduler). Its directory derives from its identity (`RunIdentity.run_dir`),
so a finished cell is skipped unless `force`, and a killed sweep resumes with nothing lost or
duplicated: cells are written whole or not at all (`cell.write.write_run`), so an unfinished one
is simply run again. Every stored cell is verified before it is skipped (`cell.stored.lookup`:
run.json and every table matching their digests, row counts, the result invariants, the same
workload sample); a corrupt or stale one, or one too old to verify, is run again and reported
in `SweepResult.redone`.

Every group (a `spec.RunSpec`) is planned here, once (`plan_run`): the workload is sampled once,
and its canonical trace text travels to the worker with each cell (never a pickle), so every
scheduler of a group runs on the same tasks; the worker checks the sample's digest. A load
needs the workload's measured capacity: the saturation rate of each of the run's reference
schedulers (`RunSpec.load_reference`, FCFS by default; the best of them is the reference,
`units.reference_rate`) is measured once per (workload, params, preset, KV budget, scheduler)
on the executor, before the cells, and kept in `OUT/capacity.json` so a resumed sweep uses
the same rates (`force` measures again).
"""

from __future__ import annotations

import json
import math
import os
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from topas_bench.cell.identity import cell_identity, trace_digest, workload_digest
from topas_bench.cell.stored import lookup
from topas_bench.errors import TopasError
from topas_bench.experiment import measure_capacity, plan_run
from topas_bench.harness import run_cell
from topas_bench.plan import RunPlan
from topas_bench.progress import Progress
from topas_bench.runners.sim.cost import Preset, load_preset
from topas_bench.spec import RunSpec
from topas_bench.sweep.executors import Executor, make_executor
from topas_bench.sweep.spec import SweepSpec
from topas_bench.units import reference_rate
from topas_bench.workloads.lengths import generation_params
from topas_bench.workloads.registry import identity_params, resolve, run_defaults
from topas_bench.workloads.trace import dumps_workload, loads_workload

CAPACITY_FILE = "capacity.json"

#: workload, params JSON, preset (its `Preset.name`: a file's carries its content hash), KV
#: budget, the scheduler whose saturation rate it is
CapacityKey = tuple[str, str, str, int, str]


@dataclass(frozen=True)
class CellJob:
    """One cell, picklable: the group's plan without its workload, plus the workload's trace."""

    scheduler: str
    trace: str
    digest: str
    plan_fields: Mapping[str, Any]
    force: bool
    compact: bool = False

    def plan(self) -> RunPlan:
        w = loads_workload(self.trace, source=f"sweep cell {self.scheduler}")
        if workload_digest(w) != self.digest:
            raise TopasError("the workload sample changed on its way to the worker")
        return RunPlan(workload=w, **self.plan_fields)


@dataclass(frozen=True)
class CellOutcome:
    workload: str
    scheduler: str
    seed: int
    run_dir: str
    wall_s: float = 0.0
    cached: bool = False
    error: str | None = None


@dataclass(frozen=True)
class CapacityJob:
    key: CapacityKey
    preset: Preset


@dataclass(frozen=True)
class CapacityOutcome:
    key: CapacityKey
    capacity_tps: float | None
    error: str | None = None


@dataclass
class SweepResult:
    out: Path
    cells: int = 0
    skipped: int = 0
    ran: list[CellOutcome] = field(default_factory=list)
    #: stored cells that failed verification and were run again: (directory, why)
    redone: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def failed(self) -> list[CellOutcome]:
        return [c for c in self.ran if c.error is not None]


def run_cell_job(job: CellJob) -> CellOutcome:
    """A worker's entry point (module-level, so process pools and Ray can import it)."""
    seed = int(job.plan_fields["seed"])
    name = str(job.plan_fields["workload_name"])
    try:
        plan = job.plan()
        cell = run_cell(plan, job.scheduler, force=job.force, compact=job.compact)
    except Exception as e:  # a failing cell is data; the sweep goes on with the others
        where = traceback.extract_tb(e.__traceback__)[-1]
        msg = f"{type(e).__name__}: {e} ({Path(where.filename).name}:{where.lineno})"
        return CellOutcome(name, job.scheduler, seed, "", error=" ".join(msg.split()))
    return CellOutcome(name, job.scheduler, seed, str(cell.run_dir), cell.wall_s, cell.cached)


def measure_capacity_job(job: CapacityJob) -> CapacityOutcome:
    workload, params, _, budget, scheduler = job.key
    try:
        named = generation_params(resolve(workload, json.loads(params))[0], json.loads(params))
        params_t = tuple(sorted(named.items()))
        cap = measure_capacity(workload, params_t, job.preset, budget, scheduler)
    except Exception as e:
        return CapacityOutcome(job.key, None, f"{type(e).__name__}: {e}")
    return CapacityOutcome(job.key, cap)


def run_sweep(
    specs: Sequence[SweepSpec],
    out: Path,
    *,
    jobs: int = 1,
    executor: str = "local",
    address: str | None = None,
    force: bool = False,
    compact: bool = False,
    progress: Progress | None = None,
    allow_large: bool = False,
) -> SweepResult:
    """Run every cell of `specs` that has no finished result under `out` (all with `force`);
    `compact` stores the tables smaller (`cell.write.write_run`). A large sweep's memory and time
    are estimated before its workloads are sampled (`_check_size`); one too large for this
    machine is refused unless `allow_large`."""
    progress = progress or Progress()
    _check_names(specs)
    runs = [(spec, run) for spec in specs for run in spec.runs(out)]
    if address is not None and executor != "ray":
        raise TopasError("--address needs --executor ray")
    ex = make_executor(executor, jobs, address)
    try:
        caps = _capacities([run for _, run in runs], out, ex, force, progress)
        _check_size(runs, caps, jobs if executor == "local" else 1, allow_large, progress)
        plans = _plans([run for _, run in runs], caps)
        result = SweepResult(out)
        todo: list[CellJob] = []
        traces: dict[int, tuple[str, str]] = {}  # one trace text per workload sample
        for plan, scheduler in plans:
            result.cells += 1
            sample = id(plan.workload)
            if sample not in traces:
                trace = dumps_workload(plan.workload)
                traces[sample] = (trace, trace_digest(trace))
            found = lookup(plan, scheduler, traces[sample][1], force=force)
            if found.reusable:
                result.skipped += 1
                continue
            if found.redone is not None:
                result.redone.append((found.run_dir, found.redone))
            todo.append(_job(plan, scheduler, force, compact, *traces[sample]))
        progress.phase("cells", len(todo))
        for outcome in ex.imap_unordered(run_cell_job, todo):
            result.ran.append(outcome)
            label = f"{outcome.workload}/{outcome.scheduler}/s{outcome.seed}"
            progress.update("cells", len(result.ran), label)
    finally:
        ex.close()
    return result


def _check_names(specs: Sequence[SweepSpec]) -> None:
    """Unknown workloads and presets fail before anything runs (the run specifications,
    `SweepSpec.runs`, check the schedulers, their parameters and the routers)."""
    for spec in specs:
        for w in spec.workloads:
            resolve(w, spec.workload_params.get(w, {}))
        for p in spec.presets:
            load_preset(p)


def _check_size(
    runs: Sequence[tuple[SweepSpec, RunSpec]],
    caps: Mapping[CapacityKey, float],
    jobs: int,
    allow_large: bool,
    progress: Progress,
) -> None:
    """Estimate the sweep's memory and time (`sizing.estimate_sweep`) when one of its runs has
    more than `ESTIMATE_ABOVE_TASKS` tasks or all together twenty times that; refuse past half
    of this machine's RAM unless `allow_large`. Every workload setting is probed once."""
    from topas_bench.sizing import (
        ESTIMATE_ABOVE_TASKS,
        PROBE_TASKS,
        Probe,
        check,
        estimate_sweep,
        memory_limit_bytes,
        probe,
    )

    sizes = [_tasks(run) for _, run in runs]
    if max(sizes) <= ESTIMATE_ABOVE_TASKS and sum(sizes) <= 20 * ESTIMATE_ABOVE_TASKS:
        return
    progress.note(
        f"{len(runs):,} runs of up to {max(sizes):,} tasks: estimating the sweep's size from "
        f"{PROBE_TASKS}-task probes"
    )
    limit = memory_limit_bytes()
    for with_schedulers in (False, True):  # the workloads alone first: cheap, maybe enough
        probes: dict[tuple[CapacityKey, tuple[str, ...]], Probe] = {}
        sized = []
        for (spec, run), size in zip(runs, sizes, strict=True):
            cap = reference_capacity(run, caps) if run.load is not None else None
            rate = run.load * cap if run.load is not None and cap is not None else run.rate_per_s
            if rate is not None and run.load is None and run.cluster is not None:
                rate /= run.replicas  # probed on one server, at its share of a cluster's rate
            names = spec.schedulers if with_schedulers else ()
            key = (_cap_key(run, "-"), names)
            if key not in probes:
                probes[key] = probe(
                    run.workload, run.workload_params, rate, run.seed, names, run.preset,
                    run.kv_budget_tokens, spec.scheduler_params,
                )  # fmt: skip
            sized.append((probes[key], size))
        est = estimate_sweep(sized, jobs)
        if with_schedulers:
            progress.note(est.describe())
        check(est, limit_bytes=limit, forced=allow_large, what="sweep")


def _budget(run: RunSpec) -> int:
    if run.kv_budget_tokens is not None:
        return run.kv_budget_tokens
    return load_preset(run.preset).derived_kv_budget_tokens


def _cap_key(run: RunSpec, scheduler: str) -> CapacityKey:
    """(workload, its identity's parameters as JSON, preset, KV budget, scheduler): the length
    setting is named as in a cell's identity, so capacities of different settings never mix,
    and those measured before the setting existed (legacy ``exact``) stay valid."""
    params = json.dumps(identity_params(run.workload, run.workload_params), sort_keys=True)
    return (run.workload, params, load_preset(run.preset).name, _budget(run), scheduler)


def reference_capacity(run: RunSpec, caps: Mapping[CapacityKey, float]) -> float:
    """The rate a load of `run` is a fraction of: its reference schedulers' best saturation."""
    return reference_rate({s: caps[_cap_key(run, s)] for s in run.load_reference})[1]


def _capacities(
    runs: Sequence[RunSpec], out: Path, ex: Executor, force: bool, progress: Progress
) -> dict[CapacityKey, float]:
    path = out / CAPACITY_FILE
    known = {} if force else read_capacities(path)
    presets: dict[CapacityKey, Preset] = {
        _cap_key(run, s): load_preset(run.preset)
        for run in runs
        if run.load is not None
        for s in run.load_reference
    }
    need = sorted(set(presets) - set(known))
    if not need:
        return known
    progress.phase("capacity", len(need))
    jobs = [CapacityJob(k, presets[k]) for k in need]
    for i, res in enumerate(ex.imap_unordered(measure_capacity_job, jobs)):
        if res.capacity_tps is None:
            raise TopasError(
                f"measuring the capacity of {res.key[0]} under {res.key[4]} failed: {res.error}"
            )
        known[res.key] = res.capacity_tps
        progress.update("capacity", i + 1, f"{res.key[0]}/{res.key[4]}")
    _write_capacities(path, known)
    return known


def read_capacities(path: Path) -> dict[CapacityKey, float]:
    """The capacities kept in `path` (none when it does not exist); a file that is not a
    readable list of positive rates is `TopasError` naming it."""
    if not path.exists():
        return {}
    fix = "delete it or use --force"
    if not path.is_file():
        raise TopasError(f"{path}: not a file, so no capacity cache; {fix}")
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["capacities"]
        caps = {
            (r["workload"], json.dumps(r["workload_params"], sort_keys=True), r["preset"],
             int(r["kv_budget_tokens"]), str(r.get("scheduler", "fcfs"))): float(r["capacity_tps"])
            for r in rows
        }  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:
        raise TopasError(
            f"{path}: unreadable capacity cache ({' '.join(str(e).split())[:200]}); {fix}"
        ) from None
    for (workload, _, _, _, scheduler), cap in caps.items():
        if not (math.isfinite(cap) and cap > 0):
            raise TopasError(
                f"{path}: the capacity of {workload} under {scheduler} is {cap!r}, not a "
                f"positive number of tasks/s; {fix}"
            )
    return caps


def _write_capacities(path: Path, caps: Mapping[CapacityKey, float]) -> None:
    """Write the cache atomically (a temporary sibling, then a rename): a failed write leaves
    the former file, or none, and no temporary one."""
    rows = [
        {"workload": w, "workload_params": json.loads(p), "preset": pr,
         "kv_budget_tokens": b, "scheduler": s, "capacity_tps": c}
        for (w, p, pr, b, s), c in sorted(caps.items())
    ]  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(json.dumps({"capacities": rows}, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise TopasError(f"{path}: cannot write the capacity cache ({e.strerror or e})") from None


def _plans(runs: Sequence[RunSpec], caps: Mapping[CapacityKey, float]) -> list[tuple[RunPlan, str]]:
    """Every cell as (its group's plan, scheduler), each distinct run directory once. Runs of
    one group that differ only in their schedulers and parameters (a sweep's tuned variants,
    `SweepSpec.runs`) share one plan's workload sample."""
    cells: dict[Path, tuple[RunPlan, str]] = {}
    sampled: dict[tuple[tuple[str, str], ...], RunPlan] = {}
    for run in runs:
        group = tuple((f.name, repr(getattr(run, f.name))) for f in fields(run)
                      if f.name not in ("schedulers", "scheduler_params"))  # fmt: skip
        if group in sampled:
            plan = replace(sampled[group], schedulers=run.schedulers,
                           scheduler_params=run.scheduler_params)  # fmt: skip
        else:
            cap = reference_capacity(run, caps) if run.load is not None else None
            plan = sampled[group] = plan_run(run, capacity_tps=cap)
        for s in plan.schedulers:
            cells.setdefault(cell_identity(plan, s).run_dir(run.out), (plan, s))
    return list(cells.values())


def _tasks(run: RunSpec) -> int:
    """A run's task count (its workload's default when not given)."""
    return run.num_tasks or run_defaults(run.workload, run.workload_params)[0]


def _job(
    plan: RunPlan, scheduler: str, force: bool, compact: bool, trace: str, digest: str
) -> CellJob:
    rest = {f.name: getattr(plan, f.name) for f in fields(plan) if f.name != "workload"}
    return CellJob(scheduler, trace, digest, rest, force, compact)
