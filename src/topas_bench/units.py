"""The regime map's units: KV budgets as multiples of a workload's agent-prefix working set,
loads as fractions of the best reference scheduler's saturation rate.

Working set (`WorkingSet`), read from a `PROBE_TASKS`-task sample of the workload (seed 0, its
parameters, every token range at its high end, so that drawn lengths are their largest; at
any rate: contents do not depend on it):

- ``prefix_tokens`` W: the sum of every agent's prefix (`Agent.prefix_tokens`), what keeping
  every agent resident costs;
- ``call_tokens`` C: the most one call needs beyond its agent's prefix, i.e. the largest
  `least_tokens(call) - prefix(call's agent)` of the sample (`runners.sim.config.check_fits`'s
  least budget a call is served whole in: its prompt and output, and SGLang's spare tokens);
- a budget multiple m is ``ceil(m x W) + C`` tokens: m = 1 is "all fit" (every prefix resident
  and room for one more call), ``"one-agent"`` is m = largest prefix / W, i.e. the largest
  prefix plus one call's need ("one agent fits"). Every call of the sample fits the smallest
  budget, and so does every call of a sample with the ranges as given, whose lengths are
  drawn within them (tests/test_regime.py checks seeds 0-4 of the MetaGPT workloads at every
  output scale); a call larger than C would be refused with `check_fits`'s message.

Load: a load F against reference schedulers R is F x max over R of each one's saturation
rate (`experiment.measure_capacity`: the rate at which its mean JCT reaches 3x the unloaded
one); `("fcfs",)`, the default, is the historical meaning of `--load`.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from topas_bench.errors import TopasError
from topas_bench.runners.sim.config import least_tokens
from topas_bench.workloads.model import agent_key

#: Tasks of the sample the working set is read from (the capacity probe's size).
PROBE_TASKS = 200
#: The budget multiple spelled by name: the largest prefix plus one call's need.
ONE_AGENT = "one-agent"

#: A budget multiple: a positive number, or `ONE_AGENT`.
Multiple = float | str


@dataclass(frozen=True)
class WorkingSet:
    """A workload's agent-prefix working set (module docstring), in tokens."""

    prefix_tokens: int
    largest_prefix_tokens: int
    call_tokens: int

    def multiple(self, m: Multiple) -> float:
        """`m` as a number (`ONE_AGENT`: the largest prefix over the working set)."""
        check_multiple(m)
        return self.largest_prefix_tokens / self.prefix_tokens if m == ONE_AGENT else float(m)

    def budget_tokens(self, m: Multiple) -> int:
        """The KV budget of multiple `m`: ceil(m x W) + C."""
        return math.ceil(self.multiple(m) * self.prefix_tokens - 1e-9) + self.call_tokens

    def multiple_of(self, budget_tokens: int) -> float:
        """The multiple a budget is (the inverse of `budget_tokens`, up to rounding)."""
        return (budget_tokens - self.call_tokens) / self.prefix_tokens


def check_multiple(m: object) -> None:
    if m == ONE_AGENT:
        return
    if isinstance(m, bool) or not isinstance(m, int | float) or not (0 < m < math.inf):
        raise TopasError(
            f"a KV budget multiple must be a positive number or {ONE_AGENT!r}, got {m!r}"
        )


def working_set(workload: str, params: Mapping[str, Any] | None = None) -> WorkingSet:
    """`workload`'s working set with `params` (a registered name or a trace file)."""
    return _working_set(workload, json.dumps(dict(params or {}), sort_keys=True))


@functools.lru_cache(maxsize=256)
def _working_set(workload: str, params_json: str) -> WorkingSet:
    from topas_bench.workloads.registry import generate

    given = json.loads(params_json)
    highs = {  # every token range (a family's (low, high) parameter) at its high end
        k: [v[1], v[1]]
        for k, v in generate(workload, num_tasks=1, seed=0, **given).params.items()
        if isinstance(v, list) and len(v) == 2 and all(type(x) is int for x in v)
    }
    w = generate(workload, num_tasks=PROBE_TASKS, seed=0, **(given | highs))
    prefixes = {a.name: a.prefix_tokens for a in w.agents}
    if not prefixes or sum(prefixes.values()) < 1:
        raise TopasError(
            f"workload {workload!r} has no agent prefixes; its KV budget cannot be a multiple "
            "of them (give `kv_budgets` in tokens)"
        )
    call = 0
    for _, s in w.stages():
        starts = bool(s.prompt) and s.prompt[0].key == agent_key(s.agent)
        call = max(call, least_tokens(s) - (s.prompt[0].tokens if starts else 0))
    return WorkingSet(sum(prefixes.values()), max(prefixes.values()), call)


def reference_rate(capacities: Mapping[str, float]) -> tuple[str, float]:
    """(scheduler, rate): the best (highest) saturation rate of the reference schedulers."""
    if not capacities:
        raise TopasError("a load needs at least one reference scheduler")
    best = max(capacities, key=lambda s: (capacities[s], s))
    return best, capacities[best]


def load_rate(load: float, capacities: Mapping[str, float]) -> float:
    """The Poisson rate (tasks/s) of `load`: that fraction of the best reference saturation."""
    return load * reference_rate(capacities)[1]


__all__ = [
    "ONE_AGENT", "PROBE_TASKS", "WorkingSet", "check_multiple", "load_rate", "reference_rate",
    "working_set",
]  # fmt: skip
