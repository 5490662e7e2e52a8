"""Each task's unloaded JCT: the same task served alone, the yardstick of goodput's SLO.

"Alone" is the capacity probe's yardstick too (`experiment.measure_capacity`): the run's tasks,
in arrival order, each arriving after the previous one has finished, on the simulator with FCFS
(one task at a time, so no policy matters) and the run's preset and KV budget. The prefix cache
stays warm from the tasks before, as on a server that has been up. For the `sglang` engine this
is the cost model's estimate for the preset, not a measurement.
"""

from __future__ import annotations

from dataclasses import replace

import pandas as pd

from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, Preset
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.registry import make_policy
from topas_bench.workloads.model import Workload

#: Seconds between the spread-out arrivals: far longer than any task takes alone.
GAP_S = 1e6


def unloaded_jct(w: Workload, preset: Preset, sim: SimConfig) -> dict[str, float]:
    """Task id -> its JCT served alone (seconds)."""
    order = sorted(w.tasks, key=lambda t: (t.arrival_s, t.id))
    alone = replace(w, tasks=tuple(replace(t, arrival_s=i * GAP_S) for i, t in enumerate(order)))
    cfg = replace(sim, record_timeline=False, check_invariants=False)
    res = Simulator(alone, make_policy("fcfs"), CostModel(preset), cfg).run()
    return dict(zip(res.tasks["task_id"], res.tasks["jct_s"].astype(float), strict=True))


def with_unloaded_jct(
    tasks: pd.DataFrame, w: Workload, preset: Preset, sim: SimConfig
) -> pd.DataFrame:
    """`tasks` with the column `unloaded_jct_s`."""
    solo = unloaded_jct(w, preset, sim)
    return tasks.assign(unloaded_jct_s=tasks["task_id"].map(solo).astype(float))
