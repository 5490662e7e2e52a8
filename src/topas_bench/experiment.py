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
from pathlib import Path
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.plan import CellResult, RunPlan, stored_cell, trace_digest, workload_digest
from topas_bench.runners.cluster.config import ClusterConfig
from topas_bench.runners.cluster.routers import DEFAULT_ROUTER
from topas_bench.runners.engines import ENGINES
from topas_bench.runners.sim.config import LengthHint, SimConfig
from topas_bench.runners.sim.cost import CostModel, Preset, load_preset
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.registry import (
    ABLATIONS,
    BASELINES,
    PEERS,
    SCHEDULERS,
    SGLANG_STOCK,
    make_policy,
)
from topas_bench.workloads.model import Stage, Workload
from topas_bench.workloads.registry import DEFAULT_RATE_PRESET, generate, resolve, run_defaults
from topas_bench.workloads.trace import validate
from topas_bench.workloads.trace_parse import MAX_TIME_S, MAX_TOKENS

#: Capacity probe (see `measure_capacity`): sample size, JCT inflation at the knee, precision.
CAPACITY_PROBE_TASKS = 200
CAPACITY_JCT_INFLATION = 3.0
CAPACITY_BISECTIONS = 7


#: Named groups accepted by `--scheduler`.
GROUPS: dict[str, tuple[str, ...]] = {
    "paper": (*BASELINES, "topas"),
    "peers": PEERS,
    "all": (*BASELINES, "topas", *PEERS),
    "baselines": BASELINES,
    "sglang": ("fcfs", "lpm", *SGLANG_STOCK),
    "ablations": ("topas", *ABLATIONS),
}


def parse_schedulers(spec: str) -> tuple[str, ...]:
    """Comma-separated scheduler names and groups (`paper` = the paper's five baselines +
    topas, `peers` = the schedulers the paper left out, `all` = both, `baselines`, `sglang` =
    stock SGLang's policies, `ablations`, `everything` = every registered policy), e.g.
    `paper,topas-base`."""
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
    engine: str = "sim",
    before_generate: Callable[[float], None] | None = None,
    replicas: int | None = None,
    router: str | None = None,
    router_params: Mapping[str, Any] | None = None,
) -> RunPlan:
    """`before_generate(rate_per_s)`, when given, is called once the inputs are checked and
    just before the workload is sampled (`topas-bench run` estimates the run's size there).

    `replicas` (with `router`, default `routers.DEFAULT_ROUTER`, and `router_params`) runs the
    plan on a cluster of that many servers (`runners.cluster`). A load, and the workload's
    default rate, are then per replica: the Poisson rate is N times a single server's (a trace
    file still keeps its own arrival times)."""
    ENGINES.get(engine)  # an unknown engine: raises with the known names
    cluster = cluster_config(replicas, router, router_params)
    if cluster is not None and engine == "sglang-cpu":
        raise TopasError("--replicas is for --engine sim or sglang; sglang-cpu runs one server")
    scale = cluster.replicas if cluster is not None else 1
    workload, wparams = resolve(workload, workload_params)  # a trace file: the `trace` workload
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
    if kv_budget_tokens is not None and not 1 <= kv_budget_tokens <= MAX_TOKENS:
        raise TopasError(
            f"--kv-budget must be a positive number of tokens, got {kv_budget_tokens} (at most "
            f"{MAX_TOKENS:,})"
        )
    if not 0 <= host_tier_tokens <= MAX_TOKENS:
        raise TopasError(f"--host-tier-tokens must be 0..{MAX_TOKENS:,}, got {host_tier_tokens}")
    budget = kv_budget_tokens if kv_budget_tokens is not None else pre.derived_kv_budget_tokens
    sim = SimConfig(
        kv_budget_tokens=budget, length_hint=length_hint, host_tier_tokens=host_tier_tokens
    )
    capacity = None
    if load is not None:
        capacity = measure_capacity(workload, tuple(sorted(wparams.items())), pre, budget)
        rate = load * capacity * scale
    else:
        own = workload == "trace"  # a trace file keeps its own arrival times
        default = run_defaults(workload, wparams)[1] * (1 if own else scale)
        rate = rate_per_s if rate_per_s is not None else default
    check_span(num_tasks, rate, "--load" if load is not None else "--rate", load or rate_per_s)
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
    check_fits(w, budget, sim.context_length)
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
        kv_budget_derived=kv_budget_tokens is None, sim=sim, out=out, engine=engine,
        cluster=cluster,
    )  # fmt: skip


def check_span(num_tasks: int, rate_per_s: float, flag: str, given: float | None) -> None:
    """Refuse a rate at which the tasks would arrive past `MAX_TIME_S` (about 31.7 years; the
    clock loses the precision a run needs beyond it): their expected span is tasks / rate.
    `flag` and `given` say where the rate came from (`--rate`, `--load`), for the message."""
    if not (rate_per_s > 0 and num_tasks / rate_per_s > MAX_TIME_S):
        return
    need = num_tasks / MAX_TIME_S  # the least rate
    if flag == "--load" and given is not None:
        said, fix = (
            f"--load {given:g} (a rate of {rate_per_s:.3g} tasks/s)",
            f"--load {given * need / rate_per_s:.3g}",
        )
    elif given is not None:
        said, fix = f"--rate {given:g}", f"--rate {need:.3g}"
    else:
        said, fix = f"the default rate {rate_per_s:.3g} tasks/s", f"--rate {need:.3g}"
    raise TopasError(
        f"{said}: {num_tasks:,} tasks would arrive over about {num_tasks / rate_per_s:.3g} s, "
        f"past the {MAX_TIME_S:g} s (31.7 years) a run's clock resolves; give at least {fix}"
    )


def cluster_config(
    replicas: int | None, router: str | None, router_params: Mapping[str, Any] | None
) -> ClusterConfig | None:
    """The cluster setting of `--replicas`/`--router`/`--router-param`, or None (one server)."""
    if replicas is None:
        if router is not None or router_params:
            raise TopasError("--router and --router-param need --replicas N")
        return None
    return ClusterConfig(replicas, router or DEFAULT_ROUTER, dict(router_params or {}))


def default_rate_warning(plan: RunPlan, rate_given: bool) -> str | None:
    """A warning when `plan` runs a workload at its default rate on another setting than the
    one that rate was measured on (the default preset and its derived KV budget): there the
    rate can leave the server idle (every scheduler prints the same row) or overloaded."""
    if rate_given or plan.load is not None or plan.workload_name == "trace":
        return None
    home = load_preset(DEFAULT_RATE_PRESET)
    budget = home.derived_kv_budget_tokens
    if plan.preset.name == home.name and plan.kv_budget_tokens == budget:
        return None
    return (
        f"warning: {plan.workload_name}'s default rate ({plan.rate_per_s:.4g} tasks/s) is 0.8 x "
        f"its capacity on {home.name} with {budget:,} KV tokens, not on this setting "
        f"({plan.preset.name}, {plan.kv_budget_tokens:,} tokens): queues may never form, or "
        "never drain; --load 0.8 measures this setting's capacity and runs at 0.8 of it"
    )


def check_fits(w: Workload, kv_budget_tokens: int, context_length: int = 32768) -> None:
    """Every call must be one the server serves whole: SGLang refuses a prompt of at least
    `min(context_length - 1, kv_budget - 1) - 5` tokens (`TpModelWorker.get_worker_info`)
    and clips `max_new_tokens` to `min(context_length, kv_budget) - prompt - 2`
    (`Scheduler.init_req_max_new_tokens`), which must leave the call its output."""

    def least(s: Stage) -> int:
        return max(
            s.prompt_tokens + 7, s.prompt_tokens + min(s.output_tokens, s.max_new_tokens) + 2
        )

    stage = max((s for _, s in w.stages()), key=least)
    need = least(stage)
    if need > min(kv_budget_tokens, context_length):
        what = "KV budget" if kv_budget_tokens <= context_length else "context length"
        have = min(kv_budget_tokens, context_length)
        out = min(stage.output_tokens, stage.max_new_tokens)
        if need == stage.prompt_tokens + out + 2:
            parts = f"prompt {stage.prompt_tokens:,} + output {out:,} + 2 spare tokens"
        else:  # SGLang refuses a prompt within 7 tokens of the limit, whatever its output
            parts = f"prompt {stage.prompt_tokens:,} + 7 tokens SGLang keeps beyond a prompt"
        raise TopasError(
            f"{what} of {have:,} tokens is smaller than the largest call in {w.name!r} "
            f"({parts} = {need:,}); raise --kv-budget to at least {need:,}"
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
    """Run one scheduler of `plan` on its engine (`runners.engines.ENGINES`), or return the
    stored result of a run with the same identity unless `force`."""
    run = ENGINES.get(plan.engine).run_cell()
    result: CellResult = run(plan, scheduler, force=force, on_task_done=on_task_done)
    return result


def measure_capacity(
    workload: str,
    params: tuple[tuple[str, Any], ...],
    preset: Preset,
    kv_budget_tokens: int,
    scheduler: str = "fcfs",
) -> float:
    """A workload's capacity (tasks/s) on one engine setting: the Poisson rate at which FCFS's
    mean JCT reaches `CAPACITY_JCT_INFLATION` times the mean JCT of the same tasks served one
    at a time (the knee of FCFS's load curve; beyond it queues grow fast). With `scheduler`,
    that scheduler's knee instead (`topas-bench workloads saturation` takes the best
    baseline's).

    Found by doubling, then bisection in log-rate, on a `CAPACITY_PROBE_TASKS`-task sample
    (seed 0). Generators keep task contents fixed across rates, so only spacing changes. A
    load of F means a Poisson rate of F x capacity, the same rate for every scheduler.
    """
    frozen = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in params)
    return _measure_capacity(workload, frozen, preset, kv_budget_tokens, scheduler)


@functools.lru_cache(maxsize=64)
def _measure_capacity(
    workload: str,
    params: tuple[tuple[str, Any], ...],
    preset: Preset,
    kv_budget_tokens: int,
    scheduler: str,
) -> float:
    cost = CostModel(preset)
    cfg = SimConfig(kv_budget_tokens=kv_budget_tokens, record_timeline=False)

    def mean_jct(rate: float) -> float:
        w = generate(
            workload, num_tasks=CAPACITY_PROBE_TASKS, rate_per_s=rate, seed=0, **dict(params)
        )
        check_fits(w, kv_budget_tokens)
        res = Simulator(w, make_policy(scheduler), cost, cfg).run()
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


__all__ = [
    "BASELINES", "CellResult", "RunPlan", "measure_capacity", "plan_run", "run_cell",
    "stored_cell", "trace_digest", "workload_digest",
]  # fmt: skip
