"""Expected remaining critical paths of tasks, and the admission gain delta (DESIGN section 5).

L_i is the longest expected remaining service path of task i's DAG: a reverse topological pass
with stage weights from the shared estimator (running stages: residual service given what they
have generated; waiting and future stages: full expected service, plus the client's tool delay
for stages not yet sent). How waiting enters the path (an open choice of the paper): every
waiting stage that is not admitted now, and every future stage, also carries `horizon_s` of
expected queueing, so admitting a request removes its stage's horizon, and
`delta(r) = L_i(H) - L_i(H + r)` is the critical-path time that admitting r now saves
(`horizon_s` for a request on the critical path, less for one with slack in a DAG).
"""

from __future__ import annotations

from collections.abc import Collection

from topas_bench.schedulers.base import StageState, TaskView
from topas_bench.schedulers.estimator import ServiceEstimator


def stage_weights(task: TaskView, est: ServiceEstimator, horizon_s: float) -> dict[str, float]:
    """Expected seconds each unfinished stage still adds to its path, none of them admitted."""
    w: dict[str, float] = {}
    for sid, st in task.stages.items():
        state = st.state
        if state == StageState.DONE:
            continue
        req = st.request
        if state == StageState.RUNNING and req is not None:
            w[sid] = est.residual_service_s(req)
        elif state == StageState.WAITING and req is not None:
            w[sid] = est.residual_service_s(req) + horizon_s
        else:  # blocked or delayed: not sent yet
            w[sid] = est.stage_service_s(task.id, st) + st.delay_s + horizon_s
    return w


def longest_path(task: TaskView, weights: dict[str, float]) -> float:
    """Longest weighted path through the unfinished stages (reverse topological pass)."""
    down: dict[str, float] = {}
    best = 0.0
    for sid in reversed(list(task.stages)):
        ws = weights.get(sid)
        if ws is None:
            continue
        tail = max((down[c] for c in task.stages[sid].children if c in down), default=0.0)
        down[sid] = ws + tail
        best = max(best, down[sid])
    return best


def admission_deltas(
    task: TaskView,
    weights: dict[str, float],
    horizon_s: float,
    order: Collection[str],
) -> tuple[float, dict[str, float]]:
    """L_i(H) with nothing admitted, and delta of each waiting stage in `order`, admitted one
    after another (sequential updates: the second sees the first as admitted)."""
    w = dict(weights)
    base = longest_path(task, w)
    current = base
    deltas: dict[str, float] = {}
    if len(order) == 1 and _is_chain(task):
        # A chain: the only waiting stage is the frontier, always on the critical path.
        (sid,) = order
        deltas[sid] = min(horizon_s, base)
        return base, deltas
    for sid in order:
        w[sid] -= horizon_s
        nxt = longest_path(task, w)
        deltas[sid] = current - nxt
        current = nxt
    return base, deltas


def _is_chain(task: TaskView) -> bool:
    return all(len(st.children) <= 1 and len(st.deps) <= 1 for st in task.stages.values())
