"""The engines a run can use, by name: the registry the planner and the harness pick from.

An engine is two things: its options (a frozen value in the run specification, `options`, a
light class with no I/O, which also carries the engine's version) and its server (`module`'s
`SERVER`, the system under test behind the harness: `plan.Server`), imported only when used (the
reference engine and the real server pull in subprocesses and HTTP).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from topas_bench.errors import TopasError
from topas_bench.plan import Server
from topas_bench.registry import Registry
from topas_bench.runners.sglang.options import SglangOptions, refuse_sglang_flags
from topas_bench.runners.sglang_cpu.options import ReferenceOptions
from topas_bench.runners.sim.config import SimOptions
from topas_bench.spec import EngineOptions


@dataclass(frozen=True)
class Engine:
    name: str
    description: str
    options: type[EngineOptions]
    module: str  # holds `SERVER`

    @property
    def version(self) -> int:
        """Part of every run's identity (`options.version`)."""
        return self.options.version

    def server(self) -> Server:
        """The engine's server (its module imported now)."""
        return cast(Server, importlib.import_module(self.module).SERVER)


ENGINES: Registry[Engine] = Registry("engine")
for _e in (
    Engine("sim", "discrete-event simulator of one SGLang server (default)", SimOptions,
           "topas_bench.runners.sim.runner"),
    Engine("sglang-cpu", "SGLang 0.5.23's own Scheduler on CPU, virtual clock (reference)",
           ReferenceOptions, "topas_bench.runners.sglang_cpu.engine"),
    Engine("sglang", "real SGLang servers with the topas plugin (GPU)", SglangOptions,
           "topas_bench.runners.sglang.runner"),
):  # fmt: skip
    ENGINES.add(_e.name, _e)


def engine_version(name: str) -> int:
    return ENGINES.get(name).version


def engine_options(name: str, flags: Mapping[str, Any]) -> EngineOptions:
    """Engine `name`'s options from `run`'s engine-specific flags (flag name -> value, None
    when not given): each engine takes its own and refuses the others'."""
    engine = ENGINES.get(name)  # an unknown engine: one line naming the known ones
    hint = flags.get("--length-hint") or "none"
    if hint not in ("none", "oracle"):
        raise TopasError(f"--length-hint must be `none` or `oracle`, got {hint!r}")
    given = {k: v for k, v in flags.items() if v is not None}
    if engine.options is not SglangOptions:
        refuse_sglang_flags(given, engine.name)
    return engine.options.from_flags(given)
