"""`topas-bench tune`: search TOPAS's open parameters on tuning seeds.

Tuning seeds are kept apart from evaluation seeds (`EVAL_SEEDS`, used for the reported results):
a setting is chosen on one set of workload samples and judged on another.

The objective of a setting is, averaged over the tuning seeds, the mean of its mean JCT and p99
JCT each divided by the best baseline's on the same sample (so 0.8 = 20% better than the best
baseline on both). The search is coordinate descent over a grid: for each parameter in turn,
every value is tried with the others fixed and the best kept; `passes` rounds. Every cell is an
ordinary run (stored under `out`, so an interrupted tune resumes where it stopped).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.experiment import plan_run, run_cell
from topas_bench.schedulers.registry import BASELINES, SCHEDULERS, make_policy
from topas_bench.schedulers.topas import Topas

#: Seeds of the reported results; tuning must not use them.
EVAL_SEEDS = (0, 1, 2, 3, 4)
TUNING_SEEDS = (101, 102, 103)

DEFAULT_GRID: dict[str, tuple[Any, ...]] = {
    "preempt_margin_s": (2.0, 5.0, 10.0, 20.0, 40.0),
    "beta": (0.0, 0.25, 0.5, 1.0),
    "horizon_s": (None, 5.0, 10.0, 30.0),
    "srpt_exponent": (0.0, 0.5, 1.0, 2.0),
    "rho": (0.0, 0.5, 1.0, 2.0),
    "h_age_s": (120.0, 300.0, 600.0, 1200.0),
    "max_actions": (2, 4, 8, 16),
    "move_stall": (False, True),
    "starvation_factor": (0.0, 2.0, 4.0, 8.0),
}


@dataclass(frozen=True)
class TuneSpec:
    workload: str
    scheduler: str = "topas"
    num_tasks: int = 150
    seeds: tuple[int, ...] = TUNING_SEEDS
    load: float | None = None
    rate_per_s: float | None = None
    preset: str = "a100-qwen32b"
    kv_budget_tokens: int | None = None
    grid: Mapping[str, tuple[Any, ...]] = field(default_factory=lambda: dict(DEFAULT_GRID))
    passes: int = 1
    jobs: int = 2
    out: Path = Path("runs/tune")


@dataclass(frozen=True)
class Trial:
    params: dict[str, Any]
    objective: float
    mean_ratio: float
    p99_ratio: float


@dataclass(frozen=True)
class TuneResult:
    best: Trial
    default: Trial
    trials: list[Trial]
    baseline: dict[int, tuple[str, float, str, float]]  # seed -> (best-mean name, value, ...)


def _cell(args: tuple[TuneSpec, int, str, dict[str, Any]]) -> tuple[float, float]:
    spec, seed, scheduler, params = args
    plan = plan_run(
        workload=spec.workload, schedulers=[scheduler], num_tasks=spec.num_tasks, seed=seed,
        rate_per_s=spec.rate_per_s, load=spec.load, preset=spec.preset,
        kv_budget_tokens=spec.kv_budget_tokens, out=spec.out,
        scheduler_params={scheduler: params} if params else None,
    )  # fmt: skip
    s = run_cell(plan, scheduler).summary
    return s["mean_jct_s"], s["p99_jct_s"]


def check_spec(spec: TuneSpec) -> None:
    if set(spec.seeds) & set(EVAL_SEEDS):
        raise TopasError(
            f"tuning seeds {sorted(set(spec.seeds) & set(EVAL_SEEDS))} overlap the evaluation "
            f"seeds {list(EVAL_SEEDS)}; pick others"
        )
    if not issubclass(SCHEDULERS.get(spec.scheduler), Topas):
        variants = ", ".join(n for n in SCHEDULERS.names() if n.startswith("topas"))
        raise TopasError(f"tune searches TOPAS's parameters: -s must be one of {variants}")
    if not spec.seeds:
        raise TopasError("--seeds is empty")
    if spec.passes < 1 or spec.jobs < 1:
        raise TopasError("--passes and --jobs must be >= 1")
    for name, values in spec.grid.items():
        if not values:
            raise TopasError(f"--param {name} has no values")
        for v in values:
            make_policy(spec.scheduler, **{name: v})  # a bad name or value fails here, named


def tune(spec: TuneSpec, progress: Callable[[str], None] | None = None) -> TuneResult:
    check_spec(spec)
    say = progress or (lambda _msg: None)
    with ProcessPoolExecutor(spec.jobs) as pool:
        jobs: list[tuple[TuneSpec, int, str, dict[str, Any]]] = [
            (spec, seed, b, {}) for seed in spec.seeds for b in BASELINES
        ]
        results = dict(zip(((j[1], j[2]) for j in jobs), pool.map(_cell, jobs), strict=True))
        baseline: dict[int, tuple[str, float, str, float]] = {}
        for seed in spec.seeds:
            rows = {b: results[(seed, b)] for b in BASELINES}
            bm = min(rows, key=lambda b: (rows[b][0], b))
            bp = min(rows, key=lambda b: (rows[b][1], b))
            baseline[seed] = (bm, rows[bm][0], bp, rows[bp][1])
        say("best baselines: " + ", ".join(
            f"seed {s}: mean {v[0]} {v[1]:.1f}s, p99 {v[2]} {v[3]:.1f}s"
            for s, v in baseline.items()
        ))  # fmt: skip
        seen: dict[str, Trial] = {}

        defaults = make_policy(spec.scheduler).params

        def evaluate(batch: Sequence[dict[str, Any]]) -> list[Trial]:
            # A value equal to the default is the default: same run, same identity.
            batch = [{k: v for k, v in p.items() if defaults.get(k, object()) != v} for p in batch]
            batch = list({_key(p): p for p in batch}.values())
            todo = [p for p in batch if _key(p) not in seen]
            cells = [(spec, seed, spec.scheduler, p) for p in todo for seed in spec.seeds]
            got = list(pool.map(_cell, cells))
            for i, p in enumerate(todo):
                ms, ps = [], []
                for j, seed in enumerate(spec.seeds):
                    mean, p99 = got[i * len(spec.seeds) + j]
                    ms.append(mean / baseline[seed][1])
                    ps.append(p99 / baseline[seed][3])
                m, q = statistics.mean(ms), statistics.mean(ps)
                seen[_key(p)] = Trial(dict(p), (m + q) / 2, m, q)
                say(f"{_fmt(p) or 'defaults':<60} objective {(m + q) / 2:.4f}  "
                    f"mean x{m:.3f}  p99 x{q:.3f}")  # fmt: skip
            return [seen[_key(p)] for p in batch]

        current: dict[str, Any] = {}
        default = evaluate([current])[0]
        best = default
        for _ in range(spec.passes):
            for name, values in spec.grid.items():
                batch = [{**current, name: v} for v in values]
                for trial in evaluate(batch):
                    if trial.objective < best.objective - 1e-12:
                        best = trial
                current = dict(best.params)
    return TuneResult(best, default, list(seen.values()), baseline)


def _key(params: Mapping[str, Any]) -> str:
    return repr(sorted(params.items()))


def _fmt(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(params.items()))
