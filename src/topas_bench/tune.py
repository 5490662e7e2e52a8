"""`topas-bench tune`: search TOPAS's open parameters on tuning seeds, with Optuna.

Tuning seeds are kept apart from evaluation seeds (`EVAL_SEEDS`, used for the reported results):
a setting is chosen on one set of workload samples and judged on another.

The objective of a setting is, averaged over the tuning seeds, the mean of its mean JCT and p99
JCT each divided by the best baseline's on the same sample (so 0.8 = 20% better than the best
baseline on both). Each parameter takes one of its grid's values (`suggest_categorical`); the
study (TPE, seeded) lives in SQLite, ``OUT/tune.db``, named after everything that defines it,
so a rerun with the same settings resumes it and adds trials, and ``--jobs`` worker processes
share it. The first trial is the defaults. Every cell is an ordinary run stored under ``OUT``:
a setting tried twice costs nothing the second time.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.experiment import plan_run
from topas_bench.harness import run_cell
from topas_bench.schedulers.registry import BASELINES, SCHEDULERS, is_policy_class, make_policy
from topas_bench.schedulers.topas import Topas
from topas_bench.spec import RunSpec

#: Seeds of the reported results; tuning must not use them.
EVAL_SEEDS = (0, 1, 2, 3, 4)
TUNING_SEEDS = (101, 102, 103)

DEFAULT_GRID: dict[str, tuple[Any, ...]] = {
    "preempt_margin_s": (2.0, 5.0, 10.0, 20.0, 40.0),
    "beta": (0.0, 0.25, 0.5, 1.0),
    "horizon_s": (None, 5.0, 10.0, 30.0),
    "srpt_exponent": (0.0, 0.5, 1.0, 2.0),
    "rho": (0.0, 0.5, 1.0, 2.0),
    "h_age_mult": (0.5, 1.0, 2.0, 4.0),
    "max_actions": (2, 4, 8, 16),
    "move_charge": ("admitted", "affected", "running"),
    "reuse_users": ("next", "all"),
    "starvation_mult": (0.0, 2.0, 4.0, 8.0),
    "density": (False, True),
}
STUDY_FILE = "tune.db"


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
    trials: int = 30
    jobs: int = 2
    out: Path = Path("runs/tune")

    def study_name(self) -> str:
        """Everything that defines the study (not how many trials or workers run it)."""
        d = {k: v for k, v in asdict(self).items() if k not in ("trials", "jobs", "out")}
        blob = json.dumps(d, sort_keys=True, default=str)
        return f"{self.workload}-{self.scheduler}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


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
    study: str
    storage: str


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise TopasError("tune needs Optuna: pip install 'topas-bench[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _cell(args: tuple[TuneSpec, int, str, dict[str, Any]]) -> tuple[float, float]:
    spec, seed, scheduler, params = args
    run = RunSpec(
        workload=spec.workload, schedulers=(scheduler,), num_tasks=spec.num_tasks, seed=seed,
        rate_per_s=spec.rate_per_s, load=spec.load, preset=spec.preset,
        kv_budget_tokens=spec.kv_budget_tokens, out=spec.out,
        scheduler_params={scheduler: params} if params else {},
    )  # fmt: skip
    s = run_cell(plan_run(run), scheduler).summary
    return s["mean_jct_s"], s["p99_jct_s"]


def check_spec(spec: TuneSpec) -> None:
    if set(spec.seeds) & set(EVAL_SEEDS):
        raise TopasError(
            f"tuning seeds {sorted(set(spec.seeds) & set(EVAL_SEEDS))} overlap the evaluation "
            f"seeds {list(EVAL_SEEDS)}; pick others"
        )
    if not is_policy_class(spec.scheduler, Topas):
        variants = ", ".join(n for n in SCHEDULERS.names() if n.startswith("topas"))
        raise TopasError(f"tune searches TOPAS's parameters: -s must be one of {variants}")
    if not spec.seeds:
        raise TopasError("--seeds is empty")
    if spec.trials < 1 or spec.jobs < 1:
        raise TopasError("--trials and --jobs must be >= 1")
    for name, values in spec.grid.items():
        if not values:
            raise TopasError(f"--param {name} has no values")
        for v in values:
            if v is not None and not isinstance(v, bool | int | float | str):
                raise TopasError(f"--param {name}: {v!r} is not a number, string, bool or null")
            make_policy(spec.scheduler, **{name: v})  # a bad name or value fails here, named


def _strip_defaults(scheduler: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """A value equal to the default is the default: same run, same identity."""
    defaults = make_policy(scheduler).params
    return {k: v for k, v in params.items() if defaults.get(k, object()) != v}


def _baselines(spec: TuneSpec, jobs: int) -> dict[int, tuple[str, float, str, float]]:
    cells: list[tuple[TuneSpec, int, str, dict[str, Any]]] = [
        (spec, seed, b, {}) for seed in spec.seeds for b in BASELINES
    ]
    with ProcessPoolExecutor(jobs) as pool:
        got = dict(zip(((c[1], c[2]) for c in cells), pool.map(_cell, cells), strict=True))
    out = {}
    for seed in spec.seeds:
        rows = {b: got[(seed, b)] for b in BASELINES}
        bm = min(rows, key=lambda b: (rows[b][0], b))
        bp = min(rows, key=lambda b: (rows[b][1], b))
        out[seed] = (bm, rows[bm][0], bp, rows[bp][1])
    return out


def _work(
    spec: TuneSpec, storage: str, baseline: dict[int, tuple[str, float, str, float]],
    trials: int, worker: int,
) -> None:  # fmt: skip
    """One worker: `trials` trials of the shared study (its own sampler seed)."""
    optuna = _optuna()
    study = optuna.load_study(
        study_name=spec.study_name(), storage=storage,
        sampler=optuna.samplers.TPESampler(seed=worker),
    )  # fmt: skip
    names = list(spec.grid)

    def objective(trial: Any) -> float:
        choices = {n: trial.suggest_categorical(n, list(spec.grid[n])) for n in names}
        params = _strip_defaults(spec.scheduler, choices)
        ms, ps = [], []
        for seed in spec.seeds:
            mean, p99 = _cell((spec, seed, spec.scheduler, params))
            ms.append(mean / baseline[seed][1])
            ps.append(p99 / baseline[seed][3])
        m, q = statistics.mean(ms), statistics.mean(ps)
        trial.set_user_attr("mean_ratio", m)
        trial.set_user_attr("p99_ratio", q)
        trial.set_user_attr("params", params)
        return (m + q) / 2

    study.optimize(objective, n_trials=trials)


def tune(spec: TuneSpec, progress: Callable[[str], None] | None = None) -> TuneResult:
    check_spec(spec)
    optuna = _optuna()
    say = progress or (lambda _msg: None)
    spec.out.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{(spec.out / STUDY_FILE).resolve()}"
    baseline = _baselines(spec, spec.jobs)
    say("best baselines: " + ", ".join(
        f"seed {s}: mean {v[0]} {v[1]:.1f}s, p99 {v[2]} {v[3]:.1f}s" for s, v in baseline.items()
    ))  # fmt: skip
    study = optuna.create_study(study_name=spec.study_name(), storage=storage,
                                direction="minimize", load_if_exists=True)  # fmt: skip
    defaults = make_policy(spec.scheduler).params
    before = len(study.trials)
    left = spec.trials
    if not study.trials:  # a new study starts from the defaults, run here before any worker
        start = {n: defaults[n] for n in spec.grid if defaults.get(n) in spec.grid[n]}
        study.enqueue_trial(start, skip_if_exists=True)
        _work(spec, storage, baseline, 1, 0)
        left -= 1
    shares = [left // spec.jobs + (i < left % spec.jobs) for i in range(spec.jobs)]
    if spec.jobs == 1:
        if left:
            _work(spec, storage, baseline, left, before + 1)
    else:
        with ProcessPoolExecutor(spec.jobs) as pool:
            for f in [pool.submit(_work, spec, storage, baseline, n, i + before)
                      for i, n in enumerate(shares) if n]:  # fmt: skip
                f.result()
    study = optuna.load_study(study_name=spec.study_name(), storage=storage)
    trials = [_trial(t) for t in study.trials if t.state.name == "COMPLETE"]
    for t in trials[before:]:
        say(f"{_fmt(t.params) or 'defaults':<60} objective {t.objective:.4f}  "
            f"mean x{t.mean_ratio:.3f}  p99 x{t.p99_ratio:.3f}")  # fmt: skip
    default = next((t for t in trials if not t.params), None)
    if default is None:  # the grid cannot express the defaults: evaluate them apart
        ms = [_cell((spec, s, spec.scheduler, {})) for s in spec.seeds]
        m = statistics.mean(a / baseline[s][1] for (a, _), s in zip(ms, spec.seeds, strict=True))
        q = statistics.mean(b / baseline[s][3] for (_, b), s in zip(ms, spec.seeds, strict=True))
        default = Trial({}, (m + q) / 2, m, q)
    best = min(trials, key=lambda t: t.objective)
    return TuneResult(best, default, trials, baseline, spec.study_name(), storage)


def _trial(t: Any) -> Trial:
    a = t.user_attrs
    return Trial(dict(a["params"]), float(t.value), float(a["mean_ratio"]), float(a["p99_ratio"]))


def plots(result: TuneResult, out: Path) -> list[Path]:
    """Optuna's optimisation history and parameter importances (matplotlib), PNG and SVG."""
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
            path = out / f"{name}.{ext}"
            fig.savefig(path, dpi=110, bbox_inches="tight")
            written.append(path)
        plt.close(fig)
    return written


def _fmt(params: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(params.items()))
