"""The SGLang general plugin `topas` (entry-point group `sglang.srt.plugins`).

SGLang >= 0.5.11 calls `register()` early in every server process (processes are spawned, so
patches made by a launcher never reach them). It does nothing unless `TOPAS_SCHEDULER` names a
registered scheduler, so installing topas-bench never changes another SGLang user's server.

Environment (set by `topas-bench serve` and by the launcher):
    TOPAS_SCHEDULER         a scheduler name (`topas-bench schedulers list`), e.g. `topas`; a
                            plugin's (`schedulers.plugins`) if its package is installed here
    TOPAS_SCHEDULER_PARAMS  JSON object of the scheduler's parameters, e.g. {"beta": 0.2}
    TOPAS_PRESET            cost-model preset for the estimator's prior (default a100-qwen32b)

A bad name or parameter fails the plugin (SGLang logs it and serves with its own scheduler);
the launcher checks the log for the line `topas: scheduler '<name>' installed`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from topas_bench.schedulers.base import Policy

ENV_SCHEDULER = "TOPAS_SCHEDULER"
ENV_PARAMS = "TOPAS_SCHEDULER_PARAMS"
ENV_PRESET = "TOPAS_PRESET"
INSTALLED_MARK = "topas: scheduler {name!r} installed"
logger = logging.getLogger("topas_bench.sglang")


def settings() -> tuple[str, dict[str, Any], str] | None:
    """(scheduler, params, preset) from the environment; None when the plugin is off."""
    name = os.environ.get(ENV_SCHEDULER, "").strip()
    if not name:
        return None
    params = json.loads(os.environ.get(ENV_PARAMS) or "{}")
    if not isinstance(params, dict):
        raise ValueError(f"{ENV_PARAMS} must be a JSON object, got {params!r}")
    return name, params, os.environ.get(ENV_PRESET, "a100-qwen32b")


def policy_factory(name: str, params: dict[str, Any]) -> Callable[[], Policy]:
    """What builds the server's policy: `name` looked up as `topas-bench run -s` looks it up
    (the registry: a built-in, or a scheduler an installed package declares in the entry-point
    group `topas_bench.schedulers`, which must then be installed in the server's environment
    too). A bad name or parameter, or a plugin that fails to import, fails here, loudly."""
    from topas_bench.schedulers.registry import make_policy

    make_policy(name, **params)
    return lambda: make_policy(name, **params)


def register() -> None:
    """Replace SGLang's `Scheduler` with one that runs the chosen topas-bench policy."""
    conf = settings()
    if conf is None:
        logger.info("topas plugin: %s is unset; SGLang's own scheduler is used", ENV_SCHEDULER)
        return
    import sglang  # type: ignore[import-not-found]
    from sglang.srt.plugins.hook_registry import (  # type: ignore[import-not-found]
        HookRegistry,
        HookType,
    )

    from topas_bench.runners.sglang.adapter import SGLANG_VERSION, make_scheduler_class
    from topas_bench.runners.sim.cost import CostModel, load_preset
    from topas_bench.schedulers.estimator import ServiceEstimator

    if sglang.__version__ != SGLANG_VERSION:
        raise RuntimeError(
            f"topas plugin is pinned to SGLang {SGLANG_VERSION}, found {sglang.__version__}"
        )
    name, params, preset = conf
    factory = policy_factory(name, params)
    needs = factory().needs
    if needs.tree_core is not None:
        # e.g. node priorities are reachable only in SGLang's Python tree core; SGLang reads
        # this when the scheduler builds its cache, after the plugins are loaded.
        os.environ.setdefault("SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", needs.tree_core)
    cost = CostModel(load_preset(preset))
    cls = make_scheduler_class(factory, lambda: ServiceEstimator(cost))
    HookRegistry.register("sglang.srt.managers.scheduler.Scheduler", cls, HookType.REPLACE)
    logger.info("topas plugin: scheduler %r registered (params %s)", name, params)
