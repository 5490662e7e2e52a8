"""TOPAS: a task-oriented, prefix-aware scheduler that decides jointly which agents stay
resident and which of their requests run, under one KV budget (arXiv 2608.25523, as summarised
in docs/design.md section 5; docs/topas.md describes this implementation and where it departs).

At each scheduling point (every iteration while requests wait: `acts_while_full`, SGLang's
priority-preemption door), TOPAS
1. weighs every waiting request by how much admitting it now shortens its task's expected
   remaining critical path (`paths.py`), times the task's weight: SRPT on the remaining path,
   times aging on the workload's own time scale;
2. searches resident sets R' around the current one (`search.py`): for each, GREEDY-PACK
   (`pack.py`) admits only requests of R' agents, with preemptions and conservative backfill,
   and the state is scored with progress, move costs (swap-in and swap-out) and reuse value;
3. returns the best set's admissions, preemptions, and R' as the prefixes to keep pinned.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import replace
from typing import Any, ClassVar

from topas_bench.schedulers.base import (
    Capabilities,
    Decision,
    Policy,
    ProvesStanding,
    RequestView,
    ServerNeeds,
    StageState,
    Standing,
)
from topas_bench.schedulers.topas.pack import Candidate, PackInputs, Victim, first_misfit
from topas_bench.schedulers.topas.params import TopasParams, resolve_params
from topas_bench.schedulers.topas.paths import TaskPath, task_path
from topas_bench.schedulers.topas.search import AgentInfo, score_set, search
from topas_bench.schedulers.topas.standing import Certificate
from topas_bench.schedulers.topas.standing_inputs import Pool
from topas_bench.schedulers.view import EngineView, PrefixLocation, PrefixView


class Topas(Policy):
    """TOPAS: joint prefix residency, admission and preemption (the paper's scheduler)."""

    name = "topas"
    defaults: ClassVar[dict[str, Any]] = {}
    #: Asked at every iteration while requests wait, and preempts (`topas-no-preempt`: neither).
    capabilities: ClassVar[Capabilities] = Capabilities(acts_while_full=True, preempts=True)

    def __init__(self, **params: Any) -> None:
        self.p = TopasParams(**{**self.defaults, **resolve_params(self.name, params)})
        self._credit: dict[int, float] = {}
        self._path_memo: dict[str, tuple[int, int, TaskPath]] = {}
        self._unloaded: dict[str, float] = {}  # task id -> its critical path when first seen
        self._unloaded_sum = 0.0
        #: How each decision ended: acting, idle, paths stale; and of those an engine asked to
        #: prove, standing (by window) or why not (`standing.Certificate.failed`): diagnostics.
        self.standings: Counter[str] = Counter()

    @property
    def params(self) -> dict[str, Any]:
        return {k: v for k, v in self.p.as_dict().items() if k not in self.defaults}

    @property
    def needs(self) -> ServerNeeds:
        """The door for acting while the batch is full, where the class acts while full:
        asked at every iteration while requests wait, so it can preempt for a better
        candidate."""
        return ServerNeeds(acts_while_full=self.capabilities.acts_while_full)

    # -- the decision ----------------------------------------------------------------------
    def decide(self, view: EngineView) -> Decision:
        if not view.waiting:
            return Decision()
        horizon = self._horizon(view)
        prefixes = {p.agent: p for p in view.prefixes()}
        pool = self._candidates(view, horizon, prefixes)
        ranked = pool.ranked
        locked = frozenset(
            a for a, p in prefixes.items() if p.where == PrefixLocation.GPU and p.locks > 0
        )
        kept = frozenset(a for a, p in prefixes.items() if p.kept)
        unkept = {
            a: p.tokens
            for a, p in prefixes.items()
            if p.where == PrefixLocation.GPU and p.locks == 0 and not p.kept
        }
        inputs = PackInputs(
            ranked=ranked,
            victims=self._victims(view, prefixes),
            budget=view.free_tokens + view.evictable_tokens - view.reserved_tokens,
            prefix_tokens=unkept,
            kept_unlocked={a: p.tokens for a, p in prefixes.items() if p.kept and p.locks == 0},
            locked_agents=locked,
            max_actions=self.p.max_actions,
            scan=max(self.p.scan_limit, 4 * self.p.max_actions),
            # a class that never preempts: no preemption pays (its victims' releases still
            # tell backfill when memory comes back)
            preempt_margin_s=self.p.preempt_margin_s if self.capabilities.preempts else math.inf,
            open_agents=frozenset(c.agent for c in ranked if c.agent not in prefixes),
            running_tasks=frozenset(r.task_id for r in view.running),
        )
        agents = self._agents(view, prefixes, ranked)
        beta = self.p.beta if self.p.use_reuse else 0.0
        if self.p.pins:
            choice = search(
                inputs, agents, locked | kept, pool.agent_gain, beta=beta, joint=self.p.joint,
                top=self.p.max_agents, must_admit=not view.running, charge=self.p.stall_charge,
            )  # fmt: skip
        else:  # no residency choice: one unrestricted pack, nothing pinned
            only = score_set(inputs, agents, frozenset(), beta, False, self.p.stall_charge)
            choice = replace(only, visited=(only,))
        pack = choice.pack
        if not pack.admits and not view.running and ranked:
            # Idle, and even the unrestricted pack with no pins found nothing that fits: its
            # estimate counts lock costs in full and is stricter than the engine's check, so
            # the best candidate goes to the engine, whose check decides (it releases kept
            # prefixes that stand in the way of an idle server).
            pack.admits.append(ranked[0])
        for c in pack.admits:
            self._credit[c.req.rid] = c.gain
        for v in pack.preempts:
            self._credit.pop(v.req.rid, None)
        self._forget(view)
        keep = choice.keep | frozenset(a for a in locked if agents[a].next_users > 0)
        pins = self.p.pins and (self.p.use_reuse or self.p.joint)
        keep = keep if pins else frozenset()
        admit = [c.req for c in pack.admits]
        misfit = None
        if view.running and not self.capabilities.acts_while_full:
            # Asked only where SGLang asks any policy: the pass ends where a baseline's would,
            # at the best-ranked request that does not fit, which the engine checks and whose
            # NO_TOKEN sets the `batch_is_full` latch. (Ended by the cutoff instead, the pass
            # would leave the latch clear, and the engine would ask again at the next
            # iteration with memory full.)
            misfit = first_misfit(inputs, pack, choice.keep)
        if misfit is not None:
            admit.append(misfit.req)
        stands: ProvesStanding | None = None
        if admit or pack.preempts or not view.running:
            self.standings["acts" if view.running else "idle"] += 1
        elif pool.stale_left:
            self.standings["paths stale"] += 1
        else:  # proved only when an engine asks (`base.ProvesStanding`)
            stands = Certificate(
                view, self.p, pool, inputs, agents, choice, self._credit, self.standings
            ).standing
            if not self.capabilities.acts_while_full:  # and while no misfit is handed over
                stands = _above(stands, self._misfit_floor(view, pool, inputs, choice.keep))
        return Decision(
            admit=admit,
            preempt=[v.req for v in pack.preempts],
            keep_prefixes=frozenset(a for a in keep if a in prefixes),
            stands=stands,
        )

    def _misfit_floor(
        self, view: EngineView, pool: Pool, inputs: PackInputs, keep: frozenset[str]
    ) -> int:
        """An admission budget above which a decision like this one hands no misfit to the
        engine (`pack.first_misfit`), whichever requests its scan takes: the largest cost of
        a waiting request (admission need plus lock cost), plus what pinning `keep` takes
        where the engine has not pinned it yet. Costs do not grow between decode steps."""
        costs = list(pool.costs.values())
        missing = [r for r in view.waiting if r.rid not in pool.costs]
        if missing:
            costs += view.admission_costs(missing)
        return max(costs) + sum(inputs.prefix_tokens.get(a, 0) for a in keep)

    # -- progress: weights and candidates ---------------------------------------------------
    def _horizon(self, view: EngineView) -> float:
        if self.p.horizon_s is not None:
            return self.p.horizon_s
        est = view.estimator
        # how long a request not admitted now waits for its next chance: until running
        # requests finish; on an idle server, as long as the waiting ones would take
        reqs = view.running or view.waiting
        mean = sum(est.residual_service_s(r) for r in reqs) / len(reqs)
        return max(mean, est.tpot_s)

    def unloaded_jct_s(self) -> float:
        """T0: the mean critical path of the tasks seen so far, when each was first seen (its
        expected JCT served alone): the time scale of aging and starvation."""
        return self._unloaded_sum / len(self._unloaded) if self._unloaded else 0.0

    def _candidates(
        self, view: EngineView, horizon: float, prefixes: dict[str, PrefixView]
    ) -> Pool:
        """Waiting requests worth packing (the best `scan` by gain, and every starving one),
        starving first (oldest first), then by gain; each agent's total waiting gain; and what
        the standing certificate needs of every waiting request."""
        paths, stale_left = self._paths(view, horizon)
        for tid, p in paths.items():
            if tid not in self._unloaded:
                self._unloaded[tid] = p.service_s
                self._unloaded_sum += p.service_s
        scale = self.unloaded_jct_s()
        lengths = {tid: p.length(horizon) for tid, p in paths.items()}
        mean_len = sum(lengths.values()) / len(lengths)
        alpha, rho = self.p.srpt_exponent, self.p.rho
        h_age = self.p.h_age_s if self.p.h_age_s is not None else self.p.h_age_mult * scale
        now = view.now_s
        weight: dict[str, float] = {}
        tasks, aging = view.tasks, self.p.use_aging and h_age > 0
        for tid, length in lengths.items():
            g = 1.0
            if aging:
                waited = now - tasks[tid].arrival_s
                g += rho * math.log1p((waited if waited > 0.0 else 0.0) / h_age)
            if alpha and length > 0:
                g *= (mean_len / length) ** alpha
            weight[tid] = g * horizon
        limit = self.p.starvation_mult * scale if self.p.starvation_mult > 0 else math.inf
        scan = max(self.p.scan_limit, 4 * self.p.max_actions)
        heap: list[tuple[float, float, int, RequestView]] = []
        urgent: list[RequestView] = []
        gains: dict[int, float] = {}
        costs: dict[int, int] = {}
        agent_gain: dict[str, float] = {}
        # the agent-prefix tokens a request would take beyond its own cost: its agent's prefix
        # when it is resident but neither locked nor kept (nobody has paid for it yet)
        unpaid = {
            a: 0 if pv.where == PrefixLocation.GPU and (pv.locks or pv.kept) else pv.tokens
            for a, pv in prefixes.items()
        }
        density = self.p.density
        waiting = view.waiting
        if density:  # what each would take: admission need + lock cost, the queue at once
            costs = dict(zip([r.rid for r in waiting], view.admission_costs(waiting), strict=True))
        for r in waiting:
            tid, rid, agent = r.task_id, r.rid, r.agent
            gain = weight[tid] * paths[tid].delta_share[r.stage_id]
            gains[rid] = gain
            agent_gain[agent] = agent_gain.get(agent, 0.0) + gain
            if now - r.ready_s > limit:
                urgent.append(r)
                continue
            key = gain
            if density:  # gain per token of memory it would take
                denom = costs[rid] + unpaid.get(agent, 0)
                key = gain / (denom if denom > 1 else 1)
            # (rids are unique: tuples compare before reaching the request)
            item = (key, -r.queued_s, -rid, r)
            if len(heap) < scan:
                heapq.heappush(heap, item)
            elif item > heap[0]:
                heapq.heapreplace(heap, item)
        urgent.sort(key=lambda r: (r.ready_s, r.rid))
        heap.sort(reverse=True)
        est = view.estimator
        out = []
        for r, is_urgent in [*((r, True) for r in urgent), *((x[3], False) for x in heap)]:
            pv = prefixes.get(r.agent)
            resident = pv is not None and pv.where == PrefixLocation.GPU
            unlocked = (
                pv.tokens if pv is not None and resident and not pv.locks and not pv.kept else 0
            )
            known = costs.get(r.rid)
            if known is None:
                known = costs[r.rid] = view.admission_costs((r,))[0]
            out.append(Candidate(
                req=r, agent=r.agent, gain=gains[r.rid], cost=known, prefix=unlocked,
                absent=pv is not None and not resident, service_s=est.residual_service_s(r),
                urgent=is_urgent,
            ))  # fmt: skip
        return Pool(
            out, agent_gain, paths, costs, unpaid, {r.rid for r in urgent}, stale_left,
            h_age if self.p.use_aging else 0.0, limit,
        )  # fmt: skip

    def _paths(self, view: EngineView, horizon: float) -> tuple[dict[str, TaskPath], bool]:
        """Each waiting task's `TaskPath`, memoised per task: a task whose state changed is
        recomputed; one whose only change is that the estimator learned since is refreshed
        lazily, at most `refresh_limit` per decision, stalest first. Also whether some stale
        ones are left for later decisions (which then differ from this one)."""
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
        return out, len(stale) > self.p.refresh_limit

    def _compute_path(self, view: EngineView, tid: str, horizon: float) -> TaskPath:
        task = view.tasks[tid]
        waiting = sorted(
            (st.request.queued_s, st.request.rid, sid)
            for sid, st in task.stages.items()
            if st.state == StageState.WAITING and st.request is not None
        )
        path = task_path(
            task, view.estimator, horizon, [sid for _, _, sid in waiting], self.p.path_samples
        )
        self._path_memo[tid] = (task.version, view.estimator.version, path)
        return path

    # -- what the search weighs --------------------------------------------------------------
    def _victims(self, view: EngineView, prefixes: dict[str, PrefixView]) -> list[Victim]:
        est = view.estimator
        users = Counter(r.agent for r in view.running)
        scale = self.unloaded_jct_s()
        limit = self.p.starvation_mult * scale if self.p.starvation_mult > 0 else math.inf
        victims = []
        for r in view.running:
            if view.now_s - r.ready_s > limit:
                continue  # a request past the starvation limit keeps its place
            if r.preemptions >= self.p.max_preemptions:
                continue  # no request is bounced more than max_preemptions times
            pv = prefixes.get(r.agent)
            shared = pv.tokens if pv is not None and users[r.agent] > 1 else 0
            residual = est.residual_tokens(r.agent, r.kind, r.generated, (r.task_id, r.stage_id))
            frees = r.prompt_tokens + r.generated - shared + int(residual)
            redo = est.tpot_s * r.generated + est.prefill_s(r.prompt_tokens)
            victims.append(Victim(
                r, r.agent, redo + self._credit.get(r.rid, 0.0), frees,
                est.residual_service_s(r),
            ))  # fmt: skip
        victims.sort(key=lambda v: (v.keep_value_s, v.req.rid))
        return victims

    def _agents(
        self, view: EngineView, prefixes: dict[str, PrefixView], ranked: list[Candidate]
    ) -> dict[str, AgentInfo]:
        """Per agent (seen, or with a candidate): reload cost, residency, n_a (`reuse_users`),
        the running tasks a move stalls."""
        next_users: Counter[str] = Counter()
        for r in view.running:
            task = view.tasks[r.task_id]
            for child_id in task.stages[r.stage_id].children:
                child = task.stages[child_id]
                if all(
                    d == r.stage_id or task.stages[d].state == StageState.DONE for d in child.deps
                ):
                    next_users[child.agent] += 1
        if self.p.reuse_users == "all":  # and the requests already queued for the agent
            next_users.update(r.agent for r in view.waiting)
        stall = len({r.task_id for r in view.running})
        out = {}
        for a in {*prefixes, *(c.agent for c in ranked)}:
            pv = prefixes.get(a)
            out[a] = AgentInfo(
                reload_s=view.absent_reload_s(a),
                resident=pv is not None and pv.where == PrefixLocation.GPU,
                tokens=pv.tokens if pv is not None else 0,
                next_users=next_users[a],
                stall_tasks=stall,
            )
        return out

    def _forget(self, view: EngineView) -> None:
        if len(self._credit) > 2 * (len(view.running) + len(view.waiting)) + 64:
            live = {r.rid for r in view.running} | {r.rid for r in view.waiting}
            self._credit = {k: v for k, v in self._credit.items() if k in live}
        if len(self._path_memo) > 2 * len(view.tasks) + 64:
            self._path_memo = {k: v for k, v in self._path_memo.items() if k in view.tasks}


def _above(proof: ProvesStanding, floor: float) -> ProvesStanding:
    """`proof`, its stand's admission budget raised above `floor`."""

    def stands(steps: int) -> Standing | None:
        found = proof(steps)
        return None if found is None else replace(found, budget_lo=max(found.budget_lo, floor))

    return stands


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


class TopasNoJoint(Topas):
    """TOPAS whose resident set does not restrict packing (ablation: the joint choice off; R'
    is still chosen and pinned)."""

    name = "topas-no-joint"
    defaults: ClassVar[dict[str, Any]] = {"joint": False}


class TopasNoPins(Topas):
    """TOPAS with no residency choice at all (ablation): no resident set is searched, no prefix
    is pinned (kept ones are released), and packing is unrestricted."""

    name = "topas-no-pins"
    defaults: ClassVar[dict[str, Any]] = {"pins": False}


class TopasNoMoveStall(Topas):
    """TOPAS whose swap-in is charged once, to the admitting task, not to every task the move
    stalls (ablation of the move term's stall)."""

    name = "topas-no-move-stall"
    defaults: ClassVar[dict[str, Any]] = {"move_charge": "admitted"}


class TopasNoPreempt(Topas):
    """TOPAS asked only where a baseline is asked, and never preempting (ablation).

    The two capabilities the baselines lack are off (`Capabilities`): the engines ask it only
    at the prefill attempts SGLang makes for any policy, and no preemption pays in its packs;
    its pins, the joint choice of R' and the score stay TOPAS's.
    """

    name = "topas-no-preempt"
    capabilities: ClassVar[Capabilities] = Capabilities()


class TopasPrevScore(Topas):
    """TOPAS with the score's move and reuse terms as before issue 21 (ours): a swap-in charged
    once per prefix, n_a the one-hop users only."""

    name = "topas-prev-score"
    defaults: ClassVar[dict[str, Any]] = {"move_charge": "admitted", "reuse_users": "next"}


class TopasExpectedPath(Topas):
    """TOPAS with L_i as E[LP(Z)] (16 draws of the stage times) instead of LP(E[Z])."""

    name = "topas-expected-path"
    defaults: ClassVar[dict[str, Any]] = {"path_samples": 16}
