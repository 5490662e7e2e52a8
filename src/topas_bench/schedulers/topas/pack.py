"""GREEDY-PACK and the resident-prefix search of TOPAS (DESIGN section 5).

Memory is counted the way the engine's admission counts it (`PrefillAdder`): the budget is
`free + evictable - reserved`; admitting a request costs its admission need plus the evictable
tokens on its matched prefix, which its lock takes out of the evictable pool; keeping (pinning)
an unlocked resident prefix costs its tokens; releasing a kept one returns them. An agent
prefix is paid once per pack: the first admit (or the pin) that locks it pays, later admits of
the same agent do not. A prefix that is not resident is computed by the request that brings it;
two requests computing the same prefix in one batch would compute it twice (SGLang does not
share within a batch), so at most one request per absent prefix is packed per decision.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from topas_bench.schedulers.base import RequestView


@dataclass(slots=True)
class Candidate:
    """A waiting request, scored: `gain` = g * delta * srpt scale, `move_s` its J_move."""

    req: RequestView
    agent: str
    gain: float
    move_s: float
    need: int  # admission need + lock cost of its matched path
    prefix_unlocked: int  # the agent-prefix part of that lock cost (0 if not resident/locked)
    resident: bool  # its agent prefix is on the GPU
    urgent: bool = False  # has waited past the starvation limit: ranked first, blocks backfill

    @property
    def net(self) -> float:
        return self.gain - self.move_s


@dataclass(slots=True)
class Victim:
    """A running request that could be preempted."""

    req: RequestView
    keep_value_s: float  # J_redo + J_revoke: what preempting it costs
    frees: int  # estimated budget tokens released


@dataclass(slots=True)
class Pack:
    admits: list[Candidate] = field(default_factory=list)
    preempts: list[Victim] = field(default_factory=list)
    value: float = 0.0  # sum(g * delta) - J_move - J_redo - J_revoke
    left: float = 0.0  # budget tokens left


@dataclass(frozen=True, slots=True)
class PackInputs:
    ranked: Sequence[Candidate]  # by net gain, best first
    victims: Sequence[Victim]  # cheapest to preempt first
    budget: float  # remaining_total before any pin changes
    prefix_tokens: dict[str, int]  # resident agent -> unlocked prefix tokens pinning would lock
    kept_unlocked: dict[str, int]  # currently kept agent -> tokens released if unkept
    locked_agents: frozenset[str]  # agents whose prefix running requests lock already
    max_actions: int
    scan: int
    preempt_margin_s: float


def greedy_pack(inp: PackInputs, keep: frozenset[str]) -> Pack:
    """Admit by largest net gain while the budget lasts (skipping what does not fit), with
    at most one preemption to make room for the best candidate that does not fit. An urgent
    (starving) candidate that does not fit stops the pack: nothing behind it is backfilled."""
    budget = inp.budget
    budget -= sum(inp.prefix_tokens.get(a, 0) for a in keep if a not in inp.kept_unlocked)
    budget += sum(t for a, t in inp.kept_unlocked.items() if a not in keep)
    paid = set(keep) | inp.locked_agents
    absent_taken: set[str] = set()
    pack = Pack()
    victims = list(inp.victims)
    for cand in itertools.islice(inp.ranked, inp.scan):
        if len(pack.admits) + len(pack.preempts) >= inp.max_actions:
            break
        if cand.net <= 0 and not cand.urgent:
            break
        if not cand.resident and cand.agent in absent_taken:
            continue
        cost = cand.need - (cand.prefix_unlocked if cand.agent in paid else 0)
        if cost >= budget and not pack.preempts and victims:
            victim = next(
                (v for v in victims if v.frees + budget > cost
                 and cand.net - v.keep_value_s > inp.preempt_margin_s),
                None,
            )  # fmt: skip
            if victim is not None and len(pack.admits) + 2 <= inp.max_actions:
                victims.remove(victim)
                pack.preempts.append(victim)
                pack.value -= victim.keep_value_s
                budget += victim.frees
        if cost >= budget:
            if cand.urgent:
                break  # no backfill past a starving request: memory drains to it
            continue
        budget -= cost
        pack.admits.append(cand)
        pack.value += cand.net
        paid.add(cand.agent)
        if not cand.resident:
            absent_taken.add(cand.agent)
    pack.left = budget
    return pack


def search_keep_set(
    inp: PackInputs,
    reuse: dict[str, float],
    max_exact: int,
) -> tuple[frozenset[str], Pack]:
    """The prefix set R' maximising pack value + V_reuse(R').

    Prefixes already locked by running requests cost nothing to keep and are kept when they
    have reuse value. The others are scored jointly with GREEDY-PACK: every subset when there
    are at most `max_exact`, else greedy additions (single, then pairs when stuck) and an
    add/remove/swap repair pass.
    """
    free_keep = frozenset(a for a, v in reuse.items() if v > 0 and a in inp.locked_agents)
    options = sorted(
        (a for a, v in reuse.items() if v > 0 and a not in free_keep and a in inp.prefix_tokens),
        key=lambda a: (-reuse[a] / max(inp.prefix_tokens[a], 1), a),
    )

    def score(keep: frozenset[str]) -> tuple[float, Pack]:
        pack = greedy_pack(inp, keep)
        return pack.value + sum(reuse.get(a, 0.0) for a in keep), pack

    base = free_keep
    best_val, best_pack = score(base)
    best = base
    if not options:
        return best, best_pack
    everything = base | frozenset(options)
    # Fast path: keeping every option does not crowd out any admission.
    if best_pack.left - sum(inp.prefix_tokens[a] for a in options) > 0:
        val, pack = score(everything)
        if val >= best_val:
            return everything, pack
    if len(options) <= max_exact:
        for n in range(1, len(options) + 1):
            for combo in itertools.combinations(options, n):
                keep = base | frozenset(combo)
                val, pack = score(keep)
                if val > best_val:
                    best_val, best_pack, best = val, pack, keep
        return best, best_pack
    return _greedy_repair(options, base, score, best_val, best_pack)


def _greedy_repair(
    options: list[str],
    base: frozenset[str],
    score: object,
    best_val: float,
    best_pack: Pack,
) -> tuple[frozenset[str], Pack]:
    assert callable(score)
    current = base
    improved = True
    while improved:
        improved = False
        singles = [current | {a} for a in options if a not in current]
        moves = singles or []
        if not any(score(k)[0] > best_val for k in singles):
            outside = [a for a in options if a not in current]
            moves = [current | {a, b} for a, b in itertools.combinations(outside, 2)]
        removes = [current - {a} for a in current if a not in base]
        swaps = [
            (current - {a}) | {b}
            for a in current if a not in base
            for b in options if b not in current
        ]  # fmt: skip
        for keep in [*moves, *removes, *swaps]:
            val, pack = score(frozenset(keep))
            if val > best_val + 1e-12:
                best_val, best_pack, current = val, pack, frozenset(keep)
                improved = True
                break
    return current, best_pack
