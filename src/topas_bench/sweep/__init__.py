"""Sweeps over schedulers x workloads x loads x seeds x presets x KV budgets (see `spec`, `run`)."""

from topas_bench.sweep.run import CellOutcome, Progress, SweepResult, run_sweep
from topas_bench.sweep.spec import Group, SweepSpec, load_specs, parse_list, read_toml

__all__ = [
    "CellOutcome",
    "Group",
    "Progress",
    "SweepResult",
    "SweepSpec",
    "load_specs",
    "parse_list",
    "read_toml",
    "run_sweep",
]
