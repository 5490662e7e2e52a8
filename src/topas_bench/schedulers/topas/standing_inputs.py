"""What a standing certificate reads (`standing.Certificate`): the policy's pool, each waiting
request's row, and what does not depend on the window's length (the arrays every window's test
reads, the budget range over which no scored set's swap-out changes, the eligible victims).

The proof itself, condition by condition, is in `standing`'s docstring.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from topas_bench.schedulers.topas.pack import Candidate, PackInputs
from topas_bench.schedulers.topas.params import TopasParams
from topas_bench.schedulers.topas.paths import TaskPath
from topas_bench.schedulers.topas.search import AgentInfo, Choice
from topas_bench.schedulers.view import EngineView

#: Relative slack for rounding: a comparison closer than this is taken as able to flip.
EPS = 1e-9
#: Bisections of the budget ceiling that keeps preemptions from paying, or a reservation
#: refusing a backfill.
CEILING_BISECTIONS = 6

F64 = npt.NDArray[np.float64]


class Rows:
    """Each waiting request as the certificate reads it, in `view.waiting` order: its task's
    and its agent's index, its share of its task's path reduction, and whether it is
    starving (as `Topas._candidates` found it)."""

    __slots__ = (
        "agent_index", "agent_of", "requests", "share", "starving", "task_index", "task_of",
    )  # fmt: skip

    def __init__(self, view: EngineView, pool: Pool) -> None:
        self.task_index = {tid: i for i, tid in enumerate(pool.paths)}
        self.agent_index: dict[str, int] = {}
        self.requests = list(view.waiting)
        self.task_of = [self.task_index[r.task_id] for r in self.requests]
        ix = self.agent_index
        self.agent_of = [ix.setdefault(r.agent, len(ix)) for r in self.requests]
        paths = pool.paths
        self.share = [paths[r.task_id].delta_share[r.stage_id] for r in self.requests]
        self.starving = [r.rid in pool.urgent for r in self.requests]


@dataclass(slots=True)
class Pool:
    """What `Topas._candidates` computed, kept for the certificate."""

    ranked: list[Candidate]
    agent_gain: dict[str, float]
    paths: dict[str, TaskPath]
    costs: dict[int, int]  # rid -> admission need + lock cost (where computed)
    unpaid: dict[str, int]  # agent -> prefix tokens a request of it would pay
    urgent: set[int]  # rids past the starvation limit
    stale_left: bool  # paths still stale after this decision's refreshes
    h_age: float  # aging's time scale; 0: no aging
    limit: float  # starvation limit, seconds waited


class Prepared:
    """The certificate's inputs, and what it computes once before trying windows."""

    def __init__(
        self,
        view: EngineView,
        p: TopasParams,
        pool: Pool,
        inp: PackInputs,
        agents: Mapping[str, AgentInfo],
        choice: Choice,
        credit: Mapping[int, float],
        tally: Counter[str] | None = None,
    ) -> None:
        self.view = view
        self.p = p
        self.pool = pool
        self.inp = inp
        self.agents = agents
        self.visited = [c.keep for c in choice.visited]
        self.scores = [c.score for c in choice.visited]
        #: the scored sets whose pack admits or preempts something (and loses)
        self.acting = np.array([bool(c.pack.admits or c.pack.preempts) for c in choice.visited])
        self.comparisons = choice.comparisons
        self.credit = credit
        self.tally = tally  # how each proof ended (the policy's diagnostics)
        est = view.estimator
        self.tpot = est.tpot_s
        self.tpot_lo = self.tpot_hi = self.tpot
        self.now = view.now_s
        self.budget0 = inp.budget
        self.running = list(view.running)
        self._rt_lo: list[float] = []  # residual output ranges of the window being tried
        self._rt_hi: list[float] = []
        self._rt_memo: dict[int, tuple[list[float], list[float]]] = {}
        #: Why the last window tried did not stand (diagnostics: `benchmarks/bench_sim.py`).
        self.failed = ""

    def _prepare(self) -> bool:
        """What does not depend on the window's length; False if nothing can stand."""
        view, pool, p = self.view, self.pool, self.p
        self.rows = rows = Rows(view, pool)
        self.until_starve = math.inf
        if pool.limit < math.inf:
            ready = [r.ready_s for r, late in zip(rows.requests, rows.starving, strict=True)
                     if not late]  # fmt: skip
            ready += [  # running requests that may still be preempted
                r.ready_s for r in self.running
                if self.now - r.ready_s <= pool.limit and r.preemptions < p.max_preemptions
            ]  # fmt: skip
            if ready:
                self.until_starve = min(ready) + pool.limit
                self.until_starve -= EPS * max(1.0, abs(self.until_starve))
        if self.until_starve <= self.now:
            return False
        tids = list(pool.paths)
        paths = pool.paths.values()
        self.service = np.array([p.service_s for p in paths])
        self.hops = np.array([float(p.hops) for p in paths])
        self.arrival = np.array([view.tasks[t].arrival_s for t in tids])
        self.live = (self.service > 0) | (self.hops > 0)  # L > 0 at every positive H
        self.aging_now = np.ones_like(self.service)
        if pool.h_age > 0:
            waited = np.maximum(self.now - self.arrival, 0.0)
            self.aging_now = 1.0 + p.rho * np.log1p(waited / pool.h_age)
        self.agent_ix = rows.agent_index  # (extended by agents with nothing waiting)
        for a in self.agents:
            self.agent_ix.setdefault(a, len(self.agent_ix))
        self.task_of = np.array(rows.task_of, dtype=np.int64)
        self.agent_of = np.array(rows.agent_of, dtype=np.int64)
        self.share = np.array(rows.share)
        costs = pool.costs
        missing = [r for r in rows.requests if r.rid not in costs]
        if missing:
            more = view.admission_costs(missing)
            costs = {**costs, **dict(zip([r.rid for r in missing], more, strict=True))}
        self.cost = np.array([costs[r.rid] for r in rows.requests], dtype=float)
        self.urgent = np.array(rows.starving, dtype=bool)
        inp, gain = self.inp, pool.agent_gain
        order = sorted(
            (a for a in self.agents if a not in inp.locked_agents and a not in inp.open_agents),
            key=lambda a: (-gain.get(a, 0.0), a),
        )
        #: the search's agent order, through its top `max_agents` and the first past them
        self.neighbours = list(itertools.pairwise(order[: p.max_agents + 1]))
        self._pairs: list[tuple[F64, F64, float]] | None = None
        unpaid = np.zeros(len(self.agent_ix))
        for a, t in pool.unpaid.items():
            if a in self.agent_ix:
                unpaid[self.agent_ix[a]] = t
        self.denom = np.maximum(self.cost + unpaid[self.agent_of], 1.0)
        return self._prepare_sets() and self._prepare_victims()

    def _prepare_sets(self) -> bool:
        """Per scored set and agent, `delta_S - prefix discount` (a request fits in the set's
        pack when `cost + that < budget`) and whether the set's pack walks the agent's
        requests; and the budget range over which no set's swap-out changes (3)."""
        inp, agents = self.inp, self.agents
        prefixes = {a for a in agents if agents[a].tokens > 0}
        discount = inp.prefix_tokens  # a candidate's prefix part: resident, unlocked, unkept
        ix = self.agent_ix
        n = len(ix)
        member = np.zeros((len(self.visited), n), dtype=bool)  # agents in each set's keep
        for s, keep in enumerate(self.visited):
            member[s, [ix[a] for a in keep if a in ix]] = True
        locked = np.zeros(n, dtype=bool)
        locked[[ix[a] for a in inp.locked_agents if a in ix]] = True
        kept = np.zeros(n, dtype=bool)
        kept[[ix[a] for a in inp.kept_unlocked if a in ix]] = True
        shared = np.array([a in prefixes for a in ix], dtype=bool)
        prefix = np.array([float(discount.get(a, 0)) for a in ix])
        unpin = np.array([float(inp.kept_unlocked.get(a, 0)) for a in ix])
        # `pack.pin_delta` of each set: the pins it takes less the kept prefixes it releases
        self.deltas = member @ prefix - (unpin.sum() - member @ unpin)
        lo, hi = -math.inf, math.inf
        for s, keep in enumerate(self.visited):
            if not self.acting[s]:  # an empty pack's score moves only with its swap-out
                s_lo, s_hi = self._swap_bucket(keep, int(self.deltas[s]))
                lo, hi = max(lo, s_lo), min(hi, s_hi)
        beta = self.p.beta if self.p.use_reuse else 0.0
        value = np.array(
            [agents[a].next_users * agents[a].reload_s if a in agents else 0.0 for a in ix]
        )
        paid = member | locked | kept
        self.offsets = self.deltas[:, None] - np.where(paid, prefix[None, :], 0.0)
        allowed = member | locked
        joint = self.p.joint and self.p.pins  # no pins: one unrestricted pack
        self.walks = allowed | ~shared[None, :] if joint else np.ones_like(allowed)
        #: the most reuse value a set's score can hold, whatever its pack brings in
        self.reuse_max = beta * (allowed @ value) * (1.0 + EPS)
        #: the least a request of each agent can cost a set's pack, over `offsets`: its
        #: agent's prefix paid (by a pin, a lock, or an earlier admission)
        self.paid_offsets = self.deltas[:, None] - prefix[None, :]
        self.swap_lo, self.swap_hi = lo, hi
        self.failed = "" if lo < hi else "swap-out"
        return lo < hi

    def _swap_bucket(self, keep: frozenset[str], delta: int) -> tuple[float, float]:
        """The budgets over which `score_set`'s swap-out for `keep`, with nothing packed,
        evicts the same prefixes as at this decision's budget."""
        inp, agents = self.inp, self.agents
        unkept = {a: t for a, t in inp.prefix_tokens.items() if a not in keep}
        out = sorted(
            (a for a in unkept if a in agents),
            key=lambda a: (agents[a].next_users * agents[a].reload_s, a),
        )
        if not out:
            return -math.inf, math.inf
        total = sum(unkept.values())
        excess = float(delta) - (self.budget0 - total)
        evicted = 0
        for a in out:
            if excess <= 0:
                break
            excess -= unkept[a]
            evicted += 1
        # evicting the first `evicted` needs excess(B) = delta + total - B to stay positive
        # after the first `evicted - 1`, and to end at or below zero after `evicted`
        tokens = [unkept[a] for a in out]
        lo, hi = -math.inf, math.inf
        if evicted >= 1:
            hi = delta + total - sum(tokens[: evicted - 1])
        if evicted < len(out):
            lo = delta + total - sum(tokens[:evicted])
        return lo, hi

    def _prepare_victims(self) -> bool:
        """The eligible victims' cheapest keep values (tpot at its low end, generated tokens
        as now: redo grows with both) and what their frees need from the window."""
        est = self.view.estimator
        where = {r.rid: i for i, r in enumerate(self.running)}
        #: (running index, generated, prefill + credit, frees less generated and residual)
        self.victims: list[tuple[int, int, float, int]] = []
        for v in self.inp.victims:
            r = v.req
            g = r.generated
            prefill_credit = est.prefill_s(r.prompt_tokens) + self.credit.get(r.rid, 0.0)
            residual = est.residual_tokens(r.agent, r.kind, g, (r.task_id, r.stage_id))
            base = v.frees - int(residual) - g  # prompt - shared
            self.victims.append((where[r.rid], g, prefill_credit, base))
        columns = list(zip(*self.victims, strict=True)) or [(), (), (), ()]
        self.v_index = np.array(columns[0], dtype=np.int64)
        self.v_generated = np.array(columns[1], dtype=np.float64)
        self.v_fixed = np.array(columns[2], dtype=np.float64)  # prefill + credit
        self.v_base = np.array(columns[3], dtype=np.float64)
        return True
