"""Hand-built result directories with known JCTs, for the report, figure and compare tests.

`write_fixture(root)` writes chain3 at load 0.8 (fcfs, lpm, topas, topas-base; seeds 0 and 1;
four tasks each) and a second chain3 group at load 0.6, with these JCTs (seconds):

    fcfs   seed 0: 10 20 30 40   seed 1: 20 30 40 50   means 25, 35 -> 30
    lpm    seed 0: 10 20 30 60   seed 1: 10 20 30 40   means 30, 25 -> 27.5
    topas  seed 0: 10 10 20 40   seed 1: 10 20 20 30   means 20, 20 -> 20
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench.cell.identity import RunIdentity
from topas_bench.cell.write import write_run
from topas_bench.results import meta_digest, table_digest
from topas_bench.runners.records import (
    DECISION_COLUMNS,
    REQUEST_COLUMNS,
    TIMELINE_COLUMNS,
)

JCTS = {
    "fcfs": ([10, 20, 30, 40], [20, 30, 40, 50]),
    "lpm": ([10, 20, 30, 60], [10, 20, 30, 40]),
    "topas": ([10, 10, 20, 40], [10, 20, 20, 30]),
    "topas-base": ([12, 12, 24, 48], [12, 24, 24, 36]),
}
DECISION_WALL_S = [0.001, 0.002, 0.003]
COUNTERS = (
    {"admitted_prompt_tokens": 100.0, "cached_prompt_tokens": 50.0, "preemptions": 2.0},
    {"admitted_prompt_tokens": 100.0, "cached_prompt_tokens": 30.0, "preemptions": 4.0},
)
RATES = {0.8: 0.2, 0.6: 0.15}


def identity(
    scheduler: str,
    seed: int,
    load: float = 0.8,
    workload: str = "chain3",
    kv: int = 18_692,
    params: dict[str, Any] | None = None,
) -> RunIdentity:
    return RunIdentity(
        workload=workload, num_tasks=4, rate_per_s=RATES[load], seed=seed, scheduler=scheduler,
        preset="a100-qwen32b", kv_budget_tokens=kv, scheduler_params=params or {},
    )  # fmt: skip


def write_one(
    root: Path,
    scheduler: str,
    seed: int,
    jcts: list[float],
    *,
    load: float = 0.8,
    digest: str | None = None,
    workload: str = "chain3",
    kv: int = 18_692,
    params: dict[str, Any] | None = None,
) -> Path:
    ident = identity(scheduler, seed, load, workload, kv, params)
    arrival = [float(i) for i in range(len(jcts))]
    tasks = pd.DataFrame({
        "task_id": [f"t{i:04d}" for i in range(len(jcts))], "workflow": workload,
        "arrival_s": arrival, "finish_s": [a + j for a, j in zip(arrival, jcts, strict=True)],
        "jct_s": [float(j) for j in jcts], "stages": 3, "attained_s": [float(j) for j in jcts],
    })  # fmt: skip
    timeline = pd.DataFrame(
        [(0.0, "prefill", 1, 1.0, 1, 100, 5000, 4000, 1000, 2, "A", 1),
         (1.0, "decode", 10, 4.0, 2, 20, 9000, 8000, 1000, 1, "A|B", 2),
         (5.0, "prefill", 1, 2.0, 1, 100, 12000, 9000, 3000, 0, "B|C", 1),
         (7.0, "decode", 5, 3.0, 1, 5, 6000, 5000, 1000, 0, "", 1)],
        columns=TIMELINE_COLUMNS,
    )  # fmt: skip
    decisions = pd.DataFrame(
        [(float(i), w, 1, 1, 0) for i, w in enumerate(DECISION_WALL_S)], columns=DECISION_COLUMNS
    )
    tables = {
        "tasks": tasks, "requests": _requests(tasks),
        "timeline": timeline, "decisions": decisions,
    }  # fmt: skip
    info = {
        "summary": {}, "counters": COUNTERS[seed % 2], "sim_time_s": 100.0, "wall_s": 0.1,
        "load": load, "capacity_tps": RATES[load] / load,
        "workload_digest": digest or f"{workload}-{load}-{seed}",
    }  # fmt: skip
    run_dir = ident.run_dir(root)
    write_run(run_dir, ident, tables, info, jct_floor_s=dict.fromkeys(tasks["task_id"], 0.0))
    return run_dir


def _requests(tasks: pd.DataFrame) -> pd.DataFrame:
    """Three calls per task, one after another, filling its JCT (the cell must pass
    `invariants.check_cell`)."""
    rows: list[tuple[Any, ...]] = []
    for t in tasks.to_dict("records"):
        a0, jct, end = float(t["arrival_s"]), float(t["jct_s"]), float(t["finish_s"])
        cuts = [a0 + jct * k / 3 for k in range(3)] + [end]
        for k in range(3):
            a, b = cuts[k], cuts[k + 1]
            first = a + (b - a) / 4  # a TTFT above 0: request metrics compare as ratios
            row = (len(rows), t["task_id"], f"s{k}", "A", "", 100, 10, 0, a, a, a, first, b, 0)
            rows.append((*row, b - a, "ok"))
    return pd.DataFrame(rows, columns=REQUEST_COLUMNS)


def write_fixture(root: Path) -> Path:
    for load in (0.8, 0.6):
        for scheduler, per_seed in JCTS.items():
            if load == 0.6 and scheduler == "topas-base":
                continue
            for seed, jcts in enumerate(per_seed):
                scale = 0.8 if load == 0.6 else 1.0
                write_one(root, scheduler, seed, [j * scale for j in jcts], load=load)
    return root


def rewrite(run_dir: Path, tables: dict[str, pd.DataFrame] | None = None, **meta: Any) -> None:
    """Rewrite a stored cell as a writer would have written it (row counts and digests
    computed afresh): a cell of other code or other settings, for the tests that need one.
    A user who does this by hand is out of what digests detect (docs/reliability.md)."""
    m = json.loads((run_dir / "run.json").read_text())
    for name, df in (tables or {}).items():
        path = run_dir / f"{name}.parquet"
        df.to_parquet(path, index=False)
        m["rows"][name] = len(df)
        m["digests"][name] = table_digest(m["identity"], name, path.read_bytes())
        m["bytes"][name] = path.stat().st_size
    m.update(meta)
    m["meta_digest"] = meta_digest(m)
    (run_dir / "run.json").write_text(json.dumps(m))


def stretch(run_dir: Path, factor: float) -> None:
    """Every task's JCT times `factor` (> 1), as a run that gave those JCTs would store it:
    each task's last call ends at the task's new finish (its service, and the task's attained
    service, longer by as much), other calls as they were; then `rewrite`."""
    t, r = (pd.read_parquet(run_dir / f"{n}.parquet") for n in ("tasks", "requests"))
    old = r["task_id"].map(dict(zip(t["task_id"], t["finish_s"], strict=True)))
    t["jct_s"] *= factor
    t["finish_s"] = t["arrival_s"] + t["jct_s"]
    new = r["task_id"].map(dict(zip(t["task_id"], t["finish_s"], strict=True)))
    last = r["finish_s"] == old
    delta = (new - r["finish_s"]).where(last, 0.0)
    r["service_s"] += delta
    r["finish_s"] = r["finish_s"].where(~last, new)
    t["attained_s"] += t["task_id"].map(delta.groupby(r["task_id"]).sum())
    rewrite(run_dir, {"tasks": t, "requests": r})
