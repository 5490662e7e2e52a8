"""Each task's unloaded JCT: the same task served alone, the yardstick of goodput's SLO.

"Alone" is the capacity probe's yardstick too (`experiment.measure_capacity`): the run's tasks,
in arrival order, each arriving after the previous one has finished, on the simulator with FCFS
(one task at a time, so no policy matters) and the run's preset and KV budget. The prefix cache
stays warm from the tasks before, as on a server that has been up. For the `sglang` engine this
is the cost model's estimate for the preset, not a measurement.

The tasks arrive `GAP_S` apart, ten times further apart again while any of them is still
running when the next arrives (checked on the result, so "alone" is a fact, not a hope). The
gap is kept small because it sets the clock's magnitude, and so its rounding: a million tasks
1,000 s apart end near 1e9 s, where a double resolves 0.12 microseconds (the former fixed
1e6 s gap put 100,000 tasks near 1e11 s, where rounding moved metagpt-tl JCTs by 0.5 ms).

The unloaded JCT is a yardstick, not a floor: a policy can beat FCFS alone (`invariants`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import replace

import pandas as pd

from topas_bench.errors import TopasError
from topas_bench.horizon import LIMIT, too_far
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, Preset
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.registry import make_policy
from topas_bench.workloads.model import Workload

#: Seconds between the spread-out arrivals at first (longer than most tasks take alone).
GAP_S = 1e3


def unloaded_jct(w: Workload, preset: Preset, sim: SimConfig) -> dict[str, float]:
    """Task id -> its JCT served alone (seconds)."""
    order = sorted(w.tasks, key=lambda t: (t.arrival_s, t.id))
    cfg = _alone_config(sim)
    gap = GAP_S
    while True:
        if too_far((len(order) - 1) * gap):
            raise TopasError(
                f"the unloaded run (each of {len(order):,} tasks alone, {gap:g} s apart, as some "
                f"take that long) would pass {LIMIT}; run fewer tasks"
            )
        alone = replace(w, tasks=tuple(replace(t, arrival_s=i * gap) for i, t in enumerate(order)))
        res = Simulator(alone, make_policy("fcfs"), CostModel(preset), cfg).run()
        done = res.tasks.sort_values("arrival_s")
        finish, arrival = done["finish_s"].to_numpy(), done["arrival_s"].to_numpy()
        if too_far(float(finish.max())):
            raise TopasError(
                f"the unloaded run (each of {len(order):,} tasks alone) ended at "
                f"{finish.max():.3g} s, past {LIMIT}; run fewer tasks"
            )
        if (finish[:-1] <= arrival[1:]).all():  # each was alone
            return dict(zip(res.tasks["task_id"], res.tasks["jct_s"].astype(float), strict=True))
        gap *= 10


class Memo:
    """The last few unloaded runs, by workload sample, preset and engine settings: every
    scheduler of a group shares its sample, so a process serving a group's cells one after
    another runs FCFS alone once, not once per scheduler (a sweep's cells each paid it: about
    a third of a 40-task cell's time). A pure function's results, so nothing it returns can
    differ from a fresh computation (`tests/test_unloaded.py`)."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._kept: OrderedDict[tuple[str, str, str], dict[str, float]] = OrderedDict()

    def get(
        self, digest: str, w: Workload, preset: Preset, sim: SimConfig
    ) -> dict[str, float]:  # fmt: skip
        key = (digest, repr(preset), repr(_alone_config(sim)))
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key]
        solo = self._kept[key] = unloaded_jct(w, preset, sim)
        while len(self._kept) > self.size:
            self._kept.popitem(last=False)
        return solo


#: This process's memo (`Memo`); `with_unloaded_jct(..., digest=...)` uses it.
MEMO = Memo()


def _alone_config(sim: SimConfig) -> SimConfig:
    return replace(sim, record_timeline=False, check_invariants=False)


def with_unloaded_jct(
    tasks: pd.DataFrame, w: Workload, preset: Preset, sim: SimConfig, digest: str | None = None
) -> pd.DataFrame:
    """`tasks` with the column `unloaded_jct_s`; given the sample's `digest`
    (`cell.identity.workload_digest`), remembered for the next cell of the same sample (`MEMO`)."""
    solo = MEMO.get(digest, w, preset, sim) if digest else unloaded_jct(w, preset, sim)
    return tasks.assign(unloaded_jct_s=tasks["task_id"].map(solo).astype(float))
