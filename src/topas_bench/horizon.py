"""The simulated clock's horizon: precision as a checked property, not luck.

A run's clock is a float64 of seconds. Its rounding grows with its magnitude: a double resolves
0.12 microseconds at 1e9 s, 0.12 ms at 1e12 s, and a call's service time vanishes at 1e301 s.
Every time a run can reach is therefore bounded by the clock limit `MAX_TIME_S` (1e9 s, 31.7
years, where events accumulating rounding still leave JCTs exact to well under 1 ms), which is
also the most a trace's times may be (`workloads.trace.parse`); and the clock must resolve
`RESOLUTION_S` (1 ms) at the horizon, which the limit implies (1 ms is lost only past 2^43 s,
8.8e12 s) and which is checked all the same.

Before a run (`check_plan`, from `experiment.plan_run`): the least horizon is estimated from the
workload and the preset: every task's arrival plus its JCT floor (`invariants.jct_floors`: the
longest path of delays and least call times), which no engine can beat. A run whose estimate
passes the limit is refused, naming what puts it there: the workload (its arrivals, or its
delays) or the preset (its calls' least times); so is a preset whose fastest step is too short
for the clock to time at that horizon (`STEP_ULPS`: a preset of zero overheads and 1e300
TFLOP/s made every JCT 0). After a run (`check_served`, from the harness,
before anything is written): the times the run reached; queueing can push a run past the
limit that its workload alone does not reach. The unloaded run keeps to it too (`unloaded`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from topas_bench.errors import TopasError
from topas_bench.invariants import cost_floor, jct_floors, no_floor
from topas_bench.workloads.model import Workload
from topas_bench.workloads.trace.parse import MAX_TIME_S

if TYPE_CHECKING:
    from topas_bench.runners.sim.cost import CostModel

#: The least time step the clock must resolve anywhere up to the horizon.
RESOLUTION_S = 1e-3
#: The least a preset's fastest step must span, in units in the last place of the horizon:
#: rounding then moves a step by at most 0.1%.
STEP_ULPS = 1024
LIMIT = f"the clock limit of {MAX_TIME_S:g} s (31.7 years)"
FIX_PRESET = "check the preset's speeds and overheads (peak_tflops, hbm_tbps, eta_*, c_*_us)"


def too_far(horizon_s: float) -> bool:
    """Whether a clock reaching `horizon_s` loses precision: past `MAX_TIME_S`, or where a
    double no longer resolves `RESOLUTION_S` (or not a number at all)."""
    return not (horizon_s <= MAX_TIME_S and np.spacing(horizon_s) <= RESOLUTION_S)


def check_plan(w: Workload, cost: CostModel | None, workload: str, preset: str) -> float:
    """The least horizon of a run of `w` (each task's arrival plus its JCT floor, given each
    call's least time on `cost`; None: a real server, whose calls take unknown times), or
    `TopasError` naming the input that puts it past the limit: `workload` (a task's arrival,
    or its delays) or `preset` (its calls); or whose fastest step (`cost`'s least call, one
    token after a one-token prompt) the clock cannot time there to `STEP_ULPS` units in the
    last place (a preset so fast that calls vanish in rounding: JCTs of 0)."""
    floors = jct_floors(w, no_floor if cost is None else cost_floor(cost))
    ends = {t.id: t.arrival_s + floors[t.id] for t in w.tasks}
    last = max(w.tasks, key=lambda t: (ends[t.id], t.id))
    horizon = ends[last.id]
    step = cost.least_call_s(1, 1) if cost is not None else math.inf
    if not too_far(horizon) and not step < STEP_ULPS * np.spacing(horizon):
        return horizon
    if not too_far(horizon):
        raise TopasError(
            f"preset {preset}: its fastest decode step takes {step:.3g} s, which a clock "
            f"reaching {horizon:.3g} s cannot time (it resolves {np.spacing(horizon):.3g} s "
            f"there); {FIX_PRESET}"
        )
    delays = jct_floors(Workload(w.name, w.agents, (last,)), no_floor)[last.id]
    calls = floors[last.id] - delays  # the calls' share of its longest path, about
    parts = {"arrival": last.arrival_s, "delays": delays, "calls": calls}
    why = max(parts, key=lambda k: parts[k])
    head = f"task {last.id!r} cannot finish before {horizon:.3g} s"
    if why == "arrival":
        raise TopasError(
            f"workload {workload}: {head}: it arrives at {last.arrival_s:.3g} s; that is past "
            f"{LIMIT}; run fewer tasks or a higher rate"
        )
    if why == "delays":
        raise TopasError(
            f"workload {workload}: {head}: the delay_s along its longest path add up to "
            f"{delays:.3g} s, past {LIMIT}"
        )
    raise TopasError(
        f"preset {preset}: {head}: its calls alone take at least {calls:.3g} s on this preset "
        f"(a batch-of-one decode step per output token), past {LIMIT}; {FIX_PRESET}"
    )


def check_served(tables: Mapping[str, pd.DataFrame]) -> None:
    """`TopasError` when a served cell's clock went past the limit (`too_far`): its last
    finish time, in the tasks or the calls."""
    tasks = tables["tasks"]
    finish = tasks["finish_s"].to_numpy(dtype=float)
    calls = tables["requests"]["finish_s"].to_numpy(dtype=float)
    ends = np.concatenate([finish[np.isfinite(finish)], calls[np.isfinite(calls)]])
    horizon = float(ends.max()) if len(ends) else 0.0
    if not too_far(horizon):
        return
    last = tasks["task_id"].iloc[int(np.nanargmax(finish))] if np.isfinite(finish).any() else "?"
    raise TopasError(
        f"the run's clock reached {horizon:.10g} s (task {last!r} ended last), past {LIMIT}, "
        "where it cannot time calls exactly; the cell was not written; fewer tasks, earlier "
        "arrivals or a lower load end sooner"
    )
