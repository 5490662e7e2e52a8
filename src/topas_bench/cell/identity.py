"""A cell's identity: what makes two runs the same cell, and the digests that name it.

A cell is one scheduler of a run plan (`plan.RunPlan`): the run's inputs, the engine and its
version, what the engine adds (`EngineOptions.engine_params`), and, for a plugin scheduler, its
distribution and version (`schedulers.plugins`). Its directory is built from the identity
(`RunIdentity.run_dir`), so a finished cell is found again; the workload sample it ran on is
named by `workload_digest`, which reuse checks too (`cell.stored`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from topas_bench.schedulers.registry import source

if TYPE_CHECKING:
    from topas_bench.plan import RunPlan
    from topas_bench.workloads.model import Workload


@dataclass(frozen=True)
class RunIdentity:
    workload: str
    num_tasks: int
    rate_per_s: float
    seed: int
    scheduler: str
    preset: str
    kv_budget_tokens: int
    engine: str = "sim"
    #: `runners.engines.Engine.version`: cells made by an older engine are never reused.
    engine_version: int = 0
    workload_params: Mapping[str, Any] = field(default_factory=dict)
    scheduler_params: Mapping[str, Any] = field(default_factory=dict)
    engine_params: Mapping[str, Any] = field(default_factory=dict)
    #: A plugin scheduler's distribution and version (`schedulers.plugins`): a changed plugin's
    #: cells are never reused as the old one's. Empty for a built-in, and then left out of the
    #: JSON, so built-in identities (and their digests) are what they were before plugins.
    scheduler_source: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("workload_params", "scheduler_params", "engine_params", "scheduler_source"):
            d[k] = dict(sorted(d[k].items()))
        if not d["scheduler_source"]:
            del d["scheduler_source"]
        return d

    @property
    def digest(self) -> str:
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:10]

    def run_dir(self, out: Path) -> Path:
        cell = (
            f"{self.engine}-{self.preset}-kv{self.kv_budget_tokens}"
            f"-r{self.rate_per_s:g}-n{self.num_tasks}-s{self.seed}-{self.digest}"
        )
        return out / self.workload / self.scheduler / cell


def cell_identity(plan: RunPlan, scheduler: str) -> RunIdentity:
    """The identity of `scheduler`'s cell of `plan`: the run's inputs, the engine and its
    version, and what the engine adds (`EngineOptions.engine_params`: simulator settings that
    differ from their defaults, a real server's model and arguments; a cluster's setting).
    A real server sizes its own KV pool when no budget is given: its cells record 0. A
    plugin scheduler's cells also record its distribution and version."""
    engine_params = plan.options.engine_params(plan.sim)
    if plan.cluster is not None:
        engine_params.update(plan.cluster.engine_params())
    own_budget = plan.options.real_server and plan.kv_budget_derived
    return RunIdentity(
        workload=plan.workload_name,
        num_tasks=plan.num_tasks,
        rate_per_s=plan.rate_per_s,
        seed=plan.seed,
        scheduler=scheduler,
        preset=plan.preset.name,
        kv_budget_tokens=0 if own_budget else plan.kv_budget_tokens,
        engine=plan.engine,
        engine_version=plan.options.version,
        workload_params=plan.identity_workload_params,
        scheduler_params=dict(plan.scheduler_params.get(scheduler, {})),
        engine_params=engine_params,
        scheduler_source=source(scheduler),
    )


def workload_digest(w: Workload) -> str:
    """The digest of a workload sample: of its trace text (`dumps_workload`)."""
    from topas_bench.workloads.trace import dumps_workload

    return trace_digest(dumps_workload(w))


def trace_digest(trace: str) -> str:
    """The digest of a workload's trace text (`dumps_workload`): `workload_digest` without
    serialising again when the text is at hand."""
    return hashlib.sha256(trace.encode()).hexdigest()[:16]
