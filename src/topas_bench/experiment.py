"""Plan and run experiments: one workload sample, several schedulers, one engine setting.

`plan_run` checks every input before anything runs (names, rates, task counts, the KV budget
against the largest call) and samples the workload once, so every scheduler sees the same
tasks. `run_cell` runs one scheduler on that sample, or returns the stored summary of a run
with the same identity unless `force`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topas_bench.analysis.metrics import RunTables, summarize
from topas_bench.errors import TopasError
from topas_bench.results import RunIdentity, read_meta, reusable, write_run
from topas_bench.runners.sim.config import LengthHint, SimConfig
from topas_bench.runners.sim.cost import CostModel, Preset, load_preset
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.registry import ABLATIONS, BASELINES, SCHEDULERS, make_policy
from topas_bench.workloads.model import Stage, Workload
from topas_bench.workloads.registry import WORKLOADS, generate
from topas_bench.workloads.trace import validate

#: Capacity probe (see `measure_capacity`): sample size, JCT inflation at the knee, precision.
CAPACITY_PROBE_TASKS = 200
CAPACITY_JCT_INFLATION = 3.0
CAPACITY_BISECTIONS = 7


@dataclass(frozen=True)
class RunPlan:
    workload: Workload
    workload_name: str
    workload_params: Mapping[str, Any]
    schedulers: tuple[str, ...]
    scheduler_params: Mapping[str, Mapping[str, Any]]
    num_tasks: int
    seed: int
    rate_per_s: float
    load: float | None
    capacity_tps: float | None
    preset: Preset
    kv_budget_tokens: int
    kv_budget_derived: bool
    sim: SimConfig
    out: Path
    #: `runners.sglang.runner.SglangOptions` when the engine is a real SGLang server.
    sglang: Any = None

    def identity(self, scheduler: str) -> RunIdentity:
        defaults = SimConfig(kv_budget_tokens=self.kv_budget_tokens)
        engine_params = {
            k: getattr(self.sim, k)
            for k in ("host_tier_tokens", "length_hint", "chunked_prefill_size",
                      "max_prefill_tokens", "decision_interval_steps", "max_running_requests")
            if getattr(self.sim, k) != getattr(defaults, k)
        }  # fmt: skip
        return RunIdentity(
            workload=self.workload_name,
            num_tasks=self.num_tasks,
            rate_per_s=self.rate_per_s,
            seed=self.seed,
            scheduler=scheduler,
            preset=self.preset.name,
            kv_budget_tokens=self.kv_budget_tokens,
            workload_params=dict(self.workload_params),
            scheduler_params=dict(self.scheduler_params.get(scheduler, {})),
            engine_params=engine_params,
        )


@dataclass(frozen=True)
class CellResult:
    scheduler: str
    run_dir: Path
    summary: dict[str, float]
    sim_time_s: float
    wall_s: float
    cached: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


#: Named groups accepted by `--scheduler`.
GROUPS: dict[str, tuple[str, ...]] = {
    "all": (*BASELINES, "topas"),
    "baselines": BASELINES,
    "ablations": ("topas", *ABLATIONS),
}


def parse_schedulers(spec: str) -> tuple[str, ...]:
    """Comma-separated scheduler names and groups (`all` = the paper's baselines + topas,
    `baselines`, `ablations`, `everything` = every registered policy), e.g. `all,topas-base`."""
    names: list[str] = []
    explicit: set[str] = set()
    for item in (n.strip() for n in spec.split(",")):
        if not item:
            continue
        if item == "everything":
            names += SCHEDULERS.names()
        elif item in GROUPS:
            names += GROUPS[item]
        else:
            SCHEDULERS.get(item)  # raises with the known names
            if item in explicit:
                raise TopasError(f"--scheduler lists a name twice: {spec}")
            explicit.add(item)
            names.append(item)
    if not names:
        raise TopasError("--scheduler is empty; give `all` or a comma-separated list")
    return tuple(dict.fromkeys(names))  # a group may overlap a name or another group


def plan_run(
    *,
    workload: str,
    schedulers: Sequence[str],
    num_tasks: int,
    seed: int = 0,
    rate_per_s: float | None = None,
    load: float | None = None,
    preset: str = "a100-qwen32b",
    kv_budget_tokens: int | None = None,
    length_hint: LengthHint = "none",
    host_tier_tokens: int = 0,
    out: Path = Path("runs"),
    workload_params: Mapping[str, Any] | None = None,
    scheduler_params: Mapping[str, Mapping[str, Any]] | None = None,
    before_generate: Callable[[float], None] | None = None,
) -> RunPlan:
    """`before_generate(rate_per_s)`, when given, is called once the inputs are checked and
    just before the workload is sampled (`topas-bench run` estimates the run's size there)."""
    spec = WORKLOADS.get(workload)
    pre = load_preset(preset)
    if num_tasks < 1:
        raise TopasError(f"--tasks must be a positive integer, got {num_tasks}")
    if seed < 0:
        raise TopasError(f"--seed must be >= 0, got {seed}")
    if rate_per_s is not None and load is not None:
        raise TopasError("give either --rate or --load, not both")
    for name, value in (("--rate", rate_per_s), ("--load", load)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise TopasError(f"{name} must be a positive number, got {value}")
    if kv_budget_tokens is not None and kv_budget_tokens < 1:
        raise TopasError(f"--kv-budget must be a positive number of tokens, got {kv_budget_tokens}")
    budget = kv_budget_tokens if kv_budget_tokens is not None else pre.derived_kv_budget_tokens
    sim = SimConfig(
        kv_budget_tokens=budget, length_hint=length_hint, host_tier_tokens=host_tier_tokens
    )
    wparams = dict(workload_params or {})
    capacity = None
    if load is not None:
        capacity = measure_capacity(workload, tuple(sorted(wparams.items())), pre, budget)
        rate = load * capacity
    else:
        rate = rate_per_s if rate_per_s is not None else spec.default_rate_per_s
    sparams = {k: dict(v) for k, v in (scheduler_params or {}).items()}
    for name in sparams:
        if name not in schedulers:
            SCHEDULERS.get(name)  # an unknown name: raises with the known names
            raise TopasError(
                f"--scheduler-param for {name!r}, which is not in this run "
                f"(schedulers: {', '.join(schedulers)})"
            )
    for name in schedulers:
        make_policy(name, **sparams.get(name, {}))  # reject bad parameters before running
    if before_generate is not None:
        before_generate(rate)
    w = generate(workload, num_tasks=num_tasks, rate_per_s=rate, seed=seed, **wparams)
    check_fits(w, budget)
    problems = validate(w, kv_budget_tokens=budget)
    if problems:
        p = problems[0]
        raise TopasError(
            f"workload {workload!r} is invalid ({len(problems)} problems): {p.field}: {p.message}"
        )
    return RunPlan(
        workload=w, workload_name=workload, workload_params=wparams, schedulers=tuple(schedulers),
        scheduler_params=sparams, num_tasks=num_tasks, seed=seed, rate_per_s=rate, load=load,
        capacity_tps=capacity, preset=pre, kv_budget_tokens=budget,
        kv_budget_derived=kv_budget_tokens is None, sim=sim, out=out,
    )  # fmt: skip


def check_fits(
    w: Workload, kv_budget_tokens: int, clip_max_new_tokens: int = SimConfig.clip_max_new_tokens
) -> None:
    """Every call must be admissible alone on an idle server. Admission (`PrefillAdder.need`)
    charges prompt + min(max_new_tokens, clip) + 1 tokens and needs that strictly below the
    budget, so the least budget is prompt + min(max_new_tokens, clip) + 2."""

    def least(s: Stage) -> int:
        return s.prompt_tokens + min(s.max_new_tokens, clip_max_new_tokens) + 2

    stage = max((s for _, s in w.stages()), key=least)
    need = least(stage)
    if need > kv_budget_tokens:
        raise TopasError(
            f"KV budget of {kv_budget_tokens:,} tokens is smaller than the largest call in "
            f"{w.name!r} (prompt {stage.prompt_tokens:,} + output {stage.output_tokens:,} tokens, "
            f"max_new_tokens {stage.max_new_tokens:,}); raise --kv-budget to at least {need:,}"
            + (
                f", or lower --workload-param context_tokens (now {w.params['context_tokens']:,}"
                ", MetaGPT's memory cut) to about 0.8 x the budget"
                if "context_tokens" in w.params
                else ""
            )
        )


def run_cell(
    plan: RunPlan,
    scheduler: str,
    *,
    force: bool = False,
    on_task_done: Callable[[int], None] | None = None,
) -> CellResult:
    if plan.sglang is not None:
        from topas_bench.runners.sglang import runner

        return runner.run_cell(plan, scheduler, plan.sglang, force=force, on_task_done=on_task_done)
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
    summary = summarize(RunTables(res.tasks, res.requests, res.decisions, counters))
    tables = {
        "requests": res.requests, "tasks": res.tasks,
        "timeline": res.timeline, "decisions": res.decisions,
    }  # fmt: skip
    info = {
        "summary": summary,
        "counters": counters,
        "sim_time_s": res.sim_time_s,
        "wall_s": res.wall_s,
        "load": plan.load,
        "capacity_tps": plan.capacity_tps,
        "workload_digest": digest,
    }
    write_run(run_dir, ident, tables, info)
    return CellResult(scheduler, run_dir, summary, res.sim_time_s, res.wall_s)


def stored_cell(scheduler: str, run_dir: Path, digest: str) -> CellResult | None:
    """The stored result in `run_dir` if it is a finished run of the same workload sample
    (`results.reusable`), else None."""
    if not reusable(run_dir, digest):
        return None
    meta = read_meta(run_dir)
    return CellResult(
        scheduler, run_dir, meta["summary"], meta["sim_time_s"], meta["wall_s"], cached=True
    )


def workload_digest(w: Workload) -> str:
    from topas_bench.workloads.trace import dumps_workload

    return trace_digest(dumps_workload(w))


def trace_digest(trace: str) -> str:
    """The digest of a workload's trace text (`dumps_workload`): `workload_digest` without
    serialising again when the text is at hand."""
    import hashlib

    return hashlib.sha256(trace.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=64)
def measure_capacity(
    workload: str, params: tuple[tuple[str, Any], ...], preset: Preset, kv_budget_tokens: int
) -> float:
    """A workload's capacity (tasks/s) on one engine setting: the Poisson rate at which FCFS's
    mean JCT reaches `CAPACITY_JCT_INFLATION` times the mean JCT of the same tasks served one
    at a time (the knee of FCFS's load curve; beyond it queues grow fast).

    Found by doubling, then bisection in log-rate, on a `CAPACITY_PROBE_TASKS`-task sample
    (seed 0). Generators keep task contents fixed across rates, so only spacing changes. A
    load of F means a Poisson rate of F x capacity, the same rate for every scheduler.
    """
    cost = CostModel(preset)
    cfg = SimConfig(kv_budget_tokens=kv_budget_tokens, record_timeline=False)

    def mean_jct(rate: float) -> float:
        w = generate(
            workload, num_tasks=CAPACITY_PROBE_TASKS, rate_per_s=rate, seed=0, **dict(params)
        )
        check_fits(w, kv_budget_tokens)
        res = Simulator(w, make_policy("fcfs"), cost, cfg).run()
        return float(res.tasks["jct_s"].mean())

    solo = mean_jct(1e-9)
    target = CAPACITY_JCT_INFLATION * solo
    lo, hi = 0.0, 1.0 / solo
    while mean_jct(hi) < target:
        lo, hi = hi, hi * 2.0
    lo = lo or hi / 2.0
    for _ in range(CAPACITY_BISECTIONS):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if mean_jct(mid) < target else (lo, mid)
    return math.sqrt(lo * hi)


__all__ = ["BASELINES", "CellResult", "RunPlan", "measure_capacity", "plan_run", "run_cell"]
