"""A real cluster cell's per-replica tables and summaries (`run --engine sglang --replicas N`).

The client sees the router, not the replicas. The requests table adds `sent_s` (when the
answered attempt left the client, after its own queue and prompt check: about when the router
routed it) and `replica`: the worker that answered, when the answer names one
(`system_fingerprint` set to the worker's base URL, as the test workers do), else the one
replica whose server log has the plugin's line for that call (`request_log`: SGLang leaves
the fingerprint empty); -1 when neither tells (an untagged call, or a call retried on two
replicas). Each replica's timeline comes from its own server log
(`calibrate.timeline_from_log`), so busy time and batch sizes are per replica whatever the
answers say. The layout is the simulated cluster's (`runners.cluster.runner`): a `replica`
column in every table, `replicas_used` per task, and `run.json`'s `cluster` with
`per_replica` summaries and the router's registry order.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from topas_bench.runners.records import TIMELINE_COLUMNS, replica_summary
from topas_bench.runners.sglang.fleet import Fleet


def replica_tables(
    fleet: Fleet, requests: pd.DataFrame, served_by: list[str], tasks: pd.DataFrame
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(requests, tasks, timeline) with replica columns; `served_by` is in `requests`' order."""
    from topas_bench.runners.cluster.runner import with_replicas_used
    from topas_bench.runners.sglang.calibrate import timeline_from_log
    from topas_bench.runners.sglang.request_log import served

    logs = [w.log_text() for w in fleet.workers]  # read once: calls served, then timelines
    logged: dict[tuple[str, str], int] = {}
    for i, text in enumerate(logs):
        for key in served(text):
            logged[key] = i if key not in logged else -1  # in two logs: ambiguous
    keys = zip(requests["task_id"].astype(str), requests["stage_id"].astype(str), strict=True)
    requests = requests.assign(
        replica=[
            fleet.replica(u) if u else logged.get(key, -1)
            for u, key in zip(served_by, keys, strict=True)
        ]
    )
    last = requests.sort_values("finish_s").groupby("task_id")["replica"].last()
    tasks = tasks.assign(replica=tasks["task_id"].map(last).fillna(-1).astype("int64"))
    tasks = with_replicas_used(tasks, requests)
    frames = [timeline_from_log(text).assign(replica=i) for i, text in enumerate(logs)]
    timeline = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if timeline.empty:
        timeline = pd.DataFrame([], columns=[*TIMELINE_COLUMNS, "replica"])
    else:
        timeline = timeline.sort_values(["t_s", "replica"], kind="stable").reset_index(drop=True)
    return requests, tasks, timeline


def per_replica(
    fleet: Fleet, requests: pd.DataFrame, tasks: pd.DataFrame, timeline: pd.DataFrame
) -> list[dict[str, Any]]:
    """As the simulator's (`runners.cluster.runner.per_replica`), from what a client and the
    server logs see: no preemptions; the hit rate over the calls whose answer reported it."""
    span = float(tasks["finish_s"].max() - tasks["arrival_s"].min()) if len(tasks) else 0.0
    out = []
    for i, w in enumerate(fleet.workers):
        q = requests[(requests["replica"] == i) & (requests["status"] == "ok")]
        t = tasks[tasks["replica"] == i]
        tl = timeline[timeline["replica"] == i]
        cached = q["cached_tokens"].astype(float)
        prompt = float(q["prompt_tokens"][cached.notna()].sum())
        busy = float(tl["duration_s"].astype(float).sum()) if len(tl) else None
        out.append(replica_summary(i, q, t, span, busy, float(cached.sum()), prompt, math.nan,
                                   url=w.url))  # fmt: skip
    return out
