"""What every result cell must satisfy before it is written: a cell that breaks one is a bug,
reported as one (exit code 70), and never stored as a result.

`results.write_run` calls `check_cell` on every cell of every engine, before anything touches
the disk. The writer gives each task's JCT floor (`jct_floors`): the longest path through the
task's DAG of each call's least possible time plus its `delay_s`. A call's least time
(`call_floor`) is, on the engines that time calls with the cost model (`sim`, its cluster,
`sglang-cpu`), `CostModel.least_call_s`: one iteration per output token, each at least a
batch-of-one decode step over the call's context at that token (prefill, batching, queueing,
preemption and host-tier loads only add). On a real server (`sglang`) nothing is known of a
call's speed, so only the client's delays count.

The floor is not the unloaded JCT (`unloaded.py`: the task served alone under FCFS). A task
can beat that: a policy that prefetches an agent's prefix from the host tier (`kvflow`, TOPAS)
skips a load FCFS pays, and a cluster runs parallel stages on separate replicas (measured:
metagpt-tl under kvflow with a host tier, 0.07% below; dag10-wide on 4 replicas, 42% below).
So the unloaded JCT is checked like a JCT (finite, at least the floor), not used as one.

Checked, per cell: every task of the workload once, no other; arrival, finish and JCT finite,
JCT = finish - arrival, JCT >= floor; every call served (status ``ok``), its times finite and
ordered (ready <= first admitted <= admitted <= finish, first admitted <= first token <=
finish; a time an engine cannot see, NaN, is skipped), within its task's arrival and finish,
the last one finishing the task; as many calls as the task has stages.

Tolerance: float rounding only, `RTOL` (1e-6) of the floor plus `ULPS` (64) units in the last
place of the task's finish time (at most 8 microseconds for times up to 1e9 s, and never more
than 0.12 ms: at 1e301 s, where a call's time vanishes in rounding, the check still holds).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from topas_bench.workloads.model import Stage, Task, Workload
from topas_bench.workloads.trace_parse import MAX_TIME_S

if TYPE_CHECKING:
    from topas_bench.runners.sim.cost import CostModel

RTOL = 1e-6
ULPS = 64
#: Times above this get no more rounding allowance: at 1e301 s the allowance would swallow
#: any JCT, which is how a JCT lost in rounding must still be caught.
_TOP_S = 10 * MAX_TIME_S
#: A call's least possible time (s), given its stage.
CallFloor = Callable[[Stage], float]


class InvariantError(Exception):
    """A result that breaks an invariant: a bug of an engine (exit code 70), not bad input."""


def cost_floor(cost: CostModel) -> CallFloor:
    """A call's least time on an engine timed by `cost` (module docstring)."""
    return lambda s: cost.least_call_s(s.prompt_tokens, s.output_tokens)


def no_floor(s: Stage) -> float:
    """A call's least time on a real server: nothing is known."""
    return 0.0


def jct_floors(w: Workload, call_floor: CallFloor) -> dict[str, float]:
    """Task id -> its least possible JCT: the longest path of ``delay_s + call_floor`` through
    its (validated) DAG."""
    return {t.id: _longest_path(t, call_floor) for t in w.tasks}


def _longest_path(t: Task, call_floor: CallFloor) -> float:
    index = {s.id: i for i, s in enumerate(t.stages)}
    left = [len(s.deps) for s in t.stages]
    children: list[list[int]] = [[] for _ in t.stages]
    for i, s in enumerate(t.stages):
        for d in s.deps:
            children[index[d]].append(i)
    start = [0.0] * len(t.stages)  # when each stage can be sent at the earliest
    todo = deque(i for i, n in enumerate(left) if n == 0)
    longest = 0.0
    while todo:
        i = todo.popleft()
        s = t.stages[i]
        done = start[i] + s.delay_s + call_floor(s)
        longest = max(longest, done)
        for c in children[i]:
            start[c] = max(start[c], done)
            left[c] -= 1
            if left[c] == 0:
                todo.append(c)
    return longest


def check_cell(tables: Mapping[str, pd.DataFrame], jct_floor_s: Mapping[str, float]) -> None:
    """Raise `InvariantError` naming the first broken invariant (module docstring) of a cell's
    `tasks` and `requests` tables, given each task's JCT floor."""
    tasks, requests = tables["tasks"], tables["requests"]
    ids = tasks["task_id"].astype(str)
    if ids.duplicated().any():
        _fail(f"task {ids[ids.duplicated()].iloc[0]!r} appears twice")
    if set(ids) != set(jct_floor_s):
        missing = sorted(set(jct_floor_s) - set(ids))[:1] or sorted(set(ids) - set(jct_floor_s))
        _fail(f"{len(ids)} tasks recorded for {len(jct_floor_s)} in the workload (e.g. {missing})")
    arrival, finish, jct = (
        tasks[c].to_numpy(dtype=float) for c in ("arrival_s", "finish_s", "jct_s")
    )
    floor = ids.map(jct_floor_s).to_numpy(dtype=float)
    tol = RTOL * floor + ULPS * np.spacing(np.minimum(np.abs(np.nan_to_num(finish)), _TOP_S))
    _each(
        ids,
        ~(np.isfinite(arrival) & np.isfinite(finish) & np.isfinite(jct)),
        "a time is not finite",
        tasks,
    )
    _each(ids, np.abs(jct - (finish - arrival)) > tol, "JCT is not finish - arrival", tasks)
    _each(ids, jct < floor - tol, "JCT is below its floor", tasks, floor)
    if "unloaded_jct_s" in tasks:
        alone = tasks["unloaded_jct_s"].to_numpy(dtype=float)
        bad = ~np.isfinite(alone) | (alone < floor * (1 - RTOL))
        _each(ids, bad, "unloaded JCT is not finite or below the floor", tasks, floor)
    _check_requests(requests, tasks.set_index(ids))


def _check_requests(requests: pd.DataFrame, tasks: pd.DataFrame) -> None:
    if (bad := requests["status"] != "ok").any():
        row = requests[bad].iloc[0]
        _fail(
            f"call {row['task_id']}/{row['stage_id']} is in the cell with status {row['status']!r}"
        )
    ids = requests["task_id"].astype(str)
    if not ids.isin(tasks.index).all():
        _fail(f"call of an unknown task {ids[~ids.isin(tasks.index)].iloc[0]!r}")
    t = {c: requests[c].to_numpy(dtype=float) for c in _TIMES}
    arrival = ids.map(tasks["arrival_s"]).to_numpy(dtype=float)
    done = ids.map(tasks["finish_s"]).to_numpy(dtype=float)
    where = ids + "/" + requests["stage_id"].astype(str)
    _each(
        where,
        ~(np.isfinite(t["ready_s"]) & np.isfinite(t["finish_s"])),
        "a time is not finite",
        requests,
    )
    for a, b in _ORDER:  # NaN (not seen by this engine) compares False: skipped
        _each(where, t[a] > t[b], f"{a} > {b}", requests)
    _each(where, t["ready_s"] < arrival, "ready before its task arrived", requests)
    _each(where, t["finish_s"] > done, "finished after its task", requests)
    last = requests.assign(_f=t["finish_s"]).groupby(ids)["_f"].max()
    ends = tasks["finish_s"].loc[last.index].to_numpy(dtype=float)
    tol = ULPS * np.spacing(np.minimum(np.abs(ends), _TOP_S))
    _each(
        pd.Series(last.index),
        np.abs(last.to_numpy() - ends) > tol,
        "task finish is not its last call's",
        tasks,
    )
    calls = ids.value_counts().reindex(tasks.index, fill_value=0)
    _each(
        pd.Series(tasks.index),
        calls.to_numpy() != tasks["stages"].to_numpy(),
        "calls != stages",
        tasks,
    )


_TIMES = ("ready_s", "first_admitted_s", "admitted_s", "first_token_s", "finish_s")
_ORDER = (
    ("ready_s", "first_admitted_s"), ("first_admitted_s", "admitted_s"),
    ("admitted_s", "finish_s"), ("first_admitted_s", "first_token_s"),
    ("ready_s", "first_token_s"), ("first_token_s", "finish_s"),
)  # fmt: skip


def _each(
    names: pd.Series,
    bad: np.ndarray,
    what: str,
    table: pd.DataFrame,
    floor: np.ndarray | None = None,
) -> None:
    if not bad.any():
        return
    i = int(np.flatnonzero(bad)[0])
    row = table.iloc[i]
    shown = {c: row[c] for c in _SHOWN if c in row.index}
    if floor is not None:
        shown["floor"] = floor[i]
    values = ", ".join(
        f"{k} {v:.9g}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items()
    )
    _fail(f"{names.iloc[i]}: {what} ({values}); {int(bad.sum())} of {len(bad)} rows")


_SHOWN = (
    "arrival_s",
    "ready_s",
    "first_admitted_s",
    "admitted_s",
    "first_token_s",
    "finish_s",
    "jct_s",
    "unloaded_jct_s",
)


def _fail(message: str) -> None:
    raise InvariantError(f"broken result invariant: {message}")
