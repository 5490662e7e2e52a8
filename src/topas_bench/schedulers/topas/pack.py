"""GREEDY-PACK: the admissions (and preemptions) TOPAS makes for one resident set R'.

Memory is counted the way the engine's admission counts it (SGLang's `PrefillAdder`): the budget
is `free + evictable - reserved`; admitting a request costs its admission need plus the cached
tokens its lock takes out of the evictable pool, and must stay strictly below the budget.
Pinning an unlocked resident prefix of R' costs its tokens; releasing a kept prefix outside R'
returns them. An agent prefix is paid once per pack: by its pin, or by the first admission that
locks it. A prefix that is not resident is computed by the request that brings it; SGLang does
not share a prefix computed twice in one batch, so at most one request per absent prefix is
packed per decision.

Candidates come ranked (best progress gain first, starving ones first of all). The pack walks
them in order and admits what fits, up to `max_actions` admissions and preemptions. When a
candidate does not fit, it may preempt running requests to make room (several if needed) when
its gain beats their redo and revoke cost by `preempt_margin_s`; otherwise it becomes a
reservation, and a later candidate is admitted only if that cannot delay any reservation
(conservative, EASY-style backfilling: with the memory the running requests are expected to
release over time, the reserved candidate must fit no later than without the backfill).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from topas_bench.schedulers.base import RequestView


@dataclass(slots=True)
class Candidate:
    """A waiting request, scored: `gain` = its weighted critical-path saving (seconds)."""

    req: RequestView
    agent: str
    gain: float
    cost: int  # admission need + lock cost of its matched path (budget tokens)
    prefix: int  # the agent-prefix part of `cost` when resident and unlocked, else 0
    absent: bool  # its agent prefix is not on the GPU: it computes it
    service_s: float  # expected service once admitted (prefill + output)
    urgent: bool = False  # waited past the starvation limit: first, never delayed by backfill


@dataclass(slots=True)
class Victim:
    """A running request that could be preempted."""

    req: RequestView
    agent: str
    keep_value_s: float  # J_redo + J_revoke: what preempting it costs
    frees: int  # budget tokens its preemption releases
    release_s: float  # when it is expected to finish (and release them) anyway


@dataclass(slots=True)
class Pack:
    admits: list[Candidate] = field(default_factory=list)
    preempts: list[Victim] = field(default_factory=list)
    gain: float = 0.0  # sum of admitted gains
    lost: float = 0.0  # J_redo + J_revoke of the preemptions
    used: float = 0.0  # budget tokens the admissions and pins take

    @property
    def actions(self) -> int:
        return len(self.admits) + len(self.preempts)


@dataclass(frozen=True, slots=True)
class PackInputs:
    ranked: Sequence[Candidate]  # best first
    victims: Sequence[Victim]  # cheapest to preempt first
    budget: float  # remaining_total before any pin changes
    prefix_tokens: dict[str, int]  # resident unlocked unkept agent -> tokens a pin would lock
    kept_unlocked: dict[str, int]  # kept agent nobody runs -> tokens unkeeping releases
    locked_agents: frozenset[str]  # agents whose prefix running requests lock already
    max_actions: int
    scan: int
    preempt_margin_s: float  # infinite: no preemption pays (a class that never preempts)
    open_agents: frozenset[str] = frozenset()  # agents with no shared prefix: never restricted
    running_tasks: frozenset[str] = frozenset()  # tasks with a running request (a move stalls)
    #: (expected finish, frees) of each victim, soonest first: when memory comes back anyway
    releases: tuple[tuple[float, int], ...] = field(init=False)

    def __post_init__(self) -> None:
        releases = tuple(sorted((v.release_s, v.frees) for v in self.victims))
        object.__setattr__(self, "releases", releases)


def pin_delta(inp: PackInputs, keep: frozenset[str]) -> int:
    """Budget tokens keeping exactly `keep` costs (negative: it releases pins)."""
    take = sum(inp.prefix_tokens.get(a, 0) for a in keep)
    give = sum(t for a, t in inp.kept_unlocked.items() if a not in keep)
    return take - give


def greedy_pack(inp: PackInputs, allowed: frozenset[str] | None, keep: frozenset[str]) -> Pack:
    """Admissions for the resident set: candidates of agents in `allowed` (None: any agent;
    urgent candidates and those with nothing reusable always), `keep` pinned."""
    pack = Pack()
    delta = pin_delta(inp, keep)
    budget = inp.budget - delta
    pack.used = float(delta)
    paid = set(keep) | inp.locked_agents | set(inp.kept_unlocked)
    absent_taken: set[str] = set()
    releases = inp.releases
    victims = list(inp.victims)
    reserved: list[Candidate] = []  # blocked candidates later ones must not delay
    # (locals and an action count kept by hand: the search packs up to 2M + 3 sets a decision)
    admits, preempts, open_agents = pack.admits, pack.preempts, inp.open_agents
    max_actions = inp.max_actions
    for cand in itertools.islice(inp.ranked, inp.scan):
        if len(admits) + len(preempts) >= max_actions:
            break
        agent = cand.agent
        if (
            allowed is not None
            and agent not in allowed
            and not cand.urgent
            and agent not in open_agents
        ):
            continue
        if cand.absent and agent in absent_taken:
            continue
        cost = cand.cost - (cand.prefix if agent in paid else 0)
        if cost >= budget and not reserved:
            budget = _preempt_for(cand, cost, budget, victims, pack, inp)
        if cost >= budget:
            if len(reserved) < 2:
                reserved.append(cand)
            continue
        if reserved and not _backfill_ok(cand, cost, budget, releases, reserved, paid):
            continue
        budget -= cost
        pack.used += cost
        admits.append(cand)
        pack.gain += cand.gain
        paid.add(agent)
        if cand.absent:
            absent_taken.add(agent)
    return pack


def first_misfit(inp: PackInputs, pack: Pack, keep: frozenset[str]) -> Candidate | None:
    """The best-ranked candidate, of any agent, that `pack` (for resident set `keep`) did not
    admit and that does not fit the budget it leaves: where a pass walking the same ranking
    would stop for memory (SGLang's NO_TOKEN)."""
    paid = set(keep) | inp.locked_agents | set(inp.kept_unlocked)
    paid.update(c.agent for c in pack.admits)
    left = inp.budget - pack.used
    admitted = {c.req.rid for c in pack.admits}
    for cand in itertools.islice(inp.ranked, inp.scan):
        cost = cand.cost - (cand.prefix if cand.agent in paid else 0)
        if cand.req.rid not in admitted and cost >= left:
            return cand
    return None


def _preempt_for(
    cand: Candidate, cost: int, budget: float, victims: list[Victim], pack: Pack, inp: PackInputs
) -> float:
    """Preempt the cheapest victims that together make room for `cand`, if its gain beats
    their cost by the margin and the actions fit; returns the budget after."""
    chosen: list[Victim] = []
    room = budget
    value = 0.0
    for v in victims:
        if room > cost:
            break
        if v.agent == cand.agent and v.req.rid == cand.req.rid:
            continue
        chosen.append(v)
        room += v.frees
        value += v.keep_value_s
    if room <= cost or not chosen:
        return budget
    if pack.actions + len(chosen) + 1 > inp.max_actions:
        return budget
    if cand.gain - value <= inp.preempt_margin_s:
        return budget
    for v in chosen:
        victims.remove(v)
        pack.preempts.append(v)
        pack.lost += v.keep_value_s
    return room


def _backfill_ok(
    cand: Candidate,
    cost: int,
    budget: float,
    releases: Sequence[tuple[float, int]],
    reserved: list[Candidate],
    paid: set[str],
) -> bool:
    """Admitting `cand` now must not make any reserved candidate fit later than it would."""
    with_cand = list(releases)
    bisect.insort(with_cand, (cand.service_s, cost))
    for r in reserved:
        need = r.cost - (r.prefix if r.agent in paid else 0)
        if _earliest_fit(need, budget - cost, with_cand) > _earliest_fit(need, budget, releases):
            return False
    return True


def _earliest_fit(need: float, budget: float, releases: Sequence[tuple[float, float]]) -> float:
    """When released memory first lets `need` fit (strictly below the budget)."""
    if need < budget:
        return 0.0
    room = budget
    for t, freed in releases:
        room += freed
        if need < room:
            return t
    return float("inf")
