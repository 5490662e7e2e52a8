"""What every result cell must satisfy before it is written: a cell that breaks one is a bug,
reported as one (exit code 70), and never stored as a result.

`cell.write.write_run` calls `check_cell` on every cell of every engine, before anything touches
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
from topas_bench.workloads.trace.parse import MAX_TIME_S

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
    """A result that breaks an invariant: a bug of an engine (exit code 70), not bad input.
    `table`: the table it is in (`tasks`, `requests`), when one is to blame."""

    def __init__(self, message: str, table: str | None = None) -> None:
        super().__init__(message)
        self.table = table


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
    `tasks` and `requests` tables, given each task's JCT floor: the check on write."""
    tasks = tables["tasks"]
    ids = _ids(tasks)
    if set(ids) != set(jct_floor_s):
        missing = sorted(set(jct_floor_s) - set(ids))[:1] or sorted(set(ids) - set(jct_floor_s))
        _fail(f"{len(ids)} tasks recorded for {len(jct_floor_s)} in the workload (e.g. {missing})")
    floor = np.fromiter((jct_floor_s[i] for i in ids), float, len(ids))
    _check_tables(tasks, tables["requests"], ids, floor)


def check_stored(tables: Mapping[str, pd.DataFrame], num_tasks: int) -> None:
    """Raise `InvariantError` naming the first broken invariant of a stored cell's `tasks` and
    `requests` tables: the check on read, of what the tables prove without the workload and
    preset that give the floors. Every invariant of the module docstring but JCT >= floor, as
    many tasks as the run's identity says, and `_check_tables`' own. A table of the wrong shape
    (a column missing, a time that is not a number) is broken too."""
    for name, cols in (("tasks", _TASK_COLS), ("requests", _REQUEST_COLS)):
        if missing := [c for c in cols if c not in tables[name].columns]:
            _fail(f"no column {missing[0]!r}", name)
    tasks = tables["tasks"]
    try:
        ids = _ids(tasks)
        if len(ids) != num_tasks:
            _fail(f"{len(ids)} tasks recorded for {num_tasks} in the run's identity", "tasks")
        _check_tables(tasks, tables["requests"], ids, None)
    except (TypeError, ValueError) as e:  # e.g. a time column of strings
        _fail(f"a column is not numeric ({str(e)[:80]})")


def _ids(tasks: pd.DataFrame) -> np.ndarray:
    """The task ids as strings, each once (else the `InvariantError`)."""
    ids = tasks["task_id"].to_numpy().astype(str)
    order = np.argsort(ids, kind="stable")
    twice = ids[order][1:] == ids[order][:-1]
    if twice.any():
        _fail(f"task {ids[order][1:][twice][0]!r} appears twice", "tasks")
    return ids


def _check_tables(
    tasks: pd.DataFrame, requests: pd.DataFrame, ids: np.ndarray, floor: np.ndarray | None
) -> None:
    """Beyond the module docstring's: JCT > 0, the unloaded JCT > 0, no stage's call twice, a
    call's service (time in batches) within its span, a task's attained service the sum of its
    calls' (1e-6 relative)."""
    arrival, finish, jct, attained = (
        tasks[c].to_numpy(dtype=float) for c in ("arrival_s", "finish_s", "jct_s", "attained_s")
    )
    ulp = ULPS * np.spacing(np.minimum(np.abs(np.nan_to_num(finish)), _TOP_S))
    # on read the floor is unknown: 1e-6 of the JCT bounds the write side's 1e-6 of the floor
    bound = floor if floor is not None else np.abs(np.nan_to_num(jct))
    tol = RTOL * bound + ulp * (1 if floor is not None else 2)
    where = _Rows(tasks, "tasks", ids)
    where.each(
        ~(np.isfinite(arrival) & np.isfinite(finish) & np.isfinite(jct)), "a time is not finite"
    )
    where.each(np.abs(jct - (finish - arrival)) > tol, "JCT is not finish - arrival")
    if floor is not None:
        where.each(jct < floor - tol, "JCT is below its floor", floor)
    where.each(~(jct > 0), "JCT is not positive")
    if "unloaded_jct_s" in tasks:
        alone = tasks["unloaded_jct_s"].to_numpy(dtype=float)
        bad = ~(np.isfinite(alone) & (alone > 0))
        if floor is not None:
            bad |= alone < floor * (1 - RTOL)
        where.each(bad, "unloaded JCT is not finite or below the floor", floor)
    where.each(~(np.isfinite(attained) & (attained >= 0)), "attained service is not >= 0")
    _check_requests(requests, where, (arrival, finish, attained))


class _Rows:
    """A table and its rows' names (`ids`, and `stages` for calls): `each` names the first
    bad row in the `InvariantError`."""

    def __init__(
        self, table: pd.DataFrame, name: str, ids: np.ndarray, stages: np.ndarray | None = None
    ) -> None:
        self.table, self.name, self.ids, self.stages = table, name, ids, stages

    def each(self, bad: np.ndarray, what: str, floor: np.ndarray | None = None) -> None:
        if not bad.any():
            return
        i = int(np.flatnonzero(bad)[0])
        row = self.table.iloc[i]
        shown = {c: row[c] for c in _SHOWN if c in row.index}
        if floor is not None:
            shown["floor"] = floor[i]
        values = ", ".join(
            f"{k} {v:.9g}" if isinstance(v, float) else f"{k} {v}" for k, v in shown.items()
        )
        name = self.ids[i] if self.stages is None else f"{self.ids[i]}/{self.stages[i]}"
        _fail(f"{name}: {what} ({values}); {int(bad.sum())} of {len(bad)} rows", self.name)


def _check_requests(
    requests: pd.DataFrame,
    tasks: _Rows,
    task_times: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    arrival, done, attained = task_times
    rids = requests["task_id"].to_numpy().astype(str)
    stage_ids = requests["stage_id"].to_numpy().astype(str)
    calls = _Rows(requests, "requests", rids, stage_ids)
    status = requests["status"].to_numpy()
    if (bad := status != "ok").any():
        calls.each(bad, f"in the cell with status {str(status[bad][0])!r}")
    if not len(tasks.ids):
        _fail("no tasks", "tasks")
    order = np.argsort(tasks.ids)  # each call's task: its row in `tasks`
    pos = order[np.searchsorted(tasks.ids, rids, sorter=order).clip(0, len(order) - 1)]
    calls.each(tasks.ids[pos] != rids, "a call of an unknown task")
    t = {c: requests[c].to_numpy(dtype=float) for c in _TIMES}
    calls.each(~(np.isfinite(t["ready_s"]) & np.isfinite(t["finish_s"])), "a time is not finite")
    for a, b in _ORDER:  # NaN (not seen by this engine) compares False: skipped
        calls.each(t[a] > t[b], f"{a} > {b}")
    calls.each(t["ready_s"] < arrival[pos], "ready before its task arrived")
    calls.each(t["finish_s"] > done[pos], "finished after its task")
    stage = np.unique(stage_ids, return_inverse=True)[1].ravel()
    key = pos.astype(np.int64) * (int(stage.max(initial=0)) + 1) + stage
    by_key = np.argsort(key, kind="stable")
    twice = np.zeros(len(key), bool)
    twice[by_key[1:]] = key[by_key][1:] == key[by_key][:-1]
    calls.each(twice, "a stage's call appears twice")
    span = t["finish_s"] - t["ready_s"]
    service = requests["service_s"].to_numpy(dtype=float)
    slack = RTOL * span + ULPS * np.spacing(np.minimum(np.abs(t["finish_s"]), _TOP_S))
    calls.each(~((service >= 0) & (service <= span + slack)), "service is not within the call")
    n = len(tasks.ids)
    last = np.full(n, -np.inf)
    np.maximum.at(last, pos, t["finish_s"])
    tasks.each(
        np.abs(last - done) > ULPS * np.spacing(np.minimum(np.abs(done), _TOP_S)),
        "task finish is not its last call's",
    )
    stages = tasks.table["stages"].to_numpy()
    tasks.each(np.bincount(pos, minlength=n) != stages, "calls != stages")
    total = np.bincount(pos, weights=service, minlength=n)
    off = np.abs(attained - total) > RTOL * attained + ULPS * np.spacing(attained)
    tasks.each(off, "attained service is not the sum of its calls'")


_TIMES = ("ready_s", "first_admitted_s", "admitted_s", "first_token_s", "finish_s")
_ORDER = (
    ("ready_s", "first_admitted_s"), ("first_admitted_s", "admitted_s"),
    ("admitted_s", "finish_s"), ("first_admitted_s", "first_token_s"),
    ("ready_s", "first_token_s"), ("first_token_s", "finish_s"),
)  # fmt: skip
_TASK_COLS = ("task_id", "arrival_s", "finish_s", "jct_s", "stages", "attained_s")
_REQUEST_COLS = ("task_id", "stage_id", "status", "service_s", *_TIMES)
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


def _fail(message: str, table: str | None = None) -> None:
    raise InvariantError(f"broken result invariant: {message}", table)
