"""Expected remaining critical paths of tasks, and the admission gain delta (docs/design.md
section 5).

L_i is the longest expected remaining service path of task i's DAG: a reverse topological pass
with stage weights from the shared estimator (running stages: residual service given what they
have generated; waiting and future stages: full expected service, plus the client's tool delay
for stages not yet sent). How waiting enters the path (an open choice of the paper): every
waiting stage that is not admitted now, and every future stage, also carries `horizon_s` of
expected queueing, so admitting a request removes its stage's horizon, and
`delta(r) = L_i(H) - L_i(H + r)` is the critical-path time that admitting r now saves
(`horizon_s` for a request on the critical path, less for one with slack in a DAG). Parallel
waiting branches share their joint reduction (see `task_path`).

`TaskPath` keeps the result in a form that stays valid as the horizon moves: the critical
path's service part and its number of horizon-carrying stages, and each waiting stage's delta
as a fraction of the horizon.

L_i above is LP(E[Z]), the longest path over expected stage times. The paper's quantity is
E[LP(Z)], larger where parallel branches each may run long. With `samples` N > 0 (TOPAS's
`path_samples`) `task_path` estimates it by Monte Carlo: N draws of every unfinished stage's
remaining output (`ServiceEstimator.residual_tokens_sample`: quantiles of the lengths seen
above what it generated; its prefill and tool delay stay at their expectation), from a
generator seeded by the task id alone (common random numbers: the same task draws the same
quantiles at every decision, so its path moves only with what changed). L_i, its service part
and horizon hops (then fractional), and each waiting stage's share are the means over the
draws. A chain is a sum, so E[LP(Z)] = LP(E[Z]): no sampling.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from topas_bench.schedulers.base import StageState
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.schedulers.view import TaskView


@dataclass(frozen=True, slots=True)
class TaskPath:
    service_s: float  # expected service along the critical path (no queueing)
    hops: float  # stages on it that carry a horizon of expected queueing (mean over draws)
    delta_share: dict[str, float]  # waiting stage -> delta / horizon

    def length(self, horizon_s: float) -> float:
        """L_i at horizon `horizon_s`."""
        return self.service_s + self.hops * horizon_s


def stage_weights(
    task: TaskView, est: ServiceEstimator, draw: Mapping[str, float] | None = None
) -> dict[str, tuple[float, int]]:
    """(expected service seconds, carries a horizon) of each unfinished stage; with `draw`
    (stage -> quantile), its output part at that quantile instead of its mean."""
    w: dict[str, tuple[float, int]] = {}
    tpot = est.tpot_s
    for sid, st in task.stages.items():
        state = st.state
        if state == StageState.DONE:
            continue
        req = st.request
        if state == StageState.RUNNING and req is not None:
            w[sid] = (est.residual_service_s(req), 0)
        elif state == StageState.WAITING and req is not None:
            w[sid] = (est.residual_service_s(req), 1)
        else:  # blocked or delayed: not sent yet
            w[sid] = (est.stage_service_s(task.id, st) + st.delay_s, 1)
        if draw is not None:
            gen = req.generated if req is not None else 0
            key = (task.id, sid)
            mean = est.residual_tokens(st.agent, st.kind, gen, key)
            got = est.residual_tokens_sample(st.agent, st.kind, gen, draw[sid], key)
            svc, hop = w[sid]
            w[sid] = (max(svc + (got - mean) * tpot, 0.0), hop)
    return w


def longest_path(
    task: TaskView, weights: dict[str, tuple[float, int]], horizon_s: float
) -> tuple[float, float, int]:
    """(length, service part, horizon hops) of the longest path through unfinished stages."""
    down: dict[str, tuple[float, float, int]] = {}
    best = (0.0, 0.0, 0)
    for sid in reversed(list(task.stages)):
        ws = weights.get(sid)
        if ws is None:
            continue
        svc, hop = ws
        tail = max(
            (down[c] for c in task.stages[sid].children if c in down),
            default=(0.0, 0.0, 0),
        )
        here = (svc + hop * horizon_s + tail[0], svc + tail[1], hop + tail[2])
        down[sid] = here
        best = max(best, here)
    return best


def task_path(
    task: TaskView,
    est: ServiceEstimator,
    horizon_s: float,
    waiting: Sequence[str],
    samples: int = 0,
) -> TaskPath:
    """`_task_path` over expected stage times (LP(E[Z])); with `samples` > 0, the mean of
    `samples` draws of the stage times (E[LP(Z)], see the module docstring)."""
    if samples <= 0 or _is_chain(task):
        return _task_path(task, stage_weights(task, est), horizon_s, waiting)
    sids = list(task.stages)
    rng = np.random.default_rng(zlib.crc32(task.id.encode()))
    quantiles = rng.random((samples, len(sids)))
    service = hops = 0.0
    shares = dict.fromkeys(waiting, 0.0)
    for row in quantiles:
        draw = dict(zip(sids, row.tolist(), strict=True))
        p = _task_path(task, stage_weights(task, est, draw), horizon_s, waiting)
        service += p.service_s
        hops += p.hops
        for sid, x in p.delta_share.items():
            shares[sid] += x
    n = float(samples)
    return TaskPath(service / n, hops / n, {sid: x / n for sid, x in shares.items()})


def _task_path(
    task: TaskView, w: dict[str, tuple[float, int]], horizon_s: float, waiting: Sequence[str]
) -> TaskPath:
    """L_i and each waiting stage's share of the path reduction from admitting them.

    One waiting stage: its delta is `L(H) - L(H + r)`. Several (parallel branches): admitting
    all of them shortens the path by `L(none) - L(all)`, and each gets a share of that in
    proportion to its leave-one-out marginal `L(all but r) - L(all)` (equal shares if no single
    one matters). Sequential updates in a fixed order would give the whole reduction to the
    last branch and none to the others, so a pack could never see the value of starting the
    first ones; the shares sum to the same joint reduction.
    """
    length, service, hops = longest_path(task, w, horizon_s)
    shares: dict[str, float] = {}
    if horizon_s <= 0 or not hops:
        return TaskPath(service, hops, dict.fromkeys(waiting, 0.0))
    if len(waiting) == 1 and _is_chain(task):
        # A chain: the only waiting stage is the frontier, always on the critical path.
        return TaskPath(service, hops, {waiting[0]: 1.0})
    admitted = dict(w)
    for sid in waiting:
        admitted[sid] = (w[sid][0], 0)
    floor = longest_path(task, admitted, horizon_s)[0]
    total = length - floor
    marginal = {}
    for sid in waiting:
        admitted[sid] = w[sid]
        marginal[sid] = longest_path(task, admitted, horizon_s)[0] - floor
        admitted[sid] = (w[sid][0], 0)
    weight = sum(marginal.values())
    for sid in waiting:
        part = marginal[sid] / weight if weight > 0 else 1.0 / len(waiting)
        shares[sid] = total * part / horizon_s
    return TaskPath(service, hops, shares)


def _is_chain(task: TaskView) -> bool:
    return all(len(st.children) <= 1 and len(st.deps) <= 1 for st in task.stages.values())
