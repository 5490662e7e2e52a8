"""The engines a run can use, by name: the registry the experiment layer picks from.

Each engine is a function `run_cell(plan, scheduler, *, force, on_task_done) -> CellResult`,
imported only when used (the reference engine and the real server pull in subprocesses and
HTTP). `version` is part of every run's identity: bump it whenever a change to the engine can
change a result, so cells an older engine made are rerun, never reused (`results.RunIdentity`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from topas_bench.registry import Registry


@dataclass(frozen=True)
class Engine:
    name: str
    version: int
    description: str
    module: str  # holds `run_cell`

    def run_cell(self) -> Callable[..., Any]:
        return importlib.import_module(self.module).run_cell  # type: ignore[no-any-return]


ENGINES: Registry[Engine] = Registry("engine")
for _e in (
    # v2: SGLang 0.5.23's batch_is_full latch, LRU refresh on match, token-granular radix
    # with node splits, PrefillAdder/retraction accounting as the reference engine measures.
    # v3: a finished request's prompt is split from its output in the tree (as SGLang's
    # checkpoint_into_tree), so eviction can drop the output and keep the prompt; the policy
    # seams of the peers (calc_priority variants, eviction policies, pins, TTL retention).
    Engine("sim", 3, "discrete-event simulator of one SGLang server (default)",
           "topas_bench.runners.sim.runner"),
    Engine("sglang-cpu", 1, "SGLang 0.5.23's own Scheduler on CPU, virtual clock (reference)",
           "topas_bench.runners.sglang_cpu.engine"),
    Engine("sglang", 1, "real SGLang servers with the topas plugin (GPU)",
           "topas_bench.runners.sglang.runner"),
):  # fmt: skip
    ENGINES.add(_e.name, _e)


def engine_version(name: str) -> int:
    return ENGINES.get(name).version
