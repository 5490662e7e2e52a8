"""TOPAS: a task-oriented, prefix-aware scheduler that decides resident prefixes, admissions and
preemptions jointly under one KV budget (arXiv 2608.25523, as summarised in DESIGN section 5).

At each scheduling point, for the state it would move to (resident prefix set R', running set
Q'), TOPAS scores, in seconds:

    sum over admitted r of g_i * delta(r)  -  J_move  -  J_redo  -  J_revoke  +  V_reuse

- delta(r): how much admitting r now shortens its task's expected remaining critical path
  (`paths.py`), scaled by (mean remaining path / the task's remaining path) ** srpt_exponent;
- g_i = 1 + rho * log(1 + age_i / h_age_s): aging, on admission gains only;
- J_move: time to bring an absent prefix onto the GPU (host load, or recompute), charged to the
  task whose admitted request brings it;
- J_redo: per-token decode time x tokens generated, for each preempted request;
- J_revoke: the admission credit recorded when a preempted request was admitted;
- V_reuse = beta * sum over kept prefixes a of n_a * reload_time(a), where n_a counts stages of
  agent a that become ready once the running stages finish (one hop).

The prefix set is searched jointly with GREEDY-PACK (`pack.py`); at most K admissions +
preemptions per decision. Parameters and the reasons for their defaults: `params.py`.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from typing import Any, ClassVar

from topas_bench.schedulers.base import (
    Decision,
    EngineView,
    Policy,
    PrefixLocation,
    RequestView,
    StageState,
)
from topas_bench.schedulers.topas.pack import (
    Candidate,
    PackInputs,
    Victim,
    greedy_pack,
    search_keep_set,
)
from topas_bench.schedulers.topas.params import TopasParams, resolve_params
from topas_bench.schedulers.topas.paths import TaskPath, task_path


class Topas(Policy):
    """TOPAS: joint prefix residency, admission and preemption (the paper's scheduler)."""

    name = "topas"
    acts_while_full = True
    defaults: ClassVar[dict[str, Any]] = {}

    def __init__(self, **params: Any) -> None:
        self.p = TopasParams(**{**self.defaults, **resolve_params(self.name, params)})
        self._credit: dict[int, float] = {}
        self._starve_limit = math.inf
        self._path_memo: dict[str, tuple[int, int, TaskPath]] = {}

    @property
    def params(self) -> dict[str, Any]:
        return {k: v for k, v in self.p.as_dict().items() if k not in self.defaults}

    # -- the decision ----------------------------------------------------------------------
    def decide(self, view: EngineView) -> Decision:
        if not view.waiting:
            return Decision()
        horizon = self._horizon(view)
        ranked = self._candidates(view, horizon)
        prefixes = {p.agent: p for p in view.prefixes()}
        locked = frozenset(
            a for a, p in prefixes.items() if p.where == PrefixLocation.GPU and p.locks > 0
        )
        inputs = PackInputs(
            ranked=ranked,
            victims=self._victims(view, prefixes),
            budget=view.free_tokens + view.evictable_tokens - view.reserved_tokens,
            prefix_tokens={
                a: p.tokens
                for a, p in prefixes.items()
                if p.where == PrefixLocation.GPU and p.locks == 0 and not p.kept
            },
            kept_unlocked={a: p.tokens for a, p in prefixes.items() if p.kept and p.locks == 0},
            locked_agents=locked,
            max_actions=self.p.max_actions,
            scan=max(self.p.scan_limit, 4 * self.p.max_actions),
            preempt_margin_s=self.p.preempt_margin_s,
        )
        if self.p.use_reuse:
            reuse = self._reuse_values(view, prefixes)
            keep, pack = search_keep_set(inputs, reuse, self.p.max_agents_exact)
        else:
            keep, pack = frozenset(), greedy_pack(inputs, frozenset())
        admits = [c.req for c in pack.admits]
        if not admits and not view.running and ranked:
            admits = [ranked[0].req]  # an idle server always gets the best candidate
        for c in pack.admits:
            self._credit[c.req.rid] = c.gain
        preempts = [v.req for v in pack.preempts]
        for v in pack.preempts:
            self._credit.pop(v.req.rid, None)
        self._forget(view)
        return Decision(admit=admits, preempt=preempts, keep_prefixes=keep)

    # -- pieces ----------------------------------------------------------------------------
    def _horizon(self, view: EngineView) -> float:
        if self.p.horizon_s is not None:
            return self.p.horizon_s
        est = view.estimator
        if not view.running:
            return est.tpot_s
        mean = sum(est.residual_service_s(r) for r in view.running) / len(view.running)
        return max(mean, est.tpot_s)

    def _candidates(self, view: EngineView, horizon: float) -> list[Candidate]:
        """The waiting requests worth packing, best net gain first.

        Gains are computed for every waiting request (one pass, keeping the best `scan` in a
        bounded heap); only those get their admission cost computed.
        """
        waiting = view.waiting
        paths = self._paths(view, horizon)
        mean_path = sum(p.service_s + p.hops * horizon for p in paths.values()) / len(paths)
        alpha, rho, h_age = self.p.srpt_exponent, self.p.rho, self.p.h_age_s
        aging = self.p.use_aging
        now = view.now_s
        tasks = view.tasks
        log1p = math.log1p
        weight: dict[str, float] = {}  # per task: g_i * srpt scale * horizon
        for tid, p in paths.items():
            g = 1.0 + rho * log1p(max(now - tasks[tid].arrival_s, 0.0) / h_age) if aging else 1.0
            if alpha:
                length = p.service_s + p.hops * horizon
                g *= (mean_path / length) ** alpha if length > 0 else 1.0
            weight[tid] = g * horizon
        move: dict[str, float] = {}
        # J_move is charged to each affected task: the admitted one, and (with move_stall)
        # every task whose running request stalls while the prefix is recomputed or loaded.
        affected = 1 + (len({r.task_id for r in view.running}) if self.p.move_stall else 0)
        scan = max(self.p.scan_limit, 4 * self.p.max_actions)
        # Requests sent longer ago than starvation_factor x the mean remaining path go first,
        # oldest first, and block backfilling until they fit (`greedy_pack`); once running
        # they are not preempted (`_victims`).
        factor = self.p.starvation_factor
        limit = self._starve_limit = factor * mean_path if factor > 0 else math.inf
        urgent: list[RequestView] = []
        heap: list[tuple[float, float, int, float, float, RequestView]] = []
        for r in waiting:
            if now - r.ready_s > limit:
                urgent.append(r)
            m = move.get(r.agent)
            if m is None:
                m = move[r.agent] = view.reload_s(r.agent) * affected
            tid = r.task_id
            gain = weight[tid] * paths[tid].delta_share[r.stage_id]
            net = gain - m
            if len(heap) >= scan and net < heap[0][0]:
                continue  # cannot enter the best `scan`
            # min-heap of the best so far on the sort key (net desc, queued asc, rid asc)
            item = (net, -r.queued_s, -r.rid, gain, m, r)
            if len(heap) < scan:
                heapq.heappush(heap, item)
            elif item[:3] > heap[0][:3]:
                heapq.heapreplace(heap, item)
        heap.sort(reverse=True)
        chosen = [(gain, m, r, False) for _, _, _, gain, m, r in heap]
        if urgent:
            urgent.sort(key=lambda r: (r.ready_s, r.rid))
            first = {r.rid for r in urgent}
            gains = {r.rid: (gain, m) for gain, m, r, _ in chosen}
            chosen = [
                (*gains.get(r.rid, (0.0, move.get(r.agent, 0.0))), r, True) for r in urgent
            ] + [c for c in chosen if c[2].rid not in first]
        prefixes = {p.agent: p for p in view.prefixes()}
        out = []
        for gain, m, r, is_urgent in chosen:
            pv = prefixes.get(r.agent)
            resident = pv is not None and pv.where == PrefixLocation.GPU
            unlocked = (
                pv.tokens if pv is not None and resident and pv.locks == 0 and not pv.kept else 0
            )
            out.append(
                Candidate(
                    req=r,
                    agent=r.agent,
                    gain=gain,
                    move_s=m,
                    need=view.admission_need(r) + view.lock_cost(r),
                    prefix_unlocked=unlocked,
                    resident=resident,
                    urgent=is_urgent,
                )
            )
        return out

    def _paths(self, view: EngineView, horizon: float) -> dict[str, TaskPath]:
        """Each waiting task's `TaskPath`, memoised per task.

        A task whose state changed is always recomputed. One whose only change is that the
        estimator learned since is refreshed lazily: at most `refresh_limit` of those per
        decision, stalest first, so decision time stays bounded for long queues (with fewer
        waiting tasks than that, every path is fresh).
        """
        est_version = view.estimator.version
        tasks = view.tasks
        memo = self._path_memo
        out: dict[str, TaskPath] = {}
        stale: list[tuple[int, str]] = []
        for r in view.waiting:
            tid = r.task_id
            if tid in out:
                continue
            task = tasks[tid]
            hit = memo.get(tid)
            if hit is not None and hit[0] == task.version:
                out[tid] = hit[2]
                if hit[1] != est_version:
                    stale.append((hit[1], tid))
            else:
                out[tid] = self._compute_path(view, tid, horizon)
        if len(stale) > 1:
            stale.sort()
        for _, tid in stale[: self.p.refresh_limit]:
            out[tid] = self._compute_path(view, tid, horizon)
        return out

    def _compute_path(self, view: EngineView, tid: str, horizon: float) -> TaskPath:
        task = view.tasks[tid]
        waiting = sorted(
            (st.request.queued_s, st.request.rid, sid)
            for sid, st in task.stages.items()
            if st.state == StageState.WAITING and st.request is not None
        )
        path = task_path(task, view.estimator, horizon, [sid for _, _, sid in waiting])
        self._path_memo[tid] = (task.version, view.estimator.version, path)
        return path

    def _victims(self, view: EngineView, prefixes: dict[str, Any]) -> list[Victim]:
        est = view.estimator
        agents = Counter(r.agent for r in view.running)
        victims = []
        for r in view.running:
            if view.now_s - r.ready_s > self._starve_limit:
                continue  # a request past the starvation limit keeps its place
            if r.preemptions >= self.p.max_preemptions:
                continue  # no request is bounced more than max_preemptions times
            shared = prefixes[r.agent].tokens if r.agent in prefixes and agents[r.agent] > 1 else 0
            frees = r.prompt_tokens + r.generated - shared
            frees += int(est.residual_tokens(r.agent, r.kind, r.generated))
            redo = est.tpot_s * r.generated
            victims.append(Victim(r, redo + self._credit.get(r.rid, 0.0), frees))
        victims.sort(key=lambda v: (v.keep_value_s, v.req.rid))
        return victims

    def _reuse_values(self, view: EngineView, prefixes: dict[str, Any]) -> dict[str, float]:
        """V_reuse per resident agent: beta * n_a * the time to reload it if evicted."""
        counts: Counter[str] = Counter()
        for r in view.running:
            task = view.tasks[r.task_id]
            for child_id in task.stages[r.stage_id].children:
                child = task.stages[child_id]
                others_done = all(
                    task.stages[d].state == StageState.DONE or d == r.stage_id for d in child.deps
                )
                if others_done:
                    counts[child.agent] += 1
        est = view.estimator
        return {
            a: self.p.beta * n * est.prefill_s(prefixes[a].tokens)
            for a, n in counts.items()
            if a in prefixes and prefixes[a].where == PrefixLocation.GPU
        }

    def _forget(self, view: EngineView) -> None:
        if len(self._credit) > 2 * (len(view.running) + len(view.waiting)) + 64:
            live = {r.rid for r in view.running} | {r.rid for r in view.waiting}
            self._credit = {k: v for k, v in self._credit.items() if k in live}
        if len(self._path_memo) > 2 * len(view.tasks) + 64:
            self._path_memo = {k: v for k, v in self._path_memo.items() if k in view.tasks}


class TopasBase(Topas):
    """TOPAS without reuse value or aging (ablation)."""

    name = "topas-base"
    defaults: ClassVar[dict[str, Any]] = {"use_reuse": False, "use_aging": False}


class TopasNoReuse(Topas):
    """TOPAS without the one-hop reuse value (ablation)."""

    name = "topas-no-reuse"
    defaults: ClassVar[dict[str, Any]] = {"use_reuse": False}


class TopasNoAging(Topas):
    """TOPAS without task aging (ablation)."""

    name = "topas-no-aging"
    defaults: ClassVar[dict[str, Any]] = {"use_aging": False}
