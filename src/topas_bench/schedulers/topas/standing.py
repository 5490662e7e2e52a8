"""How long an empty TOPAS decision stands (`base.Standing`), proved term by term.

TOPAS is asked at every iteration while requests wait (`acts_while_full`), and almost every
answer admits and preempts nothing and repeats the one before. Between two events (an arrival,
a finish, a release, an estimator update) the discrete state is fixed; what drifts, one decode
step at a time, is:

- time: the aging g_i of every waiting task grows; requests cross the starvation limit;
- the running requests' generated tokens: their expected residual output (through it the
  horizon H, and a victim's frees) falls one token per step between the output lengths seen,
  and jumps where it passes one (`ServiceEstimator.residual_tokens_range`: its exact range);
- the step-time estimate tpot (a moving average of the step times): H, a victim's redo cost;
- the admission budget `free + evictable - reserved`: decode takes a token per running
  request per step, the reservation shrinks as they generate and as `new_token_ratio` decays.

An empty decision stays the same empty decision with the same resident set while:
1. nothing fits: every candidate that may be scanned costs at least the budget of every
   scored set that would pack it: an upper bound on the budget;
2. no preemption pays: for each such candidate, its largest gain over the window minus the
   least its victims could cost (a fractional cover, at their cheapest keep values, of the
   memory it needs; or no cover at all) stays within the margin;
3. the scored sets' scores do not move: with every pack empty a score moves only with the
   swap-out its memory excess forces, a step function of the budget: a budget range;
4. the search scores the same sets in the same order: the order of the top agents by waiting
   gain holds (all gains share the factor H, so they are compared without it);
5. no request crosses the starvation limit (`until_s`), and no path refresh is pending (the
   policy checks that before asking here).

Each drifting input gets a range over the window: time up to `until_s`, tpot a band around
its value, the budget the range of 1 and 3 (the engine checks these three at every step), the
generated tokens the window's length in steps. Every quantity the decision compares is then
bounded from those ranges by monotonicity (aging in time; the SRPT-weighted gain in H, a
ratio of lengths linear in H; redo cost in tpot and generated tokens), with a relative slack
of `EPS` for rounding. The window is the longest of `LADDER` whose certificate holds.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from topas_bench.schedulers.base import BUDGET_MARGIN, EngineView, Standing
from topas_bench.schedulers.topas.pack import Candidate, PackInputs, _earliest_fit
from topas_bench.schedulers.topas.params import TopasParams
from topas_bench.schedulers.topas.paths import TaskPath
from topas_bench.schedulers.topas.search import AgentInfo, Choice

#: Relative half-widths of the step-time band a standing decision assumes, widest first: the
#: widest that stands one step is kept (the estimate drifts slowly between batch changes).
TPOT_BANDS = (0.1, 0.03, 0.01, 0.003)
#: Windows tried, in decode steps, shortest first: the longest that passes stands.
LADDER = (1, 4, 16, 64, 256, 1024)
#: Relative slack for rounding: a comparison closer than this is taken as able to flip.
EPS = 1e-9
#: Bisections of the budget ceiling that keeps preemptions from paying, or a reservation
#: refusing a backfill.
CEILING_BISECTIONS = 6
#: A window's time limit, in step-time estimates per step (the engine also stops at `steps`).
TIME_PER_STEP = 2.0

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


class Certificate:
    """The proof that an empty decision stands, for as many steps as it can be made."""

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

    # -- the window ----------------------------------------------------------------------
    def standing(self, steps: int = LADDER[-1]) -> Standing | None:
        """The longest window of `LADDER` (cut at `steps`) the decision provably stands for,
        or None (`base.ProvesStanding`)."""
        self.ladder = (*(k for k in LADDER if k < steps), min(steps, LADDER[-1]))
        found = self._prove() if steps >= 1 else None
        if self.tally is not None:
            self.tally[f"stands {found.steps}" if found else (self.failed or "none")] += 1
        return found

    def _prove(self) -> Standing | None:
        if not self.visited or not self.running:
            return None
        if self._scores_cannot_hold():
            self.failed = "scores"
            return None
        if not self._prepare():
            self.failed = self.failed or "starvation"
            return None
        # the usual answer first: the longest window at the widest band
        self._band(TPOT_BANDS[0])
        best = self._window(self.ladder[-1])
        if best is not None:
            return best
        # then the shortest window at the narrowest band: if that fails, every one does
        self._band(TPOT_BANDS[-1])
        if self._window(self.ladder[0]) is None:
            return None
        for band in TPOT_BANDS:  # the widest band that stands one step
            self._band(band)
            best = self._window(self.ladder[0])
            if best is not None:
                break
        # the longest window of the ladder that stands at that band: bisecting between the
        # longest known to stand and the shortest not
        good, bad = 0, len(self.ladder) - (1 if band == TPOT_BANDS[0] else 0)
        while bad - good > 1:
            mid = len(self.ladder) - 1 if bad == len(self.ladder) else (good + bad) // 2
            found = self._window(self.ladder[mid])
            if found is None:
                bad = mid
            else:
                good, best = mid, found
        return best

    def _band(self, band: float) -> None:
        self.tpot_lo, self.tpot_hi = self.tpot * (1.0 - band), self.tpot * (1.0 + band)

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

    # -- one window ------------------------------------------------------------------------
    def _window(self, steps: int) -> Standing | None:
        """The standing for `steps` decode steps, if the certificate holds over them."""
        self._residuals(steps)
        until = min(self.until_starve, self.now + TIME_PER_STEP * steps * self.tpot_hi)
        h_lo, h_hi = self._horizon_range()
        u_lo, u_hi = self._weight_range(h_lo, h_hi, until)
        n_lo = u_lo[self.task_of] * self.share  # gains / H
        n_hi = u_hi[self.task_of] * self.share
        if not self._order_holds(u_lo, u_hi):
            self.failed = "agent order"
            return None
        considered = self._considered(n_lo, n_hi)
        # per scored set (rows) and considered request (columns): the budget above which it
        # fits, where the set's pack walks it
        agent = self.agent_of[considered]
        walked = self.walks[:, agent] | self.urgent[considered][None, :]
        cost = self.cost[considered][None, :]
        fits_at = np.where(walked, cost + self.offsets[:, agent], np.inf)
        # a set whose pack admits something (and loses) is bounded by its score instead
        fits_at[self.acting] = np.inf
        margin = BUDGET_MARGIN
        budget_lo = self.swap_lo
        budget_hi = min(self.swap_hi, float(fits_at.min(initial=math.inf)))
        first = np.ones(len(considered), dtype=bool)  # may be walked first (and preempt)
        if budget_hi < self.budget0 + margin:
            # something fits now: it must be one a reservation holds back (backfill)
            budget_lo = max(budget_lo, self.budget0 - len(self.running) * steps)
            budget_hi, first = self._held_back(considered, fits_at, budget_lo, n_lo, n_hi, steps)
        if not budget_lo + margin <= self.budget0 <= budget_hi - margin:
            self.failed = "fits"
            return None
        fits_at = np.where(first, fits_at.min(axis=0), np.inf)
        if self.acting.any():
            # in a pack that admits, any request may find no reservation, and its agent's
            # prefix may be paid already
            paid_at = np.where(walked, cost + self.paid_offsets[:, agent], np.inf)[self.acting]
            fits_at = np.minimum(fits_at, paid_at.min(axis=0))
        gain_hi = n_hi[considered] * (h_hi * (1.0 + EPS))
        pays = self._preemption_test(gain_hi, steps)
        if pays is not None and pays(fits_at - budget_hi):
            # a lower ceiling leaves more memory to free, so dearer victims: the highest
            # ceiling (bisected) at which no preemption can pay
            low, high = self.budget0 + margin, budget_hi
            if pays(fits_at - low):
                self.failed = "preemption"
                return None
            for _ in range(CEILING_BISECTIONS):
                mid = 0.5 * (low + high)
                low, high = (low, mid) if pays(fits_at - mid) else (mid, high)
            budget_hi = low
        if self.acting.any():
            admits = walked & (cost + self.paid_offsets[:, agent] < budget_hi)
            best = np.where(admits, gain_hi[None, :], 0.0).sum(axis=1) + self.reuse_max
            if not self._comparisons_hold(best):
                self.failed = "scores"
                return None
        return Standing(
            steps=steps, until_s=until, tpot_lo_s=self.tpot_lo, tpot_hi_s=self.tpot_hi,
            budget_lo=budget_lo, budget_hi=budget_hi,
        )  # fmt: skip

    def _acting_comparisons(self) -> Iterator[tuple[int, int, float]]:
        """(x's index, y's index, margin) of each comparison the search made between sets x
        (kept) and y of which one acts; a comparison of two fixed sets holds (3)."""
        where = {keep: s for s, keep in enumerate(self.visited)}
        for x, y, margin in self.comparisons:
            i, j = where[x], where[y]
            if self.acting[i] or self.acting[j]:
                yield i, j, margin

    def _fails_whatever_bounds(self, i: int, j: int, margin: float) -> bool:
        """The tests of `_comparisons_hold` that read only the scores and which sets act."""
        if self.scores[j] > self.scores[i] + margin:  # y was preferred: it must stay so, so
            return True  # its least must beat (an acting set's least score is not bounded here)
        return bool(self.acting[i])  # x kept: its least must stay above y's most

    def _scores_cannot_hold(self) -> bool:
        """Whether `_comparisons_hold` fails at every window, whatever its bounds: a comparison
        with an acting set that preferred y, or kept an acting x. Those two tests read only
        the scores and which sets act, so no window can pass them; checking them first spares
        the proof (the answer, None, is the same)."""
        return any(self._fails_whatever_bounds(*c) for c in self._acting_comparisons())

    def _comparisons_hold(self, best: F64) -> bool:
        """4 with packs that act: every comparison of scores the search made goes the same
        way over the window. An empty pack's score is fixed (3); one that admits is at most
        the most gain of every request it may admit plus its most reuse (it loses the rest:
        redo, revoke, moves are never negative); no preemption pays (2)."""
        for i, j, margin in self._acting_comparisons():
            if self._fails_whatever_bounds(i, j, margin):
                return False
            sx, sy = self.scores[i], self.scores[j]
            slack = EPS * (1.0 + abs(sx) + abs(sy) + float(best[i]) + float(best[j]))
            if not float(best[j]) <= sx + margin - slack:
                return False
        return True

    def _held_back(
        self,
        considered: npt.NDArray[np.intp],
        fits_at: F64,
        budget_lo: float,
        n_lo: F64,
        n_hi: F64,
        steps: int,
    ) -> tuple[float, npt.NDArray[np.bool_]]:
        """1 with backfill: the budget ceiling under which each scored set's pack admits
        nothing, counting requests that fit but that the reservation of the set's first
        request would refuse (`pack._backfill_ok`) throughout the window.

        The first request a pack walks is the one with the highest ranking key (no starving
        one may be considered); where that holds over the window and it does not fit, it is
        reserved, and a later request that fits is refused while, over every budget,
        release time and free of the window, admitting it would make the reserved one fit
        later: the earliest fit with it (its memory back only when it ends, everything else
        as early and as large as it can be) is later than the one without (as late and as
        small). `budget_lo` must hold throughout: decode lowers the budget by at most one
        token per running request per step. Also which considered requests a pack may walk
        first, the only ones that may preempt (a later one finds a reservation made)."""
        first = np.zeros(len(considered), dtype=bool)
        if bool(self.urgent[considered].any()):
            return -math.inf, first  # starving requests go first, whatever their keys
        key_lo, key_hi = (n_lo, n_hi) if not self.p.density else (
            n_lo / self.denom, n_hi / self.denom)  # fmt: skip
        t_lo, t_hi, frees_lo, frees_hi = self._releases(steps)
        late = sorted(zip(t_hi, frees_lo, strict=True))
        early = sorted(zip(t_lo, frees_hi, strict=True))
        ceiling = self.swap_hi
        for s in range(len(self.visited)):
            walked = np.flatnonzero(np.isfinite(fits_at[s]))
            if not len(walked):
                continue
            keys = key_lo[considered[walked]]
            head = int(np.argmax(keys))
            top, rest = walked[head], np.delete(walked, head)
            blocked = float(fits_at[s, top])
            if len(rest) and not key_lo[considered[top]] > key_hi[considered[rest]].max() * (
                1.0 + EPS
            ):
                ceiling = min(ceiling, float(fits_at[s].min()))  # no order: nothing may fit
                first[walked] = True
                continue
            first[top] = True
            delta = self.deltas[s]
            # the reservations: the first request walked, and the second where its place is
            # certain and it does not fit now (`pack.greedy_pack` holds up to two); each with
            # its cost in this set's pack and its earliest fit without a backfill (as late as
            # it can be)
            reserved = [(blocked, top)]
            if len(rest) > 1:
                nxt = int(np.argmax(key_lo[considered[rest]]))
                second, others = rest[nxt], np.delete(rest, nxt)
                at2 = float(fits_at[s, second])
                certain = key_lo[considered[second]] > key_hi[considered[others]].max() * (
                    1.0 + EPS
                )
                if certain and at2 > self.budget0 + BUDGET_MARGIN:
                    reserved.append((at2, second))
            plans = [
                (at_r, r, at_r - delta,
                 _earliest_fit(at_r - delta, budget_lo - delta, late) * (1.0 + EPS) + EPS)
                for at_r, r in reserved
            ]  # fmt: skip
            for c in rest:
                at = float(fits_at[s, c])
                if at >= min(blocked, ceiling):
                    continue  # blocked whenever the first reserved one is
                cost = at - delta
                releases = sorted([*early, (self._service_lo(int(considered[c])), cost)])
                # each reservation refuses it up to a budget (the lower the budget, the
                # later the reserved one's earliest fit with it admitted): the highest
                best = -math.inf
                for at_r, r, need, without in plans:
                    if r == c:
                        continue
                    # the second one stays a reservation only while it does not fit
                    high = min(blocked, ceiling, at_r)
                    best = max(best, self._refused_up_to(need, without, cost, delta, releases,
                                                         high))  # fmt: skip
                if best < self.budget0 + BUDGET_MARGIN:
                    blocked = at  # it might be admitted: keep the budget where it does not fit
                else:
                    ceiling = min(ceiling, best)
            ceiling = min(ceiling, blocked)
        return ceiling, first

    def _refused_up_to(
        self,
        need: float,
        without: float,
        cost: float,
        delta: float,
        releases: list[tuple[float, float]],
        high: float,
    ) -> float:
        """The highest budget up to `high` (bisected) at which a reservation of `need` tokens,
        which fits at `without` at the latest without a backfill, refuses one of `cost`
        tokens that gives its memory back as `releases` say (its earliest fit with the
        backfill admitted is later); -inf if it does not at this decision's budget."""
        low = self.budget0 + BUDGET_MARGIN
        if high < low or not _earliest_fit(need, low - delta - cost, releases) > without:
            return -math.inf
        if _earliest_fit(need, high - delta - cost, releases) > without:
            return high
        for _ in range(CEILING_BISECTIONS):
            mid = 0.5 * (low + high)
            refused = _earliest_fit(need, mid - delta - cost, releases) > without
            low, high = (mid, high) if refused else (low, mid)
        return low

    def _releases(self, steps: int) -> tuple[list[float], list[float], list[int], list[int]]:
        """The victims' release times (their residual service) and frees, least and most,
        over the window (`pack.PackInputs.victims`, whose releases backfill counts on)."""
        t_lo, t_hi, f_lo, f_hi = [], [], [], []
        for i, g, _, base in self.victims:
            t_lo.append(self._rt_lo[i] * self.tpot_lo * (1.0 - EPS))
            t_hi.append(self._rt_hi[i] * self.tpot_hi * (1.0 + EPS))
            f_lo.append(base + g + int(self._rt_lo[i]))
            f_hi.append(base + g + steps + int(self._rt_hi[i]))
        return t_lo, t_hi, f_lo, f_hi

    def _service_lo(self, i: int) -> float:
        """The least expected service of waiting request i over the window (its prefill, and
        its expected output at the low step time): when admitting it would give memory back."""
        r = self.rows.requests[i]
        est = self.view.estimator
        out = est.residual_tokens(r.agent, r.kind, r.generated, (r.task_id, r.stage_id))
        prefill = est.prefill_s(max(r.prompt_tokens + r.generated, 1), 0)
        return (out * self.tpot_lo + prefill) * (1.0 - EPS)

    def _residuals(self, steps: int) -> None:
        """Each running request's residual output range over generated .. generated + steps
        (memoised per window length: the ladder tries several)."""
        hit = self._rt_memo.get(steps)
        if hit is None:
            est = self.view.estimator
            lo, hi = [], []
            for r in self.running:
                a, b = est.residual_tokens_range(
                    r.agent, r.kind, r.generated, steps, (r.task_id, r.stage_id)
                )
                lo.append(a)
                hi.append(b)
            hit = self._rt_memo[steps] = (lo, hi)
        self._rt_lo, self._rt_hi = hit

    def _horizon_range(self) -> tuple[float, float]:
        """`Topas._horizon` over the window: mean residual service of the running requests,
        at least one step."""
        if self.p.horizon_s is not None:
            return self.p.horizon_s, self.p.horizon_s
        n = len(self.running)
        lo = max(sum(self._rt_lo) / n * self.tpot_lo, self.tpot_lo)
        hi = max(sum(self._rt_hi) / n * self.tpot_hi, self.tpot_hi)
        return lo * (1.0 - EPS), hi * (1.0 + EPS)

    def _weight_range(self, h_lo: float, h_hi: float, until: float) -> tuple[F64, F64]:
        """Each task's weight over H (aging x SRPT factor), low and high, over the window:
        aging rises with time; the SRPT factor (mean L / L_i) ** alpha is monotone in H (a
        ratio of two functions linear in H), so its extremes are at H's ends."""
        alpha = self.p.srpt_exponent
        g_lo, g_hi = self.aging_now, self.aging_now
        if self.pool.h_age > 0:
            waited = np.maximum(until - self.arrival, 0.0)
            g_hi = 1.0 + self.p.rho * np.log1p(waited / self.pool.h_age)
        if alpha:
            length = self.service + self.hops * np.array([[h_lo], [h_hi]])  # L at both ends
            ratio = length.mean(axis=1, keepdims=True) / np.where(self.live, length, 1.0)
            ratio = np.where(self.live, ratio, 1.0)  # no SRPT factor on an empty path
            g_lo = g_lo * ratio.min(axis=0) ** alpha
            g_hi = g_hi * ratio.max(axis=0) ** alpha
        return g_lo * (1.0 - EPS), g_hi * (1.0 + EPS)

    def _order_holds(self, u_lo: F64, u_hi: F64) -> bool:
        """4: the search's agent order (by waiting gain, then name) holds through its top
        `max_agents` and the first one past them. For two neighbours x before y, the gain
        difference `sum_t w_t (s_xt - s_yt)` (w_t: task t's weight, s_at: the shares of a's
        requests in task t) stays positive with each w_t anywhere in its range; two agents
        whose requests are the same tasks with the same shares, in the same queue order, have
        the same gain to the last bit, and keep their order by name."""
        for pos, neg, shares in self._differences():
            low = float(pos.dot(u_lo) + neg.dot(u_hi))
            scale = float((pos - neg).dot(u_hi)) + shares * float(u_hi.max())
            if not low > EPS * scale:
                return False
        return True

    def _differences(self) -> list[tuple[F64, F64, float]]:
        """Per neighbour pair of `_order_holds` that is not tied for good: the positive and
        negative parts of `s_xt - s_yt` over tasks t, and the pair's summed shares."""
        if self._pairs is None:
            tasks = len(self.service)
            self._pairs = []
            for x, y in self.neighbours:
                sx, sy = self._terms(x), self._terms(y)
                if sx[0].tolist() == sy[0].tolist() and sx[1].tolist() == sy[1].tolist():
                    continue  # the same sums in the same order: tied for good, by name
                d = np.bincount(sx[0], weights=sx[1], minlength=tasks).astype(np.float64)
                d -= np.bincount(sy[0], weights=sy[1], minlength=tasks)  # (empty: integers)
                shares = float(sx[1].sum() + sy[1].sum())
                self._pairs.append((np.maximum(d, 0.0), np.minimum(d, 0.0), shares))
        return self._pairs

    def _terms(self, agent: str) -> tuple[npt.NDArray[np.int64], F64]:
        """The tasks and shares of `agent`'s waiting requests, in queue order."""
        mine = self.agent_of == self.agent_ix[agent]
        return self.task_of[mine], self.share[mine]

    def _considered(self, n_lo: F64, n_hi: F64) -> npt.NDArray[np.intp]:
        """Indices of the waiting requests that may be walked by a pack in the window: every
        starving one, and those whose ranking key may reach the scan's top `scan`."""
        key_lo, key_hi = n_lo, n_hi
        if self.p.density:
            key_lo, key_hi = n_lo / self.denom, n_hi / self.denom
        calm = ~self.urgent
        scan = self.inp.scan
        keep = self.urgent.copy()
        if int(calm.sum()) <= scan:
            keep |= calm
        else:
            threshold = np.partition(key_lo[calm], -scan)[-scan]
            keep |= calm & (key_hi * (1.0 + EPS) >= threshold * (1.0 - EPS))
        return np.flatnonzero(keep)

    def _preemption_test(self, gain_hi: F64, steps: int) -> Callable[[F64], bool] | None:
        """2: whether some candidate's preemption may pay, given `need`, the least memory
        each would have to free (its cost less the budget ceiling). Its victims must free more
        than that: at least the p victims with the most frees (at their largest over the
        window) that together exceed it, so they cost at least the p cheapest keep values (at
        their least: tpot low, generated tokens as now), and at least the fractional cover of
        the need at the cheapest keep value per token freed; and where the victims' order by
        keep value holds, at least the prefix of that order the pack would take. None when no
        preemption can pay at any need: no victims, or no gain beats the cheapest victim by
        the margin."""
        if not self.victims:
            return None
        g, fixed = self.v_generated, self.v_fixed
        keep_lo = (self.tpot_lo * g + fixed) * (1.0 - EPS)
        margin = self.inp.preempt_margin_s  # infinite where the class never preempts
        top, cheapest_one = float(gain_hi.max(initial=0.0)), float(keep_lo.min())
        # `pays` below with every gain at its largest and every value at its least
        if top - cheapest_one * (1.0 - EPS) + EPS * (1.0 + top + abs(margin)) <= margin:
            return None
        # (int() of a residual, never negative, is its floor)
        frees_hi = self.v_base + g + steps + np.floor(np.array(self._rt_hi)[self.v_index])
        room = frees_hi > 0
        rate = np.where(room, keep_lo / np.where(room, frees_hi, 1.0), math.inf)
        order = np.argsort(rate, kind="stable")
        order = order[room[order]]
        cum_frees = np.concatenate(([0.0], np.cumsum(frees_hi[order])))
        cum_keep = np.concatenate(([0.0], np.cumsum(keep_lo[order])))
        most_frees = np.cumsum(np.sort(frees_hi)[::-1])  # the p victims freeing most, p = 1..
        cheapest = np.cumsum(np.sort(keep_lo))  # the p cheapest keep values
        total = cum_frees[-1]
        last = len(cheapest) - 1
        # The pack takes victims cheapest first (`Topas._victims`' order) until they make
        # room: where that order cannot change over the window, the victims it takes are a
        # prefix of it, at least as long as with every one freeing its most.
        keep_hi = (self.tpot_hi * (g + steps) + fixed) * (1.0 + EPS)
        ordered = bool(np.all(keep_hi[:-1] < keep_lo[1:]))
        prefix_frees = np.cumsum(frees_hi)
        prefix_keep = np.cumsum(keep_lo)

        def pays(need: F64) -> bool:
            p = np.searchsorted(most_frees, need, side="right")  # victims needed, less one
            fewest = cheapest[np.minimum(p, last)]
            value_lo = np.maximum(np.interp(need, cum_frees, cum_keep), fewest)
            if ordered:
                taken = np.searchsorted(prefix_frees, need, side="right")
                value_lo = np.maximum(value_lo, prefix_keep[np.minimum(taken, last)])
            slack = EPS * (1.0 + np.abs(gain_hi) + np.abs(value_lo) + abs(margin))
            possible = need < total  # else every victim together cannot make room
            return bool(np.any(possible & (gain_hi - value_lo > margin - slack)))

        return pays
