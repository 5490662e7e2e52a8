"""Metrics as a small table (after ann-benchmarks): name, unit, better direction, a function.

Every metric is a function of a run's files (tasks, requests, decisions tables and the
summary counters), so analysis works the same on results from either engine.

Task level: JCT (mean, p50/p90/p99), throughput, and goodput under an SLO: the tasks per second
that finished within the SLO, a multiple of each task's unloaded JCT (`unloaded_jct_s`: the
same task served alone, `topas_bench.unloaded`) or a fixed number of seconds (`Slo`). Request
level, as SGLang's bench_serving and vLLM's benchmarks print them, over the calls that finished:
TTFT (first token - sent), TPOT (per request, (finish - first token) / (output tokens - 1), for
outputs of two or more tokens), ITL (the mean gap between output tokens over every call, i.e.
TPOT weighted by tokens; runs record no per-token times, so no ITL percentiles), queueing delay
(first admission - sent), request latency (finish - sent), requests and output tokens per
second; per stage kind (`stage_summary`): calls, mean and p99 latency, mean queueing and TTFT.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from topas_bench.errors import TopasError


@dataclass(frozen=True)
class Slo:
    """A task's JCT target: `multiple` x its unloaded JCT, or `seconds` when that is set."""

    multiple: float = 2.0
    seconds: float | None = None

    def __post_init__(self) -> None:
        for name in ("multiple", "seconds"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v > 0):
                raise TopasError(f"SLO {name} must be a positive number, got {v}")

    @classmethod
    def parse(cls, text: str) -> Slo:
        """`2x` (2 x the unloaded JCT) or `300s` / `300` (seconds)."""
        m = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?[0-9]+)?)\s*(x|s)?\s*", text.lower())
        if m is None:
            raise TopasError(
                f"--slo expects Nx (N x the unloaded JCT) or Ns (seconds), got {text!r}"
            )
        value = float(m.group(1))
        return cls(multiple=value) if m.group(2) == "x" else cls(seconds=value)

    def describe(self) -> str:
        if self.seconds is not None:
            return f"JCT <= {self.seconds:g} s"
        return f"JCT <= {self.multiple:g} x the task's unloaded JCT"

    def met(self, tasks: pd.DataFrame) -> pd.Series | None:
        """Per task: did it meet the SLO (None without the unloaded JCTs a multiple needs)."""
        if self.seconds is not None:
            return tasks["jct_s"] <= self.seconds
        if "unloaded_jct_s" not in tasks or tasks["unloaded_jct_s"].isna().any():
            return None
        return tasks["jct_s"] <= self.multiple * tasks["unloaded_jct_s"]


@dataclass(frozen=True)
class RunTables:
    tasks: pd.DataFrame
    requests: pd.DataFrame
    decisions: pd.DataFrame
    counters: dict[str, float]
    slo: Slo = field(default_factory=Slo)


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


def _span_s(r: RunTables) -> float:
    t = r.tasks
    return float(t["finish_s"].max() - t["arrival_s"].min()) if not t.empty else math.nan


def _goodput(r: RunTables) -> float:
    """Tasks per second that met the SLO, over the run's span."""
    met = r.slo.met(r.tasks) if not r.tasks.empty else None
    span = _span_s(r)
    return float(met.sum()) / span if met is not None and span > 0 else math.nan


def _attainment(r: RunTables) -> float:
    met = r.slo.met(r.tasks) if not r.tasks.empty else None
    return float(met.mean()) if met is not None else math.nan


def _done(r: RunTables) -> pd.DataFrame:
    """Calls that finished (both engines mark them `ok`)."""
    q = r.requests
    if q.empty or "status" not in q:
        return q
    return q[q["status"] == "ok"]


def _request_stat(
    value: Callable[[pd.DataFrame], pd.Series], stat: str, scale: float = 1.0
) -> Callable[[RunTables], float]:
    def fn(r: RunTables) -> float:
        q = _done(r)
        v = value(q).dropna().to_numpy(dtype=float) if not q.empty else np.array([])
        if v.size == 0:
            return math.nan
        return float((v.mean() if stat == "mean" else np.quantile(v, 0.99)) * scale)

    return fn


def _ttft(q: pd.DataFrame) -> pd.Series:
    return q["first_token_s"] - q["ready_s"]


def _tpot(q: pd.DataFrame) -> pd.Series:
    many = q[q["output_tokens"] > 1]
    return (many["finish_s"] - many["first_token_s"]) / (many["output_tokens"] - 1)


def _queue(q: pd.DataFrame) -> pd.Series:
    return q["first_admitted_s"] - q["ready_s"]


def _latency(q: pd.DataFrame) -> pd.Series:
    return q["finish_s"] - q["ready_s"]


def _itl_ms(r: RunTables) -> float:
    q = _done(r)
    q = q[q["output_tokens"] > 1] if not q.empty else q
    gaps = float((q["output_tokens"] - 1).sum()) if not q.empty else 0.0
    return float((q["finish_s"] - q["first_token_s"]).sum()) / gaps * 1e3 if gaps else math.nan


def _per_second(count: Callable[[pd.DataFrame], float]) -> Callable[[RunTables], float]:
    def fn(r: RunTables) -> float:
        q, span = _done(r), _span_s(r)
        return count(q) / span if not q.empty and span > 0 else math.nan

    return fn


def _output_tokens(q: pd.DataFrame) -> float:
    return float(q["output_tokens"].sum())


def stage_summary(requests: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per stage kind (calls of one kind across tasks): calls, mean and p99 latency (s), mean
    queueing delay and TTFT (s); finished calls only."""
    q = _done(RunTables(pd.DataFrame(), requests, pd.DataFrame(), {}))
    out: dict[str, dict[str, float]] = {}
    for kind, g in q.groupby("kind", sort=True) if not q.empty else ():
        lat = _latency(g).to_numpy(dtype=float)
        out[str(kind)] = {
            "calls": float(len(g)),
            "mean_latency_s": float(lat.mean()),
            "p99_latency_s": float(np.quantile(lat, 0.99)),
            "mean_queue_s": float(_queue(g).mean()),
            "mean_ttft_s": float(_ttft(g).mean()),
        }
    return out


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


#: What `mechanism` reads of a run's timeline (decode rows: steps, batch, distinct agents).
MECHANISM = ("decode_batch", "agents_per_batch")


def mechanism(timeline: pd.DataFrame) -> dict[str, float]:
    """The decode batch size and the distinct agents per decode batch, each weighted by decode
    steps (a timeline row stands for `steps` identical iterations); NaN without a timeline."""
    if timeline.empty or not {"kind", "steps", "batch", "batch_agents"} <= set(timeline):
        return dict.fromkeys(MECHANISM, math.nan)
    dec = timeline[timeline["kind"] == "decode"]
    steps = float(dec["steps"].sum())
    if not steps:
        return dict.fromkeys(MECHANISM, math.nan)
    return {
        "decode_batch": float((dec["batch"] * dec["steps"]).sum()) / steps,
        "agents_per_batch": float((dec["batch_agents"] * dec["steps"]).sum()) / steps,
    }


METRICS: tuple[Metric, ...] = (
    Metric("tasks", "", "higher", lambda r: float(len(r.tasks)), "{:.0f}"),
    Metric("mean_jct_s", "s", "lower", _mean_jct),
    Metric("p50_jct_s", "s", "lower", _jct_quantile(0.50)),
    Metric("p90_jct_s", "s", "lower", _jct_quantile(0.90)),
    Metric("p99_jct_s", "s", "lower", _jct_quantile(0.99)),
    Metric("throughput_tps", "tasks/s", "higher", _throughput, "{:.4f}"),
    Metric("goodput_tps", "tasks/s", "higher", _goodput, "{:.4f}"),
    Metric("slo_attainment", "", "higher", _attainment, "{:.1%}"),
    Metric("ttft_mean_s", "s", "lower", _request_stat(_ttft, "mean")),
    Metric("ttft_p99_s", "s", "lower", _request_stat(_ttft, "p99")),
    Metric("tpot_mean_ms", "ms", "lower", _request_stat(_tpot, "mean", 1e3), "{:.1f}"),
    Metric("tpot_p99_ms", "ms", "lower", _request_stat(_tpot, "p99", 1e3), "{:.1f}"),
    Metric("itl_mean_ms", "ms", "lower", _itl_ms, "{:.1f}"),
    Metric("queue_mean_s", "s", "lower", _request_stat(_queue, "mean")),
    Metric("queue_p99_s", "s", "lower", _request_stat(_queue, "p99")),
    Metric("latency_mean_s", "s", "lower", _request_stat(_latency, "mean")),
    Metric("latency_p99_s", "s", "lower", _request_stat(_latency, "p99")),
    Metric("request_tps", "req/s", "higher", _per_second(lambda q: float(len(q))), "{:.3f}"),
    Metric("output_tok_s", "tok/s", "higher", _per_second(_output_tokens), "{:.1f}"),
    Metric("prefix_hit_rate", "", "higher", _hit_rate, "{:.1%}"),
    Metric("preemptions", "", "lower", lambda r: r.counters.get("preemptions", 0.0), "{:.0f}"),
    Metric("decision_p50_ms", "ms", "lower", _decision_ms(0.50), "{:.3f}"),
    Metric("decision_p99_ms", "ms", "lower", _decision_ms(0.99), "{:.3f}"),
)
METRIC_BY_NAME = {m.name: m for m in METRICS}


def summarize(r: RunTables) -> dict[str, float]:
    return {m.name: m.fn(r) for m in METRICS}


def run_info(r: RunTables) -> dict[str, Any]:
    """What `run.json` stores besides the identity: the summary, the SLO it used, per stage."""
    return {
        "summary": summarize(r),
        "slo": r.slo.describe(),
        "stages": stage_summary(r.requests),
    }
