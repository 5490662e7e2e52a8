"""Tuning: every tunable scheduler searched with one budget (`search`, as `spec` defines it),
over the grids declared in `grids`; the results go to a tuned file (`topas_bench.tuned`),
which sweeps run beside the defaults. docs/topas.md, "Tuning every scheduler"."""

from topas_bench.tune.grids import GRIDS, TOPAS_GRID, grid_for, tunable
from topas_bench.tune.search import plots, tune
from topas_bench.tune.spec import (
    EVAL_SEEDS,
    PAPER_WORKLOADS,
    STUDY_FILE,
    TUNED_FILE,
    TUNING_SEEDS,
    Trial,
    TuneResult,
    TuneSpec,
)
from topas_bench.tuned import TunedSet, load_tuned

#: TOPAS's grid under its former name.
DEFAULT_GRID = TOPAS_GRID

__all__ = [
    "DEFAULT_GRID", "EVAL_SEEDS", "GRIDS", "PAPER_WORKLOADS", "STUDY_FILE", "TOPAS_GRID",
    "TUNED_FILE", "TUNING_SEEDS", "Trial", "TuneResult", "TuneSpec", "TunedSet", "grid_for",
    "load_tuned", "plots", "tunable", "tune",
]  # fmt: skip
