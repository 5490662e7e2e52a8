"""What a run records: per-request, per-task, per-iteration and per-decision tables.

Every engine writes the same columns (docs/design.md section 8), so analysis cannot tell them
apart except by the run's identity. A request's row and a task's row are built in one place
(`request_row`, `task_row`) from what every engine's request carries (the simulator's and the
reference engine's `SimRequest`, the real client's `ClientCall`) and from the workflow's tasks
(`runners.workflow.TaskRun`).
The simulator and the reference engine's loop (`runners.sglang_cpu.loop`) keep their rows in the
one `Recorder`, which only appends tuples during the run; DataFrames are built once, at the
end, outside the event loop. The real client journals each finished task's rows instead
(`runners.sglang.runner`), so that an interrupted run resumes."""

from __future__ import annotations

import math
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import pandas as pd

from topas_bench.runners.workflow import TaskRun
from topas_bench.schedulers.base import Decision

REQUEST_COLUMNS = [
    "request_id", "task_id", "stage_id", "agent", "kind", "prompt_tokens", "output_tokens",
    "cached_tokens", "ready_s", "first_admitted_s", "admitted_s", "first_token_s", "finish_s",
    "preemptions", "service_s", "status",
]  # fmt: skip
TASK_COLUMNS = ["task_id", "workflow", "arrival_s", "finish_s", "jct_s", "stages", "attained_s"]
TIMELINE_COLUMNS = [
    "t_s", "kind", "steps", "duration_s", "batch", "new_tokens", "kv_used_tokens",
    "kv_cache_tokens", "kv_private_tokens", "waiting", "resident_agents", "batch_agents",
]  # fmt: skip
DECISION_COLUMNS = ["t_s", "wall_s", "waiting", "admit", "preempt"]
_TIMELINE_INDEX = {c: i for i, c in enumerate(TIMELINE_COLUMNS)}


#: The attribute of an engine's request each of `REQUEST_COLUMNS` records, `status` aside. Every
#: engine's request carries them: the simulator's and the reference engine's (`SimRequest`), the
#: real client's (`ClientCall`). `sent_s` is when the client sent it (the `ready_s` column).
_REQUEST_ATTRS = attrgetter(
    "rid", "task_id", "stage_id", "agent", "kind", "prompt_tokens", "generated",
    "cached_tokens", "sent_s", "first_admitted_s", "admitted_s", "first_token_s", "finish_s",
    "preemptions", "service_s",
)  # fmt: skip


def replica_summary(
    replica: int,
    requests: pd.DataFrame,
    tasks: pd.DataFrame,
    span_s: float,
    busy_s: float | None,
    cached: float,
    prompt: float,
    preemptions: float,
    url: str | None = None,
) -> dict[str, Any]:
    """One replica's summary, as both cluster engines report it (`per_replica` of the
    simulated cluster and of SGLang replicas): its calls and tasks, the share of the run's
    span it was busy (None: not known), the calls it held on average, its prefix hit rate over
    `prompt` tokens, preemptions, finished tasks' mean JCT and its calls' mean latency."""
    latency = (requests["finish_s"] - requests["ready_s"]).to_numpy(dtype=float)
    return {
        "replica": replica, **({"url": url} if url is not None else {}),
        "requests": len(requests),
        "busy_fraction": busy_s / span_s if span_s > 0 and busy_s is not None else math.nan,
        "mean_in_system": float(latency.sum()) / span_s if span_s > 0 else math.nan,
        "prefix_hit_rate": cached / prompt if prompt else math.nan,
        "admitted_prompt_tokens": prompt,
        "preemptions": preemptions,
        "tasks_finished": len(tasks),
        "mean_jct_s": float(tasks["jct_s"].mean()) if len(tasks) else math.nan,
        "mean_latency_s": float(latency.mean()) if len(requests) else math.nan,
    }  # fmt: skip


def request_row(r: object, status: str) -> tuple[Any, ...]:
    """`r`'s row, in `REQUEST_COLUMNS` order (`_REQUEST_ATTRS`)."""
    return (*_REQUEST_ATTRS(r), status)


def task_row(t: TaskRun) -> tuple[Any, ...]:
    """`t`'s row, in `TASK_COLUMNS` order, once its `finish_s` is set (NaN: the task failed)."""
    assert t.finish_s is not None
    return (
        t.id, t.workflow, t.arrival_s, t.finish_s, t.finish_s - t.arrival_s, len(t.stages),
        t.attained_s,
    )  # fmt: skip


@dataclass(frozen=True)
class SimResult:
    requests: pd.DataFrame
    tasks: pd.DataFrame
    timeline: pd.DataFrame
    decisions: pd.DataFrame
    sim_time_s: float
    wall_s: float
    iterations: int
    preemptions: int
    prefill_tokens: int
    cached_tokens: int


class Recorder:
    def __init__(self, timeline: bool) -> None:
        self._timeline_on = timeline
        self._requests: list[tuple[Any, ...]] = []
        self._tasks: list[tuple[Any, ...]] = []
        self._timeline: list[tuple[Any, ...]] = []
        self._decisions: list[tuple[Any, ...]] = []
        self.iterations = 0
        self.preemptions = 0
        self.prompt_tokens = 0  # over every admission, re-admissions included
        self.hit_tokens = 0

    @property
    def timeline_on(self) -> bool:
        return self._timeline_on

    def iteration(self, steps: int, row: tuple[Any, ...] | None, *, merge: bool = False) -> None:
        """One iteration (or a closed-form run of `steps` decode steps); `row` is its
        timeline row (TIMELINE_COLUMNS), built by the engine only when `timeline_on`. `merge`:
        the row replaces the latest one, which it extends (the reference engine's consecutive
        decode steps of an unchanged batch are one row, as a closed-form run is)."""
        self.iterations += steps
        if row is not None:
            if merge:
                self._timeline[-1] = row
            else:
                self._timeline.append(row)

    @property
    def last_row(self) -> tuple[Any, ...] | None:
        """The latest timeline row (None before the first, or with the timeline off)."""
        return self._timeline[-1] if self._timeline else None

    def shorten_last(self, dropped_steps: int, duration_s: float, dropped_tokens: int) -> None:
        """The latest iteration run lost its last `dropped_steps` decode steps (a cluster's
        replica cut it where a request reached it, `runners.cluster.replica`): it now lasts
        `duration_s` and allocated `dropped_tokens` fewer KV tokens."""
        self.iterations -= dropped_steps
        if self._timeline_on and self._timeline:
            row = list(self._timeline[-1])
            col = _TIMELINE_INDEX
            row[col["steps"]] -= dropped_steps
            row[col["duration_s"]] = duration_s
            for name in ("new_tokens", "kv_used_tokens", "kv_private_tokens"):
                row[col[name]] -= dropped_tokens
            self._timeline[-1] = tuple(row)

    def admission(self, prompt_tokens: int, hit_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.hit_tokens += hit_tokens

    def decision(self, t_s: float, wall_s: float, waiting: int, d: Decision) -> None:
        self._decisions.append((t_s, wall_s, waiting, len(d.admit), len(d.preempt)))

    def preemption(self) -> None:
        self.preemptions += 1

    def request(self, r: object, status: str = "ok") -> None:
        self._requests.append(request_row(r, status))

    def task(self, t: TaskRun) -> None:
        self._tasks.append(task_row(t))

    def tables(self) -> dict[str, pd.DataFrame]:
        """The four tables, by name (their parquet files' stems)."""
        return {
            "requests": pd.DataFrame(self._requests, columns=REQUEST_COLUMNS),
            "tasks": pd.DataFrame(self._tasks, columns=TASK_COLUMNS),
            "timeline": pd.DataFrame(self._timeline, columns=TIMELINE_COLUMNS),
            "decisions": pd.DataFrame(self._decisions, columns=DECISION_COLUMNS),
        }

    def result(self, sim_time_s: float, wall_s: float) -> SimResult:
        t = self.tables()
        return SimResult(
            requests=t["requests"],
            tasks=t["tasks"],
            timeline=t["timeline"],
            decisions=t["decisions"],
            sim_time_s=sim_time_s,
            wall_s=wall_s,
            iterations=self.iterations,
            preemptions=self.preemptions,
            prefill_tokens=self.prompt_tokens,
            cached_tokens=self.hit_tokens,
        )
