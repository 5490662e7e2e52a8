"""Workload registry: names -> generators, and the plumbing every generator shares.

A generator is ``make(num_tasks, rate_per_s, seed, overrides) -> Workload``. Each family keeps
its parameters in a frozen dataclass whose defaults are the documented lengths; `overrides`
replace fields by name. `build_workload` does the rest the same way for every family: it checks
the run parameters, draws arrivals and per-task contents from one
``numpy.random.Generator(PCG64(seed))``, numbers tasks ``t0000``... and records every parameter
in `Workload.params`.

Every generated family also takes ``output_scale`` (`OUTPUT_SCALE`, default 1): every call's
true output, and every prompt segment that reads an output, is multiplied by it (rounded, at
least one token) after the family drew its lengths (`scale_outputs`), before the client's
``max_tokens`` setting is applied, so the regime map's output-length axis (x0.5, x1, x2) is one
parameter for every workload. It is recorded in `Workload.params` only when given.

Reproducibility contract: the same (name, num_tasks, rate, seed, overrides) gives an identical
workload. Arrivals and contents come from two child streams of that one generator, so the first
n tasks are the same for any `num_tasks` >= n, and a different rate only rescales the arrival
times (the contents stay identical), which keeps load sweeps comparable.

Any name a workload is given by may also be a trace file's path (`resolve`): it runs as the
`trace` workload (`trace.workload`) with ``file`` set, so `run -w my-trace.jsonl` and sweep files
take files like names.

Adding a workload = one generator module + one line below.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from importlib import import_module
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from topas_bench.errors import TopasError, UnknownNameError
from topas_bench.registry import Registry
from topas_bench.workloads import lengths
from topas_bench.workloads.arrivals import poisson_arrivals
from topas_bench.workloads.model import Agent, Segment, Stage, Task, Workload, output_key
from topas_bench.workloads.params import number, parse_params, positive_int
from topas_bench.workloads.trace.read import path_problem

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    P = TypeVar("P", bound=DataclassInstance)

#: ``make(num_tasks, rate_per_s, seed, overrides) -> Workload``
MakeFn = Callable[[int, float, int, dict[str, Any]], Workload]


@dataclass(frozen=True)
class WorkloadSpec:
    """A registered workload.

    `default_rate_per_s` is the Poisson arrival rate used when a run does not give one;
    `rate_note` says where it comes from (e.g. a fraction of measured capacity on a preset).
    `defaults`, when set, gives (tasks, rate) from the parameters instead (a file's own).
    `max_tokens` is the family's default length setting (`lengths`; its params' default).
    """

    name: str
    description: str
    default_rate_per_s: float
    rate_note: str
    make: MakeFn
    defaults: Callable[[Mapping[str, Any]], tuple[int, float]] | None = None
    max_tokens: str = "exact"


WORKLOADS: Registry[WorkloadSpec] = Registry("workload")

#: Tasks of a run that does not say (`run`, `sweep`, `workloads export`); a file: all of its.
DEFAULT_TASKS = 200
#: The setting every workload's default rate was measured on (0.8 x FCFS's capacity there,
#: `tests/test_default_rates.py`): this preset with its derived KV budget.
DEFAULT_RATE_PRESET = "a100-qwen32b"
#: The parameter every generated family takes (module docstring; `scale_outputs`).
OUTPUT_SCALE = "output_scale"


def resolve(name: str, params: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
    """(registered name, parameters): a registered name as it is; a trace file's path as the
    `trace` workload with ``file`` set. Anything else fails naming the known workloads."""
    params = dict(params or {})
    if name in WORKLOADS:
        return name, params
    if name.endswith((".jsonl", ".gz")) or os.sep in name or "/" in name or os.path.exists(name):
        if problem := path_problem(name):  # missing, a directory, a device, ...
            raise TopasError(f"workload file {name}: {problem}")
        if params.get("file", name) != name:
            raise TopasError(f"workload {name} is a file; it takes no other `file` parameter")
        return "trace", {"file": name, **params}
    known = ", ".join(WORKLOADS.names())
    raise UnknownNameError(f"unknown workload {name!r}; known: {known}; or a trace file's path")


def run_defaults(name: str, params: Mapping[str, Any] | None = None) -> tuple[int, float]:
    """(tasks, rate per second) of a run of `name` that gives neither."""
    name, params = resolve(name, params)
    spec = WORKLOADS.get(name)
    if spec.defaults is not None:
        return spec.defaults(params)
    return DEFAULT_TASKS, spec.default_rate_per_s


def identity_params(name: str, params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The workload parameters a cell of `name` run with `params` records in its identity
    (`lengths.identity_params`): `params`, with the length setting named unless it is legacy.
    Equal to `RunPlan.identity_workload_params` of the generated workload."""
    resolved_name, resolved = resolve(name, params)
    given = dict(params or {})
    setting = {
        lengths.MODE: resolved.get(lengths.MODE, WORKLOADS.get(resolved_name).max_tokens),
        lengths.CAP: resolved.get(lengths.CAP, lengths.METAGPT_CAP),
    }
    return lengths.identity_params(resolved_name, given, setting)


def generate(
    name: str,
    *,
    num_tasks: int,
    rate_per_s: float | None = None,
    seed: int = 0,
    **overrides: Any,
) -> Workload:
    """Build workload `name` (or a trace file, `resolve`) with `num_tasks` Poisson arrivals at
    `rate_per_s` (None = default).

    `overrides` replace the family's parameters by name, e.g.
    ``generate("chain3", num_tasks=3, prefix_tokens=1000)``. Unknown names and bad values raise
    `TopasError` with a one-line message.
    """
    name, params = resolve(name, overrides)
    spec = WORKLOADS.get(name)
    rate = run_defaults(name, params)[1] if rate_per_s is None else rate_per_s
    return spec.make(num_tasks, rate, seed, params)


# --- shared by the generator modules ----------------------------------------------------------


def build_workload(
    name: str,
    params_cls: type[P],
    overrides: Mapping[str, Any],
    agents: Callable[[P], tuple[Agent, ...]],
    stages: Callable[[P, str, np.random.Generator], tuple[Stage, ...]],
    num_tasks: int,
    rate_per_s: float,
    seed: int,
) -> Workload:
    """Check the run parameters, build the family's params from `overrides`, draw the tasks.

    `stages(params, task_id, rng)` returns one task's stages; it draws whatever it samples from
    `rng`, a stream that only contents use (arrivals have their own), in task order. A family
    whose params have ``max_tokens`` (and ``max_tokens_cap``) gets its stages' `max_new_tokens`
    set here (`lengths`), so generators write exact lengths and never the cap.
    """
    num_tasks = positive_int(name, "num_tasks", num_tasks)
    rate_per_s = number(name, "rate_per_s", rate_per_s)
    seed = positive_int(name, "seed", seed, minimum=0)
    overrides = dict(overrides)
    scale = None
    if OUTPUT_SCALE in overrides:
        scale = number(name, OUTPUT_SCALE, overrides.pop(OUTPUT_SCALE))
    params = parse_params(name, params_cls, overrides, (OUTPUT_SCALE,))
    mode = getattr(params, lengths.MODE, None)
    if mode is not None:
        lengths.check_given(f"workload {name!r}", overrides, mode)

    arrival_rng, content_rng = np.random.Generator(np.random.PCG64(seed)).spawn(2)
    arrivals = poisson_arrivals(arrival_rng, num_tasks, rate_per_s)
    tasks = []
    for i in range(num_tasks):
        task_id = f"t{i:04d}"
        task_stages = stages(params, task_id, content_rng)
        if scale is not None:
            task_stages = scale_outputs(task_stages, task_id, scale)
        if mode is not None:
            cap = getattr(params, lengths.CAP)
            try:
                task_stages = lengths.apply(task_stages, mode, cap)
            except TopasError as e:
                raise TopasError(f"workload {name!r}: {e}") from None
        tasks.append(Task(task_id, name, float(arrivals[i]), task_stages))
    record: dict[str, Any] = {"num_tasks": num_tasks, "rate_per_s": rate_per_s}
    for f in fields(params):
        value = getattr(params, f.name)
        record[f.name] = list(value) if isinstance(value, tuple) else value  # JSON-shaped
    if scale is not None:
        record[OUTPUT_SCALE] = scale
    return Workload(name, agents(params), tuple(tasks), record, seed, generator=name)


def family(
    name: str,
    params_cls: type[P],
    agents: Callable[[P], tuple[Agent, ...]],
    stages: Callable[[P, str, np.random.Generator], tuple[Stage, ...]],
) -> MakeFn:
    """A family's `make`: `build_workload` with these parts."""

    def make(num_tasks: int, rate_per_s: float, seed: int, overrides: dict[str, Any]) -> Workload:
        return build_workload(
            name, params_cls, overrides, agents, stages, num_tasks, rate_per_s, seed
        )

    return make


def scale_outputs(stages: tuple[Stage, ...], task_id: str, scale: float) -> tuple[Stage, ...]:
    """`stages` with every true output and every prompt segment reading one of this task's
    outputs (`output_key`) times `scale`, rounded half to even, at least one token. A call's
    `max_new_tokens` follows its output (generators write exact lengths; `lengths.apply` sets
    the client's cap afterwards)."""

    def scaled(n: int) -> int:
        return max(1, round(n * scale))

    outs = {output_key(task_id, s.id) for s in stages}
    result = []
    for s in stages:
        prompt = tuple(Segment(g.key, scaled(g.tokens)) if g.key in outs else g for g in s.prompt)
        out = scaled(s.output_tokens)
        result.append(replace(s, prompt=prompt, output_tokens=out, max_new_tokens=out))
    return tuple(result)


def uniform_tokens(rng: np.random.Generator, low_high: tuple[int, int]) -> int:
    """A length drawn uniformly from the inclusive range ``(low, high)``."""
    return int(rng.integers(low_high[0], low_high[1], endpoint=True))


def _lazy(module: str, attr: str) -> MakeFn:
    """A `make` that imports its generator module on first use (keeps imports light)."""

    def make(num_tasks: int, rate_per_s: float, seed: int, overrides: dict[str, Any]) -> Workload:
        fn: MakeFn = getattr(import_module(f"topas_bench.workloads.{module}"), attr)
        return fn(num_tasks, rate_per_s, seed, overrides)

    make.__qualname__ = f"{module}.{attr}"
    return make


# Default rates: 0.8 x each workload's capacity measured on the default engine setting
# (a100-qwen32b at its derived 18,692-token KV budget) by
# `topas_bench.experiment.measure_capacity`: the Poisson rate at which FCFS's mean JCT is 3x the
# JCT of the same tasks served alone (the knee of its load curve). At 0.8 of it queues form and
# the scheduler matters, while FCFS itself stays stable. tests/test_default_rates.py re-measures
# the capacities and fails if a default drifts from 0.8 of them.
DEFAULT_LOAD = 0.8


def _add(
    name: str, description: str, module: str, attr: str, capacity_tps: float,
    max_tokens: str = "exact",
) -> None:  # fmt: skip
    rate = float(f"{DEFAULT_LOAD * capacity_tps:.2g}")
    note = f"{DEFAULT_LOAD:g} x capacity {capacity_tps:.3g}/s (FCFS knee, a100-qwen32b)"
    make = _lazy(module, attr)
    WORKLOADS.add(name, WorkloadSpec(name, description, rate, note, make, None, max_tokens))


_add("chain3", "3 agents in a chain A -> B -> C; fixed lengths", "synthetic", "make_chain3", 0.283)
_add("dag4", "diamond A -> {B, C} -> D; fixed lengths", "synthetic", "make_dag4", 0.0926)
_add(
    "dag10-wide", "planner -> 8 workers -> joiner; fixed lengths", "synthetic",
    "make_dag10_wide", 0.0160,
)  # fmt: skip
# The MetaGPT family sends MetaGPT's own cap, 4,096, on every call (`lengths`), so SGLang
# reserves KV for up to 4,096 output tokens per call (x its new-token ratio) where exact lengths
# reserved the true length: capacities 29-33% lower than with exact lengths (0.0984, 0.00591,
# 0.00763, 0.0327; metagpt-tl-full 14%, 0.00155), re-measured with tests/test_default_rates.py
# (`measure_capacity(name, (), a100-qwen32b, 18692)`) when the default became `cap`.
_add(
    "metagpt-sop", "MetaGPT SOP: 5-role chain, PRD to tests", "metagpt", "make_sop", 0.0659,
    "cap",
)  # fmt: skip
_add(
    "metagpt-tl", "MetaGPT TeamLeader: 9-stage star, append-only TL memory", "metagpt",
    "make_tl", 0.00418, "cap",
)  # fmt: skip
_add(
    "metagpt-sop-full", "MetaGPT SOP, every call", "metagpt_sop_full", "make_sop_full", 0.00525,
    "cap",
)  # fmt: skip
_add(
    "metagpt-tl-full", "MetaGPT TL, every call", "metagpt_tl_full", "make_tl_full", 0.00134,
    "cap",
)  # fmt: skip
_add(
    "metagpt-replay", "a recorded MetaGPT run, replayed", "metagpt_replay", "make_replay",
    0.0227, "cap",
)  # fmt: skip

# The agentic workloads (`agentic`): tool waits between calls (docs/workload-format.md,
# "Agentic workloads"); an agent client sends one fixed cap, as MetaGPT's does.
_add(
    "code-agent", "coding agent: edit / test / read turns, tool waits",
    "agentic", "make_code_agent", 0.0226, "cap",
)  # fmt: skip
_add(
    "deep-research", "planner -> search/read branches -> writer", "agentic",
    "make_deep_research", 0.0161, "cap",
)  # fmt: skip


def _trace_defaults(params: Mapping[str, Any]) -> tuple[int, float]:
    fn: Callable[[Mapping[str, Any]], tuple[int, float]]
    fn = import_module("topas_bench.workloads.trace.workload").defaults  # lazily, as `_lazy`
    return fn(params)


WORKLOADS.add(
    "trace",
    WorkloadSpec(
        "trace", "a trace file (-w PATH, or --workload-param file=PATH)", 0.0,
        "its own arrivals (docs/workload-format.md)", _lazy("trace.workload", "make_trace"),
        _trace_defaults, "file",
    ),
)  # fmt: skip
