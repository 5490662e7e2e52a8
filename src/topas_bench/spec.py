"""A run's specification: what `run` runs, what a `sweep` runs per group, what `plan_run` plans.

`RunSpec` is frozen and checked when it is built (no I/O there: a workload's name and
parameters, and a preset, are resolved by the planner, which reads files). Units are in the
names. Engine-specific settings are the engine's own frozen value (`engine`: `SimOptions`,
`ReferenceOptions`, `SglangOptions`), which refuses what its engine cannot do.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.runners.cluster.config import ClusterConfig
from topas_bench.runners.sglang.options import SglangOptions
from topas_bench.runners.sglang_cpu.options import ReferenceOptions
from topas_bench.runners.sim.config import SimOptions
from topas_bench.schedulers.plugins import GROUP as PLUGIN_GROUP
from topas_bench.schedulers.registry import (
    ABLATIONS,
    BASELINES,
    PEERS,
    PEERS_2026,
    SCHEDULERS,
    SGLANG_STOCK,
    make_policy,
)
from topas_bench.workloads.trace.parse import MAX_TOKENS

#: An engine's own settings (`runners.engines.Engine.options`).
EngineOptions = SimOptions | ReferenceOptions | SglangOptions
DEFAULT_PRESET = "a100-qwen32b"
#: What a load is a fraction of by default: FCFS's saturation rate (its measured capacity).
DEFAULT_LOAD_REFERENCE: tuple[str, ...] = ("fcfs",)

#: Named groups accepted by `--scheduler`.
GROUPS: dict[str, tuple[str, ...]] = {
    "paper": (*BASELINES, "topas"),
    "peers": PEERS,
    "all": (*BASELINES, "topas", *PEERS),
    "baselines": BASELINES,
    "sglang": ("fcfs", "lpm", *SGLANG_STOCK),
    "ablations": ("topas", *ABLATIONS),
    "peers-2026": PEERS_2026,
}


def parse_schedulers(spec: str) -> tuple[str, ...]:
    """Comma-separated scheduler names and groups (`paper` = the paper's five baselines +
    topas, `peers` = the schedulers the paper left out, `all` = both, `baselines`, `sglang` =
    stock SGLang's policies, `ablations`, `peers-2026` = the agent-aware schedulers of
    2025-26, `everything` = every built-in policy, `plugins` = the schedulers installed
    packages declare, `schedulers.plugins`), e.g. `paper,topas-base`. No group but `plugins`
    takes a plugin: what is installed never changes what a committed sweep's group runs."""
    names: list[str] = []
    explicit: set[str] = set()
    for item in (n.strip() for n in spec.split(",")):
        if not item:
            continue
        if item == "everything":
            names += SCHEDULERS.builtin_names()
        elif item == "plugins":
            if not SCHEDULERS.plugin_names():
                raise TopasError(
                    f"--scheduler plugins: no installed package declares a scheduler (entry-point "
                    f"group {PLUGIN_GROUP})"
                )
            names += SCHEDULERS.plugin_names()
        elif item in GROUPS:
            names += GROUPS[item]
        else:
            SCHEDULERS.get(item)  # raises with the known names
            if item in explicit:
                raise TopasError(f"--scheduler lists a name twice: {spec}")
            explicit.add(item)
            names.append(item)
    if not names:
        raise TopasError("--scheduler is empty; give `all` or a comma-separated list")
    return tuple(dict.fromkeys(names))  # a group may overlap a name or another group


@dataclass(frozen=True)
class RunSpec:
    """One workload sample served by several schedulers on one engine setting.

    workload: a registered name or a trace file; workload_params override its generator's.
    schedulers: registered names (`parse_schedulers` expands groups); scheduler_params: per
        name, checked by building each policy once here.
    num_tasks: None takes the workload's default (200; a trace file: all of its tasks).
    rate_per_s or load (a fraction of the measured capacity), or neither (the workload's
        default rate); with a cluster both are per replica. load_reference: the schedulers
        whose best saturation rate a load is a fraction of (`units`; default FCFS's).
    preset: a name or a preset file; kv_budget_tokens: None takes the preset's derived budget.
    cluster: N replicas behind a router, or None (one server).
    engine: the engine and its own settings.
    out: the results root (`cell.identity.RunIdentity.run_dir`).
    """

    workload: str
    schedulers: tuple[str, ...]
    num_tasks: int | None = None
    seed: int = 0
    rate_per_s: float | None = None
    load: float | None = None
    load_reference: tuple[str, ...] = DEFAULT_LOAD_REFERENCE
    preset: str = DEFAULT_PRESET
    kv_budget_tokens: int | None = None
    workload_params: Mapping[str, Any] = field(default_factory=dict)
    scheduler_params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    cluster: ClusterConfig | None = None
    engine: EngineOptions = field(default_factory=SimOptions)
    out: Path = Path("runs")

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "schedulers", tuple(self.schedulers))
        set_(self, "load_reference", tuple(self.load_reference))
        set_(self, "workload_params", dict(self.workload_params))
        set_(self, "scheduler_params", {k: dict(v) for k, v in self.scheduler_params.items()})
        if not self.schedulers:
            raise TopasError("--scheduler is empty; give `all` or a comma-separated list")
        self.engine.check_spec(self.schedulers, self.cluster)
        if self.num_tasks is not None and self.num_tasks < 1:
            raise TopasError(f"--tasks must be a positive integer, got {self.num_tasks}")
        if self.seed < 0:
            raise TopasError(f"--seed must be >= 0, got {self.seed}")
        if self.rate_per_s is not None and self.load is not None:
            raise TopasError("give either --rate or --load, not both")
        for name, value in (("--rate", self.rate_per_s), ("--load", self.load)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise TopasError(f"{name} must be a positive number, got {value}")
        if not self.load_reference or len(set(self.load_reference)) != len(self.load_reference):
            raise TopasError(
                f"load_reference must name distinct schedulers, got {list(self.load_reference)}"
            )
        for name in self.load_reference:
            SCHEDULERS.get(name)  # an unknown name: raises with the known names
        budget = self.kv_budget_tokens
        if budget is not None and not 1 <= budget <= MAX_TOKENS:
            raise TopasError(
                f"--kv-budget must be a positive number of tokens, got {budget} (at most "
                f"{MAX_TOKENS:,})"
            )
        for name in self.scheduler_params:
            if name not in self.schedulers:
                SCHEDULERS.get(name)  # an unknown name: raises with the known names
                raise TopasError(
                    f"--scheduler-param for {name!r}, which is not in this run "
                    f"(schedulers: {', '.join(self.schedulers)})"
                )
        for name in self.schedulers:
            make_policy(name, **self.scheduler_params.get(name, {}))  # bad parameters fail here

    @property
    def replicas(self) -> int:
        """Servers the run is served by (a load and the default rate scale with them)."""
        return self.cluster.replicas if self.cluster is not None else 1
