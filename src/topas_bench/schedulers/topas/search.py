"""The joint choice of TOPAS: which agents stay resident (R') and which of their requests run.

For a candidate resident set R', GREEDY-PACK (`pack.py`) admits only requests of agents in R'
(plus starving ones, and those of agents with no shared prefix: nothing of theirs is
reusable), R' prefixes that are resident are pinned, and the state is scored, in seconds of
critical path:

    score(R') = sum of admitted gains - J_redo - J_revoke - J_move(R') + V_reuse(R')

- J_move(R') = swap-in + swap-out. Swap-in: every absent prefix an admitted request brings in
  costs its reload time, charged per `move_charge`: "affected" (the paper's) once per task the
  move stalls, every running task and every task the pack admits (they all wait for the
  prefill that computes it); "admitted" once (the admitted task's delay); "running" once plus
  once per running task. Swap-out: a resident prefix left out of R' whose tokens the pack needs
  is evicted; its users (`n_a`) each pay its reload.
- V_reuse(R') = beta * sum over a in R' of n_a * reload(a).
- n_a (`reuse_users`): "next", the paper's, the stages of agent a due one hop ahead (ready once
  the running stages finish); "all" (ours), those plus agent a's waiting requests.
- reload(a) is one cost model for both: a host-tier load when a host tier holds evicted
  prefixes, else the prefill time to recompute the prefix.

Candidate sets (bounded, not every subset): the current set R0 (agents whose prefixes running
requests lock, plus those kept); R0 with one agent added, removed, or swapped for another; and
the top agents by the gain of their waiting requests, added greedily one at a time to the empty
set (which is scored too: no pins at all). The agents running requests lock are in every set.
The best score wins; ties go to the smaller change.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from topas_bench.schedulers.topas.pack import Pack, PackInputs, greedy_pack


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """What the search knows of an agent."""

    reload_s: float  # seconds to bring its prefix onto the GPU if it were absent
    resident: bool  # its prefix is on the GPU now
    tokens: int  # its prefix size
    next_users: int  # n_a: its users as `reuse_users` counts them
    stall_tasks: int  # running tasks a recompute of its prefix stalls


@dataclass(frozen=True, slots=True)
class Choice:
    keep: frozenset[str]
    pack: Pack
    score: float
    #: Every resident set the search scored, in order, and each comparison of two scores it
    #: made, `(x, y, margin)`: y was preferred iff its score exceeded x's by more than the
    #: margin (set on the search's answer; `standing` proves they hold).
    visited: tuple[Choice, ...] = ()
    comparisons: tuple[tuple[frozenset[str], frozenset[str], float], ...] = ()


def score_set(
    inp: PackInputs,
    agents: dict[str, AgentInfo],
    keep: frozenset[str],
    beta: float,
    joint: bool,
    charge: str = "admitted",
) -> Choice:
    """Pack for resident set `keep` and score it (`joint`: pack only its agents' requests;
    `charge`: who pays a swap-in, `params.MOVE_CHARGES`)."""
    pack = greedy_pack(inp, keep | inp.locked_agents if joint else None, keep)
    swap_in = 0.0
    brought: set[str] = set()
    for c in pack.admits:
        info = agents.get(c.agent)
        if c.absent and info is not None and c.agent not in brought:
            brought.add(c.agent)
            swap_in += info.reload_s * _payers(inp, pack, info, charge)
    swap_out = 0.0
    # what the pack uses beyond the budget the unkept resident prefixes do not hold
    unkept = {a: t for a, t in inp.prefix_tokens.items() if a not in keep}
    excess = pack.used - (inp.budget - sum(unkept.values()))
    if excess > 0:
        # the pack needs memory the unkept resident prefixes hold: evict the least used first
        out = sorted(
            (a for a in unkept if a in agents),
            key=lambda a: (agents[a].next_users * agents[a].reload_s, a),
        )
        for a in out:
            if excess <= 0:
                break
            excess -= unkept[a]
            swap_out += agents[a].next_users * agents[a].reload_s
    reuse = beta * sum(
        agents[a].next_users * agents[a].reload_s
        for a in sorted(keep | inp.locked_agents)  # a fixed order: float sums, hash seeds
        if a in agents and (agents[a].resident or a in brought)
    )
    score = pack.gain - pack.lost - swap_in - swap_out + reuse
    return Choice(keep, pack, score)


def _payers(inp: PackInputs, pack: Pack, info: AgentInfo, charge: str) -> int:
    """How many tasks pay a swap-in (`charge`, `params.MOVE_CHARGES`)."""
    if charge == "admitted":
        return 1
    if charge == "running":
        return 1 + info.stall_tasks
    return len(inp.running_tasks | {c.req.task_id for c in pack.admits})


def search(
    inp: PackInputs,
    agents: dict[str, AgentInfo],
    current: frozenset[str],
    agent_gain: dict[str, float],
    *,
    beta: float,
    joint: bool,
    top: int,
    must_admit: bool = False,
    charge: str = "admitted",
) -> Choice:
    """The best scored resident set among the bounded candidates around `current`; with
    `must_admit` (an idle server) only sets whose pack admits something count, and if none
    does, the unrestricted pack with no pins."""
    seen: dict[frozenset[str], Choice] = {}
    compared: list[tuple[frozenset[str], frozenset[str], float]] = []

    def _better(a: Choice, b: Choice) -> Choice:
        if must_admit and bool(a.pack.admits) != bool(b.pack.admits):
            return a if a.pack.admits else b
        compared.append((a.keep, b.keep, 1e-9))
        return b if b.score > a.score + 1e-9 else a

    def score(keep: frozenset[str]) -> Choice:
        keep = keep - inp.locked_agents
        hit = seen.get(keep)
        if hit is None:
            hit = seen[keep] = score_set(inp, agents, keep, beta, joint, charge)
        return hit

    base = current - inp.locked_agents
    options = sorted(
        (a for a in agents if a not in inp.locked_agents and a not in inp.open_agents),
        key=lambda a: (-agent_gain.get(a, 0.0), a),
    )[:top]
    best = score(base)
    for a in options:
        best = _better(best, score(base | {a}) if a not in base else score(base - {a}))
    for a in sorted(x for x in base if x not in options):
        best = _better(best, score(base - {a}))
    for a in sorted(base):  # sets iterate in hash order, which PYTHONHASHSEED changes
        for b in options:
            if b not in base:
                best = _better(best, score((base - {a}) | {b}))
    # greedy growth by agent gain from the empty set (no pins: every kept prefix released; it
    # is compared whenever the first step does not beat it): the concentrated alternative
    grown = frozenset[str]()
    for a in options:
        now, more = score(grown), score(grown | {a})
        compared.append((now.keep, more.keep, 0.0))
        if more.score > now.score:
            grown, now = grown | {a}, more
        best = _better(best, now)
    if must_admit and not best.pack.admits:
        # An idle server whose every set admits nothing (say, only absent prefixes wait and
        # none is in a set yet): the same pack, unrestricted, with every pin released.
        loose = score_set(inp, agents, frozenset(), beta, joint=False, charge=charge)
        best = loose if loose.pack.admits else best
    return replace(best, visited=tuple(seen.values()), comparisons=tuple(compared))
