"""`trace`: a workload trace file (docs/workload-format.md) run like any registered workload.

    topas-bench run -w my-trace.jsonl                 # = -w trace --workload-param file=...
    topas-bench run -w my-trace.jsonl --rate 0.05     # the same tasks, arrivals rescaled
    topas-bench run -w my-trace.jsonl --workload-param arrivals=poisson --load 0.8 --seed 3

Any name accepted for a workload (run, sweep files, `workloads show|export`) may be a path to a
trace: `registry.resolve` turns it into this workload with ``file`` set. Parameters:

- ``file``: the trace (``topas-bench workloads export``, ``trace import``, or written by hand).
- ``arrivals``: ``recorded`` (default) keeps the file's arrival times, scaled so that their mean
  rate is the run's rate. The file's own rate, ``tasks / last arrival`` (the estimate a Poisson
  process started at t = 0 gives), is the default, so a run without ``--rate`` replays the file
  exactly. ``poisson`` draws new Poisson arrivals at the rate from the run's seed (the file's
  order of tasks is kept). With ``recorded`` the seed changes nothing.
- ``max_tokens`` (`lengths`): ``file`` (default) sends each stage's own ``max_new_tokens``, so a
  trace runs as written; ``exact`` overrides it with the stage's ``output_tokens`` (with
  ``ignore_eos``); ``cap`` with ``max_tokens_cap`` (default 4,096) on every stage, each call
  ending at EOS after its ``output_tokens``. The true lengths never change.

Without ``--tasks`` a run takes every task of the file. Fewer tasks than the file holds are
its first by ``(arrival_s, id)``: only those are read in full (`index`; the other
lines for their id and arrival only), so `-n 1000` on a file of 300,000 tasks holds 1,000.
More tasks than the file holds repeat it: copy ``r`` of task ``X`` is ``X~r``, its segment
keys that start with ``X/`` (the task's own content: inputs, outputs) renamed to ``X~r/``, and,
with recorded arrivals, its arrival shifted by ``r`` periods (the file's last arrival). A file
whose tasks all arrive at t = 0 (one imported job) has no rate: run it as it is, or with
``arrivals=poisson`` and a rate.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from topas_bench.errors import TopasError
from topas_bench.workloads import lengths
from topas_bench.workloads.arrivals import poisson_arrivals
from topas_bench.workloads.model import Segment, Task, Workload
from topas_bench.workloads.params import parse_params
from topas_bench.workloads.trace import load_workload
from topas_bench.workloads.trace.index import TraceScan, scan
from topas_bench.workloads.trace.read import check_trace_path, show

NAME = "trace"
ARRIVALS = ("recorded", "poisson")


@dataclass(frozen=True)
class TraceFileParams:
    file: str = ""
    arrivals: str = ARRIVALS[0]
    max_tokens: str = lengths.FILE_MODES[0]
    max_tokens_cap: int = lengths.METAGPT_CAP

    def __post_init__(self) -> None:
        lengths.check_mode(self.max_tokens, lengths.FILE_MODES)
        lengths.check_cap(self.max_tokens_cap)
        if not isinstance(self.file, str) or not self.file:
            raise TopasError("file must be the path of a workload trace (JSONL)")
        if self.arrivals not in ARRIVALS:
            known = ", ".join(ARRIVALS)
            raise TopasError(f"arrivals must be one of {known}, got {self.arrivals!r}")


def load(file: str, tasks: int | None = None) -> Workload:
    """The file's workload: all of its tasks, or, given `tasks` below its count, its first
    `tasks` ones (`index`). Read once per content (a rewritten file is read again)."""
    key = _key(file)
    if tasks is not None and (first := _scan(*key, tasks).first) is not None:
        return first
    return _load(*key)


def _key(file: str) -> tuple[Path, int, int]:
    path = check_trace_path(file)
    st = path.stat()
    return path, st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=8)
def _load(path: Path, mtime_ns: int, size: int) -> Workload:
    return load_workload(path)


@functools.lru_cache(maxsize=8)
def _scan(path: Path, mtime_ns: int, size: int, keep: int) -> TraceScan:
    return scan(path, keep)


def own_rate(count: int, last_arrival_s: float) -> float | None:
    """Tasks per second of a file's arrivals (tasks / last arrival); None when all are at 0."""
    return count / last_arrival_s if last_arrival_s > 0 else None


def defaults(params: Mapping[str, Any]) -> tuple[int, float]:
    """(tasks, rate) of a run that gives neither: every task, the file's own rate (0 without
    one: its tasks arrive as recorded, all at t = 0)."""
    found = _scan(*_key(parse_params(NAME, TraceFileParams, params).file), 1)
    return found.tasks, own_rate(found.tasks, found.last_arrival_s) or 0.0


def make_trace(num_tasks: int, rate_per_s: float, seed: int, overrides: dict[str, Any]) -> Workload:
    p = parse_params(NAME, TraceFileParams, overrides)
    where = f"workload {p.file}"
    if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 1:
        raise TopasError(f"{where}: num_tasks must be a positive integer, got {num_tasks}")
    if not (math.isfinite(rate_per_s) and rate_per_s >= 0):
        raise TopasError(f"{where}: rate_per_s must be a number >= 0, got {rate_per_s}")
    lengths.check_given(where, overrides, p.max_tokens)
    found = _scan(*_key(p.file), num_tasks)  # the count and last arrival of the whole file
    w = load(p.file, num_tasks)
    try:
        base = list(lengths.apply_tasks(w.tasks, p.max_tokens, p.max_tokens_cap))
    except TopasError as e:
        raise TopasError(f"{where}: {e}") from None
    base.sort(key=lambda t: (t.arrival_s, t.id))
    k = len(base)  # all of the file, or its first `num_tasks`
    times, scale = _arrivals(p, found, base, num_tasks, rate_per_s, seed)
    tasks = tuple(
        _copy(base[i % k], i // k, float(times[i])) for i in range(num_tasks)
    )  # fmt: skip
    if num_tasks > k:
        _check_copies(p.file, base, tasks)
    params = {
        "file": p.file, "arrivals": p.arrivals, "name": w.name, "num_tasks": num_tasks,
        "rate_per_s": rate_per_s, "time_scale": scale,
        **lengths.setting(NAME, {lengths.MODE: p.max_tokens, lengths.CAP: p.max_tokens_cap}),
    }  # fmt: skip
    return Workload(w.name, w.agents, tasks, params, seed, generator=NAME)


def _arrivals(
    p: TraceFileParams, found: TraceScan, base: list[Task], n: int, rate: float, seed: int
) -> tuple[np.ndarray, float | None]:
    """Arrival times, and the factor the recorded ones were scaled by (None: Poisson)."""
    if p.arrivals == "poisson":
        if rate <= 0:
            raise TopasError(f"workload {p.file}: arrivals=poisson needs a rate (--rate or --load)")
        return poisson_arrivals(np.random.Generator(np.random.PCG64(seed)), n, rate), None
    own = own_rate(found.tasks, found.last_arrival_s)
    if own is None and rate > 0:
        raise TopasError(
            f"workload {p.file}: every task arrives at t = 0, so there is no rate to scale; "
            "run it without --rate/--load, or with --workload-param arrivals=poisson"
        )
    if own is not None and rate <= 0:
        raise TopasError(f"workload {p.file}: rate_per_s must be > 0, got {rate}")
    k = len(base)
    period = found.last_arrival_s  # the whole file's, when only its first tasks were read
    scale = own / rate if own is not None else 1.0
    times = np.array([(base[i % k].arrival_s + (i // k) * period) * scale for i in range(n)])
    return times, scale


def _check_copies(file: str, base: list[Task], tasks: tuple[Task, ...]) -> None:
    """A copy named as a task of the file is (``job1~1``, copy 1 of ``job1``, beside a task the
    file names ``job1~1``) would be a duplicate task id: say so, and why. Copies never clash
    with each other (``X~r`` splits back into X and r at its last ``~``)."""
    ids = {t.id for t in base}
    k = len(base)
    for i in range(k, len(tasks)):
        if (name := tasks[i].id) in ids:
            raise TopasError(
                f"workload {file}: -n {len(tasks):,} repeats the file's {k:,} tasks, and copy "
                f"{i // k} of task {show(base[i % k].id)} would be named {show(name)}, which "
                f"the file already uses; run at most {k:,} tasks, or rename the file's "
                f"{show(name)} (copies are named ID~N)"
            )


def _copy(t: Task, r: int, arrival_s: float) -> Task:
    if r == 0:
        return replace(t, arrival_s=arrival_s)
    new, old = f"{t.id}~{r}", f"{t.id}/"
    stages = tuple(
        replace(s, prompt=tuple(
            Segment(new + "/" + g.key[len(old):], g.tokens) if g.key.startswith(old) else g
            for g in s.prompt
        ))
        for s in t.stages
    )  # fmt: skip
    return Task(new, t.workflow, arrival_s, stages)
