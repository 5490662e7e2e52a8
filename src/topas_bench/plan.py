"""The types every engine and the harness share: a run plan (what to run), the server contract.

They live below the engines (docs/design.md, "The seams"): an engine (`Server`) serves a plan's
workload under each policy it is handed and returns the tables (`Served`); the harness
(`harness.py`) owns everything else about a cell: the unloaded JCT and the summary, and, through
the `cell` package, its identity, reuse and writing. `experiment.plan_run` builds plans from a
`spec.RunSpec`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pandas as pd

from topas_bench.runners.cluster.config import ClusterConfig
from topas_bench.runners.sim.config import SimConfig, SimOptions
from topas_bench.runners.sim.cost import Preset
from topas_bench.spec import EngineOptions, RunSpec
from topas_bench.workloads.lengths import identity_params
from topas_bench.workloads.model import Workload


@dataclass(frozen=True)
class RunPlan:
    """One workload sample, several schedulers, one engine setting (`experiment.plan_run`)."""

    workload: Workload
    workload_name: str
    workload_params: Mapping[str, Any]
    schedulers: tuple[str, ...]
    scheduler_params: Mapping[str, Mapping[str, Any]]
    num_tasks: int
    seed: int
    rate_per_s: float
    load: float | None
    capacity_tps: float | None
    preset: Preset
    kv_budget_tokens: int
    kv_budget_derived: bool
    sim: SimConfig
    out: Path
    #: The engine and its own settings (`spec.RunSpec.engine`).
    options: EngineOptions = field(default_factory=SimOptions)
    #: N replicas behind a router (`--replicas`, `--router`); None: one server.
    cluster: ClusterConfig | None = None
    #: The schedulers whose best saturation rate `load` is a fraction of (`units`).
    load_reference: tuple[str, ...] = ("fcfs",)

    @property
    def engine(self) -> str:
        """`runners.engines.ENGINES` name: `sim`, `sglang-cpu` or `sglang`."""
        return self.options.engine

    @property
    def identity_workload_params(self) -> dict[str, Any]:
        """The workload parameters a cell's identity records: those given, with the length
        setting (`workloads.lengths`) as the workload was generated, named unless it is the
        one cells made before the setting existed used (so those keep their identities)."""
        return identity_params(self.workload_name, self.workload_params, self.workload.params)


@dataclass(frozen=True)
class Cell:
    """One policy an engine is asked to serve the plan's workload under.

    run_dir: the cell's directory; an engine may keep files of its own there while it serves
        (a real server's journal and logs), never the result files, which the harness writes.
    fresh: start afresh, forgetting what such files hold (`--force`, or a stale result).
    """

    scheduler: str
    params: Mapping[str, Any]
    run_dir: Path
    fresh: bool = False


@dataclass(frozen=True)
class Served:
    """What an engine returns for one cell: the record tables (`results.TABLES`, the columns
    of `runners.records`), the counters the summary reads, simulated (or measured) and wall
    seconds, and what else the cell records: `info` (more `run.json` fields), `extra`
    (`cell.stored.CellResult.extra`). `failed` (an error message) marks a partial result: its
    tables are kept in the cell's directory without `run.json`, and the error is raised."""

    tables: dict[str, pd.DataFrame]
    counters: dict[str, float]
    sim_time_s: float
    wall_s: float
    info: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    failed: str | None = None


#: (index into the cells being served, tasks done in that cell)
CellProgress = Callable[[int, int], None]


def cell_progress(progress: CellProgress | None, index: int) -> Callable[[int], None] | None:
    """The `index`-th cell's task counter of `progress` (None: nobody is counting)."""
    if progress is None:
        return None
    return lambda done: progress(index, done)


class Server(Protocol):
    """An engine behind the harness: the system under test (MLPerf LoadGen's SUT boundary).

    `prepare` checks what would stop the engine before anything runs (its venv, the model,
    interpreters) and fills in what it defaults, returning the spec to plan. `serve` serves
    `plan.workload` under each cell's policy, in order, on the plan's settings, and yields each
    cell's tables as it is done; an engine may serve several cells in one go (the reference
    engine pays SGLang's import once per plan). It never writes the result files, computes a
    summary or decides whether a cell is reused: the harness does.
    """

    def prepare(self, spec: RunSpec) -> RunSpec: ...

    def serve(
        self, plan: RunPlan, cells: Sequence[Cell], progress: CellProgress | None
    ) -> Iterator[Served]: ...
