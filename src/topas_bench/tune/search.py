"""`topas-bench tune`: search each scheduler's grid on tuning seeds, all with one budget.

Tuning seeds are kept apart from evaluation seeds (`EVAL_SEEDS`, those of the reported results):
a setting is chosen on one set of workload samples and judged on another.

The regime is the paper-regime sweep's: every workload at `load` x the best saturation rate of
`load_reference` (the paper's five baselines by default), measured once and kept in
``OUT/capacity.json`` by the sweep's machinery, the preset's derived KV budget unless given.
Every cell is an ordinary run stored under ``OUT``, exactly the cell `topas-bench sweep` would
write for that scheduler and setting: a setting tried twice costs nothing the second time.

The objective of a setting (`tuned.OBJECTIVE`): over every (workload, tuning seed) sample, its
mean JCT and its p99 JCT each divided by the best default baseline's on the same sample,
averaged; the objective is the mean of the two (0.8 = 20% better than the best baseline).

Budget parity: every scheduler gets `trials` distinct settings on the same workloads, seeds,
tasks, load and objective; a grid of at most `trials` distinct policies is enumerated whole
instead (each point once). A study starts from the defaults, then samples the grid with TPE
(seeded), one trial after the other, each trial's cells on ``jobs`` worker processes; it lives
in SQLite, ``OUT/tune.db``, named after everything that defines it, so the same command
resumes it up to its budget (more `trials` add to it).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.experiment import plan_run
from topas_bench.harness import run_cells
from topas_bench.progress import Progress
from topas_bench.schedulers.registry import BASELINES, make_policy
from topas_bench.spec import RunSpec
from topas_bench.sweep.executors import Executor, make_executor
from topas_bench.sweep.run import CAPACITY_FILE, read_capacities, reference_capacity, run_sweep
from topas_bench.tune.grids import Grid, canonical, key, points, size, strip_defaults
from topas_bench.tune.spec import STUDY_FILE, TUNED_FILE, Best, Trial, TuneResult, TuneSpec
from topas_bench.tuned import TunedSet, load_tuned, write_tuned


@dataclass(frozen=True)
class Regime:
    """What every trial's cells need from the parent: each workload's reference saturation
    rate and each sample's best default baseline."""

    capacities: Mapping[str, float]
    best: Best


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise TopasError("tune needs Optuna: pip install 'topas-bench[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _run(spec: TuneSpec, workload: str, seed: int, schedulers: tuple[str, ...],
         params: Mapping[str, Mapping[str, Any]]) -> RunSpec:  # fmt: skip
    return RunSpec(
        workload=workload, schedulers=schedulers, num_tasks=spec.num_tasks, seed=seed,
        load=spec.load, load_reference=spec.load_reference, preset=spec.preset,
        kv_budget_tokens=spec.kv_budget_tokens, scheduler_params=params, out=spec.out,
    )  # fmt: skip


#: A trial's cell: the spec, the workload's reference capacity, workload, seed, scheduler, params.
CellJob = tuple[TuneSpec, float, str, int, str, Mapping[str, Any]]


def _cell(job: CellJob) -> tuple[str, int, float, float, float]:
    """One cell's (workload, seed, mean JCT, p99 JCT, CPU seconds); a worker's entry point."""
    spec, capacity, workload, seed, scheduler, params = job
    started = time.process_time()
    run = _run(spec, workload, seed, (scheduler,), {scheduler: params} if params else {})
    s = run_cells(plan_run(run, capacity_tps=capacity), [scheduler])[0].summary
    return workload, seed, s["mean_jct_s"], s["p99_jct_s"], time.process_time() - started


def _score(
    spec: TuneSpec, regime: Regime, ex: Executor, scheduler: str, params: Mapping[str, Any]
) -> Trial:
    """`params` on every (workload, seed) sample, against the best default baselines."""
    started = time.monotonic()
    jobs = [(spec, regime.capacities[w], w, seed, scheduler, dict(params))
            for w in spec.workloads for seed in spec.seeds]  # fmt: skip
    got: dict[tuple[str, int], tuple[float, float]] = {}
    cpu = 0.0
    for w, seed, mean, p99, cpu_s in ex.imap_unordered(_cell, jobs):
        got[(w, seed)] = (mean, p99)
        cpu += cpu_s
    ms = [got[k][0] / regime.best[k][0] for k in sorted(got)]
    ps = [got[k][1] / regime.best[k][1] for k in sorted(got)]
    m, q = statistics.mean(ms), statistics.mean(ps)
    return Trial(dict(params), (m + q) / 2, m, q, wall_s=time.monotonic() - started, cpu_s=cpu)


def prepare(spec: TuneSpec, progress: Progress | None = None) -> Regime:
    """Measure the reference saturation rates and run the baselines at their defaults (a
    sweep into OUT, resumable), then read each sample's best baseline."""
    result = run_sweep([spec.sweep(BASELINES)], spec.out, jobs=spec.jobs, progress=progress)
    if result.failed:
        c = result.failed[0]
        raise TopasError(f"a baseline failed: {c.workload}/{c.scheduler} seed {c.seed}: {c.error}")
    caps = read_capacities(spec.out / CAPACITY_FILE)
    capacities: dict[str, float] = {}
    best: Best = {}
    for w in spec.workloads:
        for seed in spec.seeds:
            run = _run(spec, w, seed, BASELINES, {})
            capacities[w] = reference_capacity(run, caps)
            cells = run_cells(plan_run(run, capacity_tps=capacities[w]), list(BASELINES))
            best[(w, seed)] = (min(c.summary["mean_jct_s"] for c in cells),
                               min(c.summary["p99_jct_s"] for c in cells))  # fmt: skip
    return Regime(capacities, best)


def tune_one(
    spec: TuneSpec, scheduler: str, regime: Regime, ex: Executor,
    progress: Progress | None = None,
) -> TuneResult:  # fmt: skip
    """`scheduler`'s study, run up to its budget: min(trials, grid points) distinct settings,
    one trial after the other (TPE sees every result before it samples again), each trial's
    cells on `ex`. A setting sampled again is told its known objective and not counted."""
    optuna = _optuna()
    progress = progress or Progress()
    storage = f"sqlite:///{(spec.out / STUDY_FILE).resolve()}"
    name, grid = spec.study_name(scheduler), spec.grid(scheduler)
    study = optuna.create_study(study_name=name, storage=storage, direction="minimize",
                                load_if_exists=True)  # fmt: skip
    study.sampler = optuna.samplers.TPESampler(seed=len(study.trials))  # resumed: new draws
    base = make_policy(scheduler).params
    states = optuna.trial.TrialState
    seen: dict[str, Trial] = {}  # a setting's first complete trial
    for t in study.get_trials(deepcopy=False, states=(states.COMPLETE,)):
        seen.setdefault(key(canonical(scheduler, t.params, base)), _trial(t))
    n_points = size(scheduler, grid)
    target = min(spec.trials, n_points)
    queued = {key(canonical(scheduler, t.params, base))
              for t in study.get_trials(deepcopy=False, states=(states.WAITING,))}  # fmt: skip
    if n_points <= spec.trials:  # enumerate the grid: each point once
        for p in points(scheduler, grid):
            if key(p) not in seen and key(p) not in queued:
                study.enqueue_trial(p)
    elif not seen and not queued and all(base.get(k, object()) in v for k, v in grid.items()):
        study.enqueue_trial({k: base[k] for k in grid})  # the defaults first
    progress.phase(scheduler, target)
    progress.update(scheduler, len(seen), "resumed" if seen else "")
    rng = random.Random(len(study.trials))
    repeats = 0
    while len(seen) < target:
        trial = study.ask()
        raw = {n: trial.suggest_categorical(n, list(grid[n])) for n in grid}
        k = key(canonical(scheduler, raw, base))
        if k in seen:  # TPE sampled a setting again: its result is known
            known = seen[k]
            _tell(study, trial, replace(known, wall_s=0.0, cpu_s=0.0))
            repeats += 1
            if repeats >= MAX_REPEATS:  # TPE is stuck in a corner: try an unseen point
                study.enqueue_trial(_unseen(scheduler, grid, set(seen), base, rng))
                repeats = 0
            continue
        params = strip_defaults(scheduler, canonical(scheduler, raw, base))
        seen[k] = _tell(study, trial, _score(spec, regime, ex, scheduler, params))
        progress.update(scheduler, len(seen), json.dumps(params) if params else "defaults")
    progress.end(scheduler)
    trials = sorted(seen.values(), key=lambda t: t.number)
    default = next((t for t in trials if not t.params), None)
    if default is None:  # the grid cannot express the defaults: evaluate them apart
        default = _score(spec, regime, ex, scheduler, {})
    # the lowest objective; on a tie the defaults, then the earlier trial
    best = min([default, *trials], key=lambda t: (t.objective, bool(t.params), t.number))
    return TuneResult(scheduler, best, default, trials, n_points, name, storage)


#: Repeated samples in a row after which an unseen point is tried instead.
MAX_REPEATS = 10


def _tell(study: Any, trial: Any, t: Trial) -> Trial:
    trial.set_user_attr("mean_ratio", t.mean_ratio)
    trial.set_user_attr("p99_ratio", t.p99_ratio)
    trial.set_user_attr("params", t.params)
    trial.set_user_attr("wall_s", t.wall_s)
    trial.set_user_attr("cpu_s", t.cpu_s)
    study.tell(trial, t.objective)
    return replace(t, number=trial.number)


def _unseen(
    scheduler: str, grid: Grid, seen: set[str], base: Mapping[str, Any], rng: random.Random
) -> dict[str, Any]:
    """A point of `grid` no trial has (there is one: fewer were tried than it has)."""
    while True:
        p = canonical(scheduler, {k: rng.choice(v) for k, v in grid.items()}, base)
        if key(p) not in seen:
            return p


def _trial(t: Any) -> Trial:
    a = t.user_attrs
    return Trial(dict(a["params"]), float(t.value), float(a["mean_ratio"]),
                 float(a["p99_ratio"]), t.number, float(a.get("wall_s", 0.0)),
                 float(a.get("cpu_s", 0.0)))  # fmt: skip


def tune(
    spec: TuneSpec,
    progress: Progress | None = None,
    on_result: Callable[[TuneResult], None] | None = None,
) -> tuple[list[TuneResult], TunedSet]:
    """Tune every scheduler of `spec` in turn with the same budget, merging each result into
    ``OUT/tuned.toml`` as it comes (a file of another budget is refused before anything
    runs); `on_result` sees each scheduler's result."""
    _optuna()
    spec.out.mkdir(parents=True, exist_ok=True)
    path = spec.out / TUNED_FILE
    tuned = TunedSet(spec.budget(), {}, str(path))
    if path.exists():
        tuned = load_tuned(path).merged(tuned)  # the same budget, or a clear error
    regime = prepare(spec, progress)
    results = []
    ex = make_executor("local", spec.jobs, None)
    try:
        for scheduler in spec.schedulers:
            result = tune_one(spec, scheduler, regime, ex, progress)
            results.append(result)
            entry = result.entry(spec.grid(scheduler))
            tuned = tuned.merged(TunedSet(tuned.budget, {scheduler: entry}))
            write_tuned(path, tuned)
            if on_result is not None:
                on_result(result)
    finally:
        ex.close()
    return results, tuned


def plots(result: TuneResult, out: Path) -> list[Path]:
    """Optuna's optimisation history and parameter importances (matplotlib), PNG and SVG."""
    import warnings

    optuna = _optuna()
    from optuna.visualization import matplotlib as vis

    from topas_bench.analysis.figures import pyplot

    plt = pyplot()
    study = optuna.load_study(study_name=result.study, storage=result.storage)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    drawn: list[tuple[str, Callable[[Any], Any]]] = [("history", vis.plot_optimization_history)]
    if len({tuple(sorted(t.params.items())) for t in study.trials}) > 2:
        drawn.append(("importances", vis.plot_param_importances))
    for name, draw in drawn:
        with warnings.catch_warnings():  # Optuna's notes on tiny studies, not our problem
            warnings.simplefilter("ignore")
            fig: Any = draw(study).figure
        for ext in ("png", "svg"):
            p = out / f"{name}.{ext}"
            fig.savefig(p, dpi=110, bbox_inches="tight")
            written.append(p)
        plt.close(fig)
    return written
