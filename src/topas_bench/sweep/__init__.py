"""Sweeps over schedulers x workloads x loads x seeds x presets x KV budgets (see `spec`, `run`)."""

from topas_bench.progress import Progress
from topas_bench.sweep.run import CellOutcome, SweepResult, run_sweep
from topas_bench.sweep.spec import SweepSpec, load_specs, parse_list, read_toml

__all__ = [
    "CellOutcome",
    "Progress",
    "SweepResult",
    "SweepSpec",
    "load_specs",
    "parse_list",
    "read_toml",
    "run_sweep",
]
