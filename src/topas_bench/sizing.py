"""How much memory and time a run will take, estimated before it starts (issue 13).

A large `--tasks` used to build gigabytes of workload before printing anything. Now a run (or a
sweep) of more than `ESTIMATE_ABOVE_TASKS` tasks first measures a probe of `PROBE_TASKS` tasks
of the same workload: the probe is generated and simulated under `tracemalloc` (bytes the
workload, its trace text and the simulator's records take per task) and simulated once per
scheduler, timed. Everything is linear in the tasks, so the estimate is the probe scaled up.
Per-task simulation time grows with queueing, which a short probe sees little of: the time is
a rough lower bound; the run's progress bars show the real pace.

`check` refuses a run whose estimated peak memory exceeds `memory_limit_bytes()` (half of this
machine's RAM) unless it is forced, with the estimate and the way to force it in the error.
"""

from __future__ import annotations

import os
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from topas_bench.errors import TopasError

if TYPE_CHECKING:
    from topas_bench.spec import RunSpec

#: Runs above this many tasks get an estimate first (smaller ones take seconds and little memory).
ESTIMATE_ABOVE_TASKS = 5_000
#: Tasks in the probe that is measured and scaled up.
PROBE_TASKS = 100

T = TypeVar("T")


@dataclass(frozen=True)
class Estimate:
    """A run's (or a sweep's) estimated size. Bytes are Python allocations as `tracemalloc`
    counts them (the process's resident size is somewhat larger)."""

    num_tasks: int
    calls: int
    #: what stays in memory for the whole run: the workload(s) (a sweep: and their trace text)
    held_bytes: int
    #: the most in memory at once: `held_bytes` plus what the running cells add
    peak_bytes: int
    generate_s: float
    #: simulated wall time per scheduler name
    simulate_s: tuple[tuple[str, float], ...]

    @property
    def total_s(self) -> float:
        return self.generate_s + sum(s for _, s in self.simulate_s)

    @property
    def simulated(self) -> bool:
        """False for a lower bound from the workload alone (`probe` without schedulers)."""
        return bool(self.simulate_s)

    def describe(self) -> str:
        return (
            f"estimated size: {self.num_tasks:,} tasks, {self.calls:,} calls, "
            f"{'about' if self.simulated else 'at least'} {gigabytes(self.peak_bytes)} of "
            f"memory at peak and at least {duration(self.total_s)} "
            f"({duration(self.generate_s)} to generate"
            + "".join(f", {name} {duration(s)}" for name, s in self.simulate_s)
            + ")"
        )


@dataclass(frozen=True)
class Probe:
    """Per-task figures of one workload setting, measured on `PROBE_TASKS` tasks."""

    calls_per_task: float
    workload_bytes_per_task: float
    trace_bytes_per_task: float
    sim_bytes_per_task: float
    generate_s_per_task: float
    simulate_s_per_task: Mapping[str, float]


def probe(
    workload: str,
    params: Mapping[str, Any],
    rate_per_s: float | None,
    seed: int,
    schedulers: Sequence[str],
    preset: str,
    kv_budget_tokens: int | None,
    scheduler_params: Mapping[str, Mapping[str, Any]] | None = None,
) -> Probe:
    """Measure `PROBE_TASKS` tasks of the workload: generated and serialised under
    `tracemalloc`, then (given `schedulers`) simulated with each scheduler under `tracemalloc`
    (memory) and again without it (time: tracemalloc slows allocation several times over).
    With no schedulers the simulation fields are 0: a lower bound, and cheap."""
    from topas_bench.runners.sim.config import SimConfig, check_fits
    from topas_bench.runners.sim.cost import CostModel, load_preset
    from topas_bench.runners.sim.engine import Simulator
    from topas_bench.schedulers.registry import make_policy
    from topas_bench.workloads.registry import generate
    from topas_bench.workloads.trace import dumps_workload

    n = PROBE_TASKS
    w, held, _, _ = _measured(
        lambda: generate(workload, num_tasks=n, rate_per_s=rate_per_s, seed=seed, **params)
    )
    t0 = time.perf_counter()
    generate(workload, num_tasks=n, rate_per_s=rate_per_s, seed=seed, **params)
    gen_s = time.perf_counter() - t0
    _, _, trace_peak, _ = _measured(lambda: dumps_workload(w))
    sim_peak, per_scheduler = 0, {}
    if schedulers:
        pre = load_preset(preset)
        budget = kv_budget_tokens or pre.derived_kv_budget_tokens
        check_fits(w, budget)
        cost, cfg = CostModel(pre), SimConfig(kv_budget_tokens=budget)

        def simulate(name: str) -> Callable[[], object]:
            policy = make_policy(name, **(scheduler_params or {}).get(name, {}))
            return lambda: Simulator(w, policy, cost, cfg).run()

        sim_peak = max(_measured(simulate(name))[2] for name in schedulers)
        for name in schedulers:
            t0 = time.perf_counter()
            simulate(name)()
            per_scheduler[name] = (time.perf_counter() - t0) / n
    return Probe(
        calls_per_task=sum(len(t.stages) for t in w.tasks) / n,
        workload_bytes_per_task=held / n,
        trace_bytes_per_task=trace_peak / n,
        sim_bytes_per_task=sim_peak / n,
        generate_s_per_task=gen_s / n,
        simulate_s_per_task=per_scheduler,
    )


def estimate_run(p: Probe, num_tasks: int) -> Estimate:
    """One run: the workload stays; each cell first serialises it (its digest), then simulates
    it, one cell at a time."""
    held = num_tasks * p.workload_bytes_per_task
    cell = num_tasks * max(p.trace_bytes_per_task, p.sim_bytes_per_task)
    return Estimate(
        num_tasks=num_tasks,
        calls=round(num_tasks * p.calls_per_task),
        held_bytes=round(held),
        peak_bytes=round(held + cell),
        generate_s=num_tasks * p.generate_s_per_task,
        simulate_s=tuple((s, num_tasks * t) for s, t in p.simulate_s_per_task.items()),
    )


def estimate_sweep(groups: Sequence[tuple[Probe, int]], jobs: int) -> Estimate:
    """A sweep: every group's workload and trace text are held from planning to the end (one
    group per (workload, load/rate, seed, ...) with `int` tasks); `jobs` workers each run one
    cell at a time with their own copy of its trace and workload; cells run `jobs` at a
    time."""
    held = sum(n * (p.workload_bytes_per_task + p.trace_bytes_per_task) for p, n in groups)
    per_cell = sorted(
        (
            n * (p.trace_bytes_per_task + p.workload_bytes_per_task + p.sim_bytes_per_task)
            for p, n in groups
        ),
        reverse=True,
    )
    sim: dict[str, float] = {}
    for p, n in groups:
        for s, t in p.simulate_s_per_task.items():
            sim[s] = sim.get(s, 0.0) + n * t / max(1, jobs)
    return Estimate(
        num_tasks=sum(n for _, n in groups),
        calls=round(sum(n * p.calls_per_task for p, n in groups)),
        held_bytes=round(held),
        peak_bytes=round(held + sum(per_cell[: max(1, jobs)])),
        generate_s=sum(n * p.generate_s_per_task for p, n in groups),
        simulate_s=tuple(sim.items()),
    )


def check_run(
    spec: RunSpec, num_tasks: int, rate_per_s: float, *, forced: bool, say: Callable[[str], None]
) -> None:
    """Before a simulated run's workload is built (`experiment.plan_run`): above
    `ESTIMATE_ABOVE_TASKS` tasks, probe, tell the estimate through `say` and refuse a run too
    large for this machine (`check`). `rate_per_s` is one server's (a cluster's share)."""
    if num_tasks <= ESTIMATE_ABOVE_TASKS:
        return
    say(f"{num_tasks:,} tasks: estimating the run's size from a {PROBE_TASKS}-task probe")
    limit = memory_limit_bytes()
    args = (spec.workload, spec.workload_params, rate_per_s, spec.seed)
    setting = (spec.preset, spec.kv_budget_tokens)
    # the workload alone first: it is cheap to measure and may already be too large
    check(estimate_run(probe(*args, (), *setting), num_tasks), limit_bytes=limit, forced=forced)
    est = estimate_run(probe(*args, spec.schedulers, *setting, spec.scheduler_params), num_tasks)
    say(est.describe())
    check(est, limit_bytes=limit, forced=forced)


def memory_limit_bytes() -> int:
    """Half of this machine's physical memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):  # not a POSIX system that says
        return 8 * 2**30


def check(est: Estimate, *, limit_bytes: int, forced: bool, what: str = "run") -> None:
    """`TopasError` when the estimated peak memory exceeds `limit_bytes`, unless `forced`."""
    if est.peak_bytes > limit_bytes and not forced:
        raise TopasError(
            f"this {what} would need {'about' if est.simulated else 'at least'} "
            f"{gigabytes(est.peak_bytes)} of memory (limit {gigabytes(limit_bytes)}, half of "
            f"this machine's RAM) and at least {duration(est.total_s)}: {est.num_tasks:,} "
            f"tasks, {est.calls:,} calls; use fewer --tasks, or pass --allow-large to run it "
            "anyway"
        )


def _measured(fn: Callable[[], T]) -> tuple[T, int, int, float]:
    """`fn()`, the bytes it left allocated, its peak allocation and its wall time."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        base, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        t0 = time.perf_counter()
        result = fn()
        seconds = time.perf_counter() - t0
        now, peak = tracemalloc.get_traced_memory()
    finally:
        if started:
            tracemalloc.stop()
    return result, max(0, now - base), max(0, peak - base), seconds


def gigabytes(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.0f} MB"


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
