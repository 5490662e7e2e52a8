"""The types every engine shares: a run plan, a cell's result, and reuse of stored cells.

They live below the engines (docs/design.md, "The seams": plan, identity and cell-result types
sit under the engines, so no engine imports the experiment layer); `experiment` builds plans and
picks an engine by name (`runners.engines.ENGINES`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topas_bench.results import RunIdentity, read_meta, reusable
from topas_bench.runners.cluster.config import ClusterConfig
from topas_bench.runners.engines import engine_version
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import Preset
from topas_bench.workloads.lengths import identity_params
from topas_bench.workloads.model import Workload

#: SimConfig fields that enter a run's identity when they differ from their defaults.
ENGINE_PARAM_FIELDS = (
    "host_tier_tokens", "length_hint", "chunked_prefill_size", "max_prefill_tokens",
    "max_running_requests", "context_length",
)  # fmt: skip


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
    #: `runners.engines.ENGINES` name: `sim`, `sglang-cpu` or `sglang`.
    engine: str = "sim"
    #: `runners.sglang.runner.SglangOptions` when the engine is a real SGLang server.
    sglang: Any = None
    #: N replicas behind a router (`--replicas`, `--router`); None: one server.
    cluster: ClusterConfig | None = None

    @property
    def identity_workload_params(self) -> dict[str, Any]:
        """The workload parameters a cell's identity records: those given, with the length
        setting (`workloads.lengths`) as the workload was generated, named unless it is the
        one cells made before the setting existed used (so those keep their identities)."""
        return identity_params(self.workload_name, self.workload_params, self.workload.params)

    def identity(self, scheduler: str) -> RunIdentity:
        """The identity of a `sim` or `sglang-cpu` cell (a real server's has its own)."""
        defaults = SimConfig(kv_budget_tokens=self.kv_budget_tokens)
        engine_params = {
            k: getattr(self.sim, k)
            for k in ENGINE_PARAM_FIELDS
            if getattr(self.sim, k) != getattr(defaults, k)
        }
        if self.cluster is not None:
            engine_params.update(self.cluster.engine_params())
        return RunIdentity(
            workload=self.workload_name,
            num_tasks=self.num_tasks,
            rate_per_s=self.rate_per_s,
            seed=self.seed,
            scheduler=scheduler,
            preset=self.preset.name,
            kv_budget_tokens=self.kv_budget_tokens,
            engine=self.engine,
            engine_version=engine_version(self.engine),
            workload_params=self.identity_workload_params,
            scheduler_params=dict(self.scheduler_params.get(scheduler, {})),
            engine_params=engine_params,
        )


@dataclass(frozen=True)
class CellResult:
    scheduler: str
    run_dir: Path
    summary: dict[str, float]
    sim_time_s: float
    wall_s: float
    cached: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def stored_cell(scheduler: str, run_dir: Path, digest: str) -> CellResult | None:
    """The stored result in `run_dir` if it is a finished run of the same workload sample
    (`results.reusable`), else None."""
    if not reusable(run_dir, digest):
        return None
    meta = read_meta(run_dir)
    return CellResult(
        scheduler, run_dir, meta["summary"], meta["sim_time_s"], meta["wall_s"], cached=True
    )


def workload_digest(w: Workload) -> str:
    from topas_bench.workloads.trace import dumps_workload

    return trace_digest(dumps_workload(w))


def trace_digest(trace: str) -> str:
    """The digest of a workload's trace text (`dumps_workload`): `workload_digest` without
    serialising again when the text is at hand."""
    return hashlib.sha256(trace.encode()).hexdigest()[:16]
