"""Plan and run experiments: one workload sample, several schedulers, one engine setting.

`plan_run` turns a run specification (`spec.RunSpec`, already checked) into a plan: the engine
checks what it needs (`plan.Server.prepare`), the workload and preset are resolved, the rate
worked out (a load from the measured capacity), a large run's size estimated, the workload
sampled once, so every scheduler sees the same tasks, and checked against the KV budget.
`run_plan` runs every scheduler of a plan through the harness (`harness.run_cell`).
"""

from __future__ import annotations

import functools
import math
from typing import Any

from topas_bench.cell.identity import trace_digest, workload_digest
from topas_bench.cell.stored import CellResult
from topas_bench.errors import TopasError
from topas_bench.harness import run_cell
from topas_bench.horizon import FIX_PRESET, LIMIT, check_plan, too_far
from topas_bench.plan import RunPlan
from topas_bench.progress import Progress
from topas_bench.runners.engines import ENGINES
from topas_bench.runners.sim.config import SimConfig, check_fits
from topas_bench.runners.sim.cost import CostModel, Preset, load_preset
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.registry import BASELINES, make_policy
from topas_bench.sizing import ESTIMATE_ABOVE_TASKS, check_run
from topas_bench.spec import RunSpec
from topas_bench.workloads.registry import DEFAULT_RATE_PRESET, generate, resolve, run_defaults
from topas_bench.workloads.trace import validate
from topas_bench.workloads.trace.parse import MAX_TIME_S

#: Capacity probe (see `measure_capacity`): sample size, JCT inflation at the knee, precision.
CAPACITY_PROBE_TASKS = 200
CAPACITY_JCT_INFLATION = 3.0
CAPACITY_BISECTIONS = 7
#: Doublings of the probe's rate before it gives up: 2^64 times the unloaded rate.
CAPACITY_DOUBLINGS = 64


def plan_run(
    spec: RunSpec,
    *,
    capacity_tps: float | None = None,
    check_size: bool = False,
    allow_large: bool = False,
    progress: Progress | None = None,
) -> RunPlan:
    """The plan of `spec` (module docstring). A load's capacity is measured unless given
    (`capacity_tps`: a sweep measures its groups' in parallel and keeps them): the best
    saturation rate of `spec.load_reference` (FCFS's by default). With a cluster
    a load, and the workload's default rate, are per replica: the Poisson rate is N times a
    single server's (a trace file still keeps its own arrival times). `check_size` estimates
    a simulated run of more than `sizing.ESTIMATE_ABOVE_TASKS` tasks first and refuses one too
    large for this machine unless `allow_large`."""
    progress = progress or Progress()
    spec = ENGINES.get(spec.engine.engine).server().prepare(spec)
    workload, wparams = resolve(spec.workload, spec.workload_params)  # a file: `trace`
    pre = load_preset(spec.preset)
    num_tasks = spec.num_tasks
    if num_tasks is None:
        num_tasks = run_defaults(spec.workload, spec.workload_params)[0]
    given_budget = spec.kv_budget_tokens
    budget = given_budget if given_budget is not None else pre.derived_kv_budget_tokens
    sim = SimConfig(kv_budget_tokens=budget, **spec.engine.sim_settings())
    capacity = None
    if spec.load is not None:
        capacity = capacity_tps
        if capacity is None:
            named = tuple(sorted(wparams.items()))
            capacity = max(
                measure_capacity(workload, named, pre, budget, s) for s in spec.load_reference
            )
        rate = spec.load * capacity * spec.replicas
    else:
        own = workload == "trace"  # a trace file keeps its own arrival times
        default = run_defaults(workload, wparams)[1] * (1 if own else spec.replicas)
        rate = spec.rate_per_s if spec.rate_per_s is not None else default
    check_span(num_tasks, rate, "--load" if spec.load is not None else "--rate",
               spec.load or spec.rate_per_s)  # fmt: skip
    if check_size and not spec.engine.real_server:  # a real server's memory is not ours
        # probed on one server at its share of the rate
        check_run(spec, num_tasks, rate / spec.replicas, forced=allow_large, say=progress.note)
    sampling = f"sampling {num_tasks:,} tasks"
    if num_tasks > ESTIMATE_ABOVE_TASKS:
        progress.phase(sampling, None)
    try:
        w = generate(workload, num_tasks=num_tasks, rate_per_s=rate, seed=spec.seed, **wparams)
    finally:
        if num_tasks > ESTIMATE_ABOVE_TASKS:
            progress.end(sampling)
    check_fits(w, budget, sim.context_length)
    problems = validate(w, kv_budget_tokens=budget)
    if problems:
        p = problems[0]
        raise TopasError(
            f"workload {workload!r} is invalid ({len(problems)} problems): {p.field}: {p.message}"
        )
    # a real server's speed is unknown: only the client's own delays bound a JCT
    check_plan(w, None if spec.engine.real_server else CostModel(pre), spec.workload, spec.preset)
    return RunPlan(
        workload=w, workload_name=workload, workload_params=wparams,
        schedulers=spec.schedulers, scheduler_params=spec.scheduler_params,
        num_tasks=num_tasks, seed=spec.seed, rate_per_s=rate, load=spec.load,
        capacity_tps=capacity, load_reference=spec.load_reference, preset=pre,
        kv_budget_tokens=budget,
        kv_budget_derived=given_budget is None, sim=sim, out=spec.out, options=spec.engine,
        cluster=spec.cluster,
    )  # fmt: skip


def run_plan(
    plan: RunPlan, *, force: bool = False, progress: Progress | None = None
) -> list[CellResult]:
    """Every scheduler of `plan`, one cell after the other (a progress phase each)."""
    progress = progress or Progress()
    results = []
    for name in plan.schedulers:
        progress.phase(name, plan.num_tasks)
        counter = functools.partial(progress.update, name)
        cell = run_cell(plan, name, force=force, on_task_done=counter)
        progress.update(name, plan.num_tasks)
        progress.end(name)
        results.append(cell)
    return results


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
    if too_far(solo) or not solo > 0:  # a preset too slow or fast to time: no probe ends
        raise TopasError(
            f"preset {preset.source or preset.name}: a {workload} task alone takes {solo:.3g} s "
            f"on it; {'past ' + LIMIT if solo > 0 else 'its calls vanish in rounding'}; "
            f"{FIX_PRESET}"
        )
    target = CAPACITY_JCT_INFLATION * solo
    lo, hi = 0.0, 1.0 / solo
    for _ in range(CAPACITY_DOUBLINGS):
        if mean_jct(hi) >= target:
            break
        lo, hi = hi, hi * 2.0
    else:
        raise TopasError(
            f"{workload} under {scheduler} on preset {preset.name}: no capacity found (the "
            f"mean JCT stays below {CAPACITY_JCT_INFLATION:g}x its unloaded one up to "
            f"{hi:.3g} tasks/s)"
        )
    lo = lo or hi / 2.0
    for _ in range(CAPACITY_BISECTIONS):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if mean_jct(mid) < target else (lo, mid)
    return math.sqrt(lo * hi)


__all__ = [
    "BASELINES", "CellResult", "RunPlan", "measure_capacity", "plan_run", "run_cell", "run_plan",
    "trace_digest", "workload_digest",
]  # fmt: skip
