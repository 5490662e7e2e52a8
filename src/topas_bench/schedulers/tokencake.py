"""`tokencake`: a score-ordered queue, KV reserved for the top agent types, and a stalled call's
context offloaded to the host tier during its tool wait and uploaded before the tool returns.

TokenCake (Bian et al., "Tokencake: A KV-Cache-centric Serving Framework for LLM-based
Multi-Agent Applications", arXiv 2510.18586; code pku-lemonade/TokenCake, a vLLM fork). Read:
`vllm/tokencake/scheduling.py` (`request_score`, `AgentHistory.score`, `partition_capacity`,
`SchedulingController.begin_step`), `vllm/tokencake/offload_policy.py` (`evaluate_benefit`),
`vllm/tokencake/lifecycle.py` (`_predict`, `_learn`, `set_h2d_estimate`),
`vllm/tokencake/config.py` (the defaults) and `docs/features/tokencake.md`. Mirrored:

- **Queue**: waiting requests in descending score, the repository's `request_score` with its
  weights (`WEIGHTS`) over what our view has: the stage's depth, the stages left below it,
  out- and in-degree, whether it lies on a longest path of its DAG (`critical_path`), whether
  at most one stage follows (`near_completion`), the task's age and the request's wait (capped
  at 300 s and 180 s, scaled up by the remaining fraction of the DAG), progress; the client's
  `importance` and `similarity` are neutral (the same for every request). Branches that meet
  at a join take the highest score of their live group (`inherit_join_priority`, on by
  default there).
- **Space scheduler**: every `adjust_every_s` the agent types are scored (`AgentHistory.score`:
  urgency from their waiting requests, cost from their tokens, graph position), the top
  `critical_ratio` of them are critical, and the reserved fraction of the KV budget moves by
  `reserve_step` up when usage is at or above `usage_high`, down at or below `usage_low`,
  within [`reserve_min`, `reserve_max`] = [0.05, 0.30]. The reservation is carried out with
  the engine's kept prefixes: the critical agents' prefixes, in score order, are kept on the
  GPU while they fit the reserved tokens (`Decision.keep_prefixes`; the engine takes pins only
  within the admission budget).
- **Time scheduler**: when a call finishes and its task's next call of the same agent will
  extend its context, the predicted stall is the time until that call is sent (expected
  service of the stages between, and tool times as observed: an exponentially weighted mean,
  weight 0.5, 1 s before any, `lifecycle._predict`/`_learn`); the context's own part (below the
  agent prefix) is offloaded to the host tier when `offload_worth(stall, transfer)`
  (`evaluate_benefit`: the stall exceeds the transfer and the margin is at least
  max(0.05 s, 2 x transfer)), and uploaded `max(0.10 s, 1.25 x transfer)` before the
  predicted return (`set_h2d_estimate`). Otherwise the context is left in the cache,
  evictable (vLLM's prefix cache does the same with a finished request's blocks).

Simplifications (docs/schedulers.md): the repository's offload benefit score (pressure, fit
and importance terms, the emergency path) is reduced to its stall/transfer rule; reserved
capacity is the critical agents' prefixes kept on the GPU, not a block partition with
borrowing; the agent scores use the live requests and stages, not a decayed history; the
reserve adapts every `adjust_every_s` seconds of server time (the repository: every 500
scheduler steps; 10 s is ours, about 500 decode steps of a 32B model); D2H copies are free
(the host tier's evictions are). Without a host tier nothing is offloaded.
"""

from __future__ import annotations

import math

from topas_bench.schedulers.base import (
    DROP,
    ContextAction,
    Decision,
    Policy,
    RequestView,
    StageState,
)
from topas_bench.schedulers.toolwait import Shape, host_load_s, shapes, stall_s, usage
from topas_bench.schedulers.validate import InvalidParameter, flag, number
from topas_bench.schedulers.view import EngineView, TaskView

#: `request_score`'s weights (pku-lemonade/TokenCake `vllm/tokencake/scheduling.py`).
WEIGHTS = {
    "depth": 15.0, "out_degree": 45.0, "in_degree": 10.0, "remaining": 20.0, "age": 5.0,
    "queue": 8.0, "completion": 5.0, "critical_path": 180.0, "near_completion": 90.0,
    "join_group": 20.0, "dependency_depth": 4.0, "fanout": 12.0,
}  # fmt: skip


def offload_worth(stall_s: float, transfer_s: float) -> bool:
    """TokenCake's profitability rule (`evaluate_benefit`): offload only when the predicted
    stall exceeds the transfer and leaves a margin of at least max(0.05 s, 2 x transfer)."""
    return stall_s > transfer_s and stall_s - transfer_s >= max(0.05, 2.0 * transfer_s)


def upload_lead_s(transfer_s: float) -> float:
    """How long before the predicted return the upload starts (`set_h2d_estimate`)."""
    return max(0.10, 1.25 * transfer_s)


def adapt_reserve(ratio: float, used: float, p: TokenCake) -> float:
    """One adjustment of the reserved fraction (`SchedulingController.begin_step`)."""
    if used >= p.usage_high:
        ratio += p.reserve_step
    elif used <= p.usage_low:
        ratio -= p.reserve_step
    return min(p.reserve_max, max(p.reserve_min, ratio))


class TokenCake(Policy):
    """Score-ordered queue; KV reserved for top agents; offload during tool waits."""

    name = "tokencake"

    reserve_min = number(0.05, high=1.0)
    reserve_max = number(0.30, high=1.0)
    reserve_step = number(0.05, strict=True, high=1)
    usage_low = number(0.40, high=1.0)
    usage_high = number(0.75, high=1.0)
    critical_ratio = number(0.75, strict=True, high=1.0)
    adjust_every_s = number(10.0, strict=True)
    offload = flag(True)

    def setup(self) -> None:
        n = self.name
        if self.reserve_min > self.reserve_max:
            raise InvalidParameter(f"{n}: reserve_min must not exceed reserve_max")
        if self.usage_low >= self.usage_high:
            raise InvalidParameter(f"{n}: usage_low must be below usage_high")
        self.reserve_ratio = self.reserve_min  # the repository starts at the minimum
        self._adjusted_s = -math.inf
        self._kept: frozenset[str] = frozenset()
        self._shapes: dict[str, dict[str, Shape]] = {}

    def _shape(self, task: TaskView) -> dict[str, Shape]:
        got = self._shapes.get(task.id)
        if got is None:
            got = self._shapes[task.id] = shapes(task)
        return got

    def score(self, req: RequestView, view: EngineView) -> float:
        """`request_score` of a waiting or running request."""
        task = view.tasks[req.task_id]
        sh = self._shape(task)[req.stage_id]
        st = task.stages[req.stage_id]
        depth, remaining = sh.depth - 1, sh.remaining - 1
        top = max(depth, sh.longest - 1, 1)
        left = min(1.0, remaining / top)
        elapsed = max(0.0, view.now_s - task.arrival_s)
        wait = max(0.0, view.now_s - req.queued_s)
        joins = any(len(task.stages[c].deps) > 1 for c in st.children)
        w = WEIGHTS
        return (
            w["depth"] * depth
            + w["out_degree"] * len(st.children)
            + w["in_degree"] * len(st.deps)
            + w["remaining"] * remaining
            + w["age"] * min(elapsed, 300.0) * (1.0 + 0.75 * left)
            + w["queue"] * min(wait, 180.0) * (1.0 + 0.5 * left)
            + w["completion"] * min(elapsed, 240.0) * min(1.0, depth / top)
            + w["critical_path"] * (sh.depth + sh.remaining - 1 == sh.longest)
            + w["near_completion"] * (remaining <= 1)
            + w["join_group"] * joins
            + w["dependency_depth"] * depth
            + w["fanout"] * max(len(st.children) - 1, 0)
        )

    def _scores(self, view: EngineView) -> dict[int, tuple[float, float]]:
        """rid -> (score with join inheritance, own score), for waiting and running requests."""
        own = {r.rid: self.score(r, view) for r in (*view.waiting, *view.running)}
        best: dict[tuple[str, str], float] = {}
        groups: dict[int, list[tuple[str, str]]] = {}
        for r in (*view.waiting, *view.running):
            task = view.tasks[r.task_id]
            keys = [
                (r.task_id, c)
                for c in task.stages[r.stage_id].children
                if len(task.stages[c].deps) > 1
            ]
            groups[r.rid] = keys
            for k in keys:
                best[k] = max(best.get(k, -math.inf), own[r.rid])
        return {rid: (max([s, *(best[k] for k in groups[rid])]), s) for rid, s in own.items()}

    def agent_scores(self, view: EngineView) -> dict[str, float]:
        """Per agent type with unfinished stages in live tasks, `AgentHistory.score` over them:
        urgency (its waiting requests' mean wait and count, their preemptions), cost (its
        calls' mean tokens) and graph position (mean depth, degrees, stages left, task age)."""
        acc: dict[str, list[float]] = {}
        for task in view.tasks.values():
            sh = self._shape(task)
            for sid, st in task.stages.items():
                if st.state == StageState.DONE:
                    continue
                s = sh[sid]
                req = st.request
                a = acc.setdefault(st.agent, [0.0] * 7)
                a[0] += 1
                a[1] += st.prompt_tokens + (req.generated if req is not None else 0)
                a[2] += s.depth - 1
                a[3] += len(st.children)
                a[4] += len(st.deps)
                a[5] += s.remaining - 1
                a[6] += min(view.now_s - task.arrival_s, 180.0)
        waits: dict[str, list[float]] = {}
        for r in view.waiting:
            waits.setdefault(r.agent, []).append(view.now_s - r.queued_s)
        pre: dict[str, int] = {}
        for r in (*view.waiting, *view.running):
            pre[r.agent] = pre.get(r.agent, 0) + r.preemptions
        out: dict[str, float] = {}
        for agent, (n, toks, depth, outd, ind, rest, age) in acc.items():
            w = waits.get(agent, [])
            urgency = (
                math.log1p(sum(w) / len(w) if w else 0.0)
                + math.log1p(len(w))
                + 1.5 * math.log1p(pre.get(agent, 0))
            )
            cost = math.log1p(toks / n)
            graph = (0.7 * depth + 0.5 * outd + 0.25 * ind + 0.2 * rest + 0.1 * age) / n
            out[agent] = max(1.0, 2.0 + urgency + 0.5 * cost + graph)
        return out

    def _plan(self, view: EngineView) -> frozenset[str]:
        """Adapt the reserved fraction, then keep the critical agents' prefixes within it."""
        self.reserve_ratio = adapt_reserve(self.reserve_ratio, usage(view), self)
        scores = self.agent_scores(view)
        order = sorted(scores, key=lambda a: (-scores[a], a))
        critical = order[: max(1, int(len(order) * self.critical_ratio))]
        room = self.reserve_ratio * view.kv_budget_tokens
        tokens = {p.agent: p.tokens for p in view.prefixes()}
        kept = []
        for agent in critical:
            t = tokens.get(agent, 0)
            if t and t <= room:
                kept.append(agent)
                room -= t
        return frozenset(kept)

    def decide(self, view: EngineView) -> Decision:
        live = view.tasks
        if len(self._shapes) > 2 * len(live) + 64:
            self._shapes = {t: s for t, s in self._shapes.items() if t in live}
        if view.now_s - self._adjusted_s >= self.adjust_every_s:
            self._adjusted_s = view.now_s
            self._kept = self._plan(view)
        scores = self._scores(view)

        def key(r: RequestView) -> tuple[float, float, float, int]:
            eff, own = scores[r.rid]
            return (-eff, -own, r.queued_s, r.rid)

        return Decision(admit=sorted(view.waiting, key=key), keep_prefixes=self._kept)

    def context_action(self, finished: RequestView, view: EngineView) -> ContextAction:
        """The time scheduler: offload the stalled context when it pays, upload it before the
        predicted return; otherwise leave it in the cache."""
        task = view.tasks.get(finished.task_id)
        if not self.offload or task is None:
            return DROP
        stall = stall_s(task, finished.stage_id, finished.agent, view)
        if stall is None:
            return DROP
        prefix = next((p.tokens for p in view.prefixes() if p.agent == finished.agent), 0)
        own = max(finished.prompt_tokens + finished.generated - prefix, 0)
        transfer = host_load_s(view, finished.agent, own)
        if transfer is None or not own or not offload_worth(stall, transfer):
            return DROP
        return ContextAction(offload=True, upload_in_s=max(0.0, stall - upload_lead_s(transfer)))
