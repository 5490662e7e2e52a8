"""Metrics as a small table (after ann-benchmarks): name, unit, better direction, a function.

Every metric is a function of a run's files (tasks, requests, decisions tables and the
summary counters), so analysis works the same on results from either engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class RunTables:
    tasks: pd.DataFrame
    requests: pd.DataFrame
    decisions: pd.DataFrame
    counters: dict[str, float]


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    better: Literal["lower", "higher"]
    fn: Callable[[RunTables], float]
    fmt: str = "{:.2f}"


def _jct_quantile(q: float) -> Callable[[RunTables], float]:
    def fn(r: RunTables) -> float:
        if r.tasks.empty:
            return float("nan")
        return float(np.quantile(r.tasks["jct_s"].to_numpy(), q))

    return fn


def _mean_jct(r: RunTables) -> float:
    return float(r.tasks["jct_s"].mean()) if not r.tasks.empty else float("nan")


def _throughput(r: RunTables) -> float:
    """Finished tasks per second, from the first arrival to the last finish."""
    t = r.tasks
    if t.empty:
        return float("nan")
    span = float(t["finish_s"].max() - t["arrival_s"].min())
    return len(t) / span if span > 0 else float("nan")


def _hit_rate(r: RunTables) -> float:
    prompt = r.counters.get("admitted_prompt_tokens", 0.0)
    return r.counters.get("cached_prompt_tokens", 0.0) / prompt if prompt else float("nan")


def _decision_ms(q: float) -> Callable[[RunTables], float]:
    def fn(r: RunTables) -> float:
        d = r.decisions
        if d.empty:
            return float("nan")
        return float(np.quantile(d["wall_s"].to_numpy(), q) * 1e3)

    return fn


METRICS: tuple[Metric, ...] = (
    Metric("tasks", "", "higher", lambda r: float(len(r.tasks)), "{:.0f}"),
    Metric("mean_jct_s", "s", "lower", _mean_jct),
    Metric("p50_jct_s", "s", "lower", _jct_quantile(0.50)),
    Metric("p90_jct_s", "s", "lower", _jct_quantile(0.90)),
    Metric("p99_jct_s", "s", "lower", _jct_quantile(0.99)),
    Metric("throughput_tps", "tasks/s", "higher", _throughput, "{:.4f}"),
    Metric("prefix_hit_rate", "", "higher", _hit_rate, "{:.1%}"),
    Metric("preemptions", "", "lower", lambda r: r.counters.get("preemptions", 0.0), "{:.0f}"),
    Metric("decision_p50_ms", "ms", "lower", _decision_ms(0.50), "{:.3f}"),
    Metric("decision_p99_ms", "ms", "lower", _decision_ms(0.99), "{:.3f}"),
)
METRIC_BY_NAME = {m.name: m for m in METRICS}


def summarize(r: RunTables) -> dict[str, float]:
    return {m.name: m.fn(r) for m in METRICS}
