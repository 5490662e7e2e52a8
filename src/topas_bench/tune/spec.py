"""What a tuning campaign is (`TuneSpec`: the schedulers, each tuned in turn with one budget)
and what it yields (`Trial`, `TuneResult`). `search` runs it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.runners.sim.cost import load_preset
from topas_bench.schedulers.registry import BASELINES, make_policy
from topas_bench.spec import DEFAULT_PRESET
from topas_bench.sweep.spec import SweepSpec
from topas_bench.tune.grids import Grid, grid_for
from topas_bench.tuned import Budget, Score, Tuned

#: Seeds of the reported results; tuning must not use them.
EVAL_SEEDS = tuple(range(10))
TUNING_SEEDS = (101, 102, 103)
#: The paper's five workloads.
PAPER_WORKLOADS = ("chain3", "dag4", "dag10-wide", "metagpt-sop", "metagpt-tl")
STUDY_FILE = "tune.db"
TUNED_FILE = "tuned.toml"

#: (workload, seed) -> (the best default baseline's mean JCT, its p99 JCT), each the lowest
Best = dict[tuple[str, int], tuple[float, float]]


@dataclass(frozen=True)
class TuneSpec:
    """A tuning campaign: the schedulers, each tuned in turn with the same budget.

    grids: a scheduler's grid in place of its `GRIDS` entry (`--param`)."""

    schedulers: tuple[str, ...] = ("topas",)
    workloads: tuple[str, ...] = PAPER_WORKLOADS
    num_tasks: int = 80
    seeds: tuple[int, ...] = TUNING_SEEDS
    load: float = 0.8
    load_reference: tuple[str, ...] = BASELINES
    preset: str = DEFAULT_PRESET
    kv_budget_tokens: int | None = None
    grids: Mapping[str, Grid] = field(default_factory=dict)
    trials: int = 30
    jobs: int = 2
    out: Path = Path("runs/tune")

    def __post_init__(self) -> None:
        overlap = sorted(set(self.seeds) & set(EVAL_SEEDS))
        if overlap:
            raise TopasError(
                f"tuning seeds {overlap} overlap the evaluation seeds {EVAL_SEEDS[0]}-"
                f"{EVAL_SEEDS[-1]}; pick others (default {TUNING_SEEDS[0]}-{TUNING_SEEDS[-1]})"
            )
        for name in ("schedulers", "workloads", "seeds", "load_reference"):
            values = getattr(self, name)
            if not values:
                raise TopasError(f"tune: no {name}")
            if len(set(values)) != len(values):
                raise TopasError(f"tune: {name} lists a value twice: {list(values)}")
        if self.trials < 1 or self.jobs < 1 or self.num_tasks < 1:
            raise TopasError("--trials, --jobs and --tasks must be >= 1")
        if not self.load > 0:
            raise TopasError(f"--load must be a positive number, got {self.load}")
        for name in self.schedulers:
            grid_for(name)  # tunable, or the list of those that are
        for name, grid in self.grids.items():
            if name not in self.schedulers:
                raise TopasError(f"--param for {name}, which is not tuned here")
            for param, values in grid.items():
                if not values:
                    raise TopasError(f"--param {param} has no values")
                for v in values:
                    if v is not None and not isinstance(v, bool | int | float | str):
                        raise TopasError(f"--param {param}: {v!r} is not a number, string, "
                                         "bool or null")  # fmt: skip
                    make_policy(name, **{param: v})  # a bad name or value fails here, named

    def grid(self, scheduler: str) -> Grid:
        return self.grids.get(scheduler) or grid_for(scheduler)

    def study_name(self, scheduler: str) -> str:
        """Everything that defines `scheduler`'s study (not how many trials or workers)."""
        d = {k: v for k, v in asdict(self).items()
             if k not in ("schedulers", "grids", "trials", "jobs", "out")}  # fmt: skip
        d |= {"scheduler": scheduler, "grid": self.grid(scheduler)}
        blob = json.dumps(d, sort_keys=True, default=str)
        return f"{scheduler}-{hashlib.sha256(blob.encode()).hexdigest()[:10]}"

    def budget(self) -> Budget:
        kv = self.kv_budget_tokens
        tokens = kv if kv is not None else load_preset(self.preset).derived_kv_budget_tokens
        return Budget(
            trials=self.trials, seeds=self.seeds, workloads=self.workloads, tasks=self.num_tasks,
            load=self.load, load_reference=self.load_reference, preset=self.preset,
            kv_budget_tokens=tokens, kv_budget_derived=kv is None,
        )  # fmt: skip

    def sweep(self, schedulers: tuple[str, ...]) -> SweepSpec:
        """The sweep of `schedulers` (at their defaults) in this regime."""
        return SweepSpec(
            workloads=self.workloads, schedulers=schedulers, seeds=self.seeds,
            loads=(self.load,), presets=(self.preset,), kv_budgets=(self.kv_budget_tokens,),
            num_tasks=self.num_tasks, load_reference=self.load_reference,
        )  # fmt: skip


@dataclass(frozen=True)
class Trial:
    params: dict[str, Any]
    objective: float
    mean_ratio: float
    p99_ratio: float
    number: int = -1  # the study's trial number (-1: not a trial of the study)
    wall_s: float = 0.0  # what running its cells took (0: all were stored already)
    cpu_s: float = 0.0  # the CPU time its cells took, summed over the processes

    @property
    def score(self) -> Score:
        return Score(self.objective, self.mean_ratio, self.p99_ratio)


@dataclass(frozen=True)
class TuneResult:
    scheduler: str
    best: Trial
    default: Trial
    trials: list[Trial]
    grid_points: int
    study: str
    storage: str

    def entry(self, grid: Grid) -> Tuned:
        return Tuned(
            scheduler=self.scheduler, params=self.best.params, default=self.default.score,
            tuned=self.best.score, trials=len(self.trials), grid_points=self.grid_points,
            grid=dict(grid), study=self.study,
        )  # fmt: skip
