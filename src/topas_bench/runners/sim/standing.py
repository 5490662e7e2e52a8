"""Closed-form decode runs across a standing decision (`schedulers.base.Standing`).

A policy that `acts_while_full` is asked at every iteration while requests wait, so the
simulator steps decode one iteration at a time for it. When its answer admits and preempts
nothing and comes with a `Standing`, the attempts it covers would each repeat it, and the
simulator runs them in closed form, like a baseline's decode run, up to the first of:

- what bounds any decode run: the first finish, the next client event, a kept context's expiry;
- free memory: no step of the run may evict (the policy's view of the cache must not change;
  a run of a cluster's replica never evicts either);
- the standing's own bound, checked at each covered attempt exactly as the view would answer
  it there: `steps`, `until_s` (the step ends), the step-time estimate after the steps so far
  (`ServiceEstimator.tpot_path`), and the admission budget (free tokens less a token per
  running request per step, the reservation at the decayed `new_token_ratio`).

It is used only where repeating the attempt has no effect of its own to lose: no chunked
prefill in flight, a queue pass that reorders nothing (`QueuePass.replayable`), and kept
prefixes that the attempt does not newly pin: each is pinned already, or not wholly on the GPU
(which a run without eviction cannot change), or dearer than the admission budget, which is
then checked at each covered attempt too. What the covered attempts did to the tree is replayed
when the run ends (`replay`): their prefix matches only refresh LRU stamps, so an attempt that
repeats the one before changes nothing, except where the one before split a node or a pass
touched the queue's prefixes (every 32nd).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from topas_bench.runners.sim.view import Simulator as EngineState
from topas_bench.schedulers.base import BUDGET_MARGIN, Decision
from topas_bench.workloads.model import agent_key

if TYPE_CHECKING:
    from topas_bench.runners.sim.calc_priority import QueuePass
    from topas_bench.runners.sim.config import SimConfig
    from topas_bench.runners.sim.pins import ContextPins
    from topas_bench.runners.sim.radix import Match, Node
    from topas_bench.runners.sim.state import SimRequest
    from topas_bench.workloads.pieces import Piece


class Simulator(EngineState, Protocol):
    """What a standing decision reads and replays of the engine (`engine.Simulator`): the view's
    state and the rest below (a protocol, so that this module need not import the engine that
    imports it)."""

    chunked: SimRequest | None
    trace: list[Any] | None
    contexts: ContextPins
    queue_pass: QueuePass
    processed_tokens: int

    def _match_req(self, req: SimRequest) -> tuple[int, Node]: ...

    def _keep(self, agents: frozenset[str]) -> None: ...

    def _match(self, key: list[Piece], limit: int | None = None) -> Match: ...


@dataclass(frozen=True, slots=True)
class Stand:
    """A decision the last attempt made, that the decode run after it may stand on."""

    decision: Decision
    head: SimRequest  # the waiting queue's head, which every attempt matches first
    marker: Marker  # the state the policy decided on
    pin_at: float  # an attempt pins a kept, resident, unpinned prefix once the budget is this


Marker = tuple[int, int, frozenset[str], frozenset[int], int, int]


def marker(sim: Simulator) -> Marker:
    """What must be as the policy saw it when a decode run stands on its decision: nothing
    the attempt did after deciding (pins applied, a node split), nor what the decode step
    did before the run (pins released, a retraction, an eviction for the first step)."""
    cache = sim.cache
    return (
        cache.version, cache.evictable_tokens, frozenset(sim.pins),
        frozenset(sim.contexts.pins), len(sim.running), len(sim.waiting),
    )  # fmt: skip


def offer(sim: Simulator, decision: Decision, decided: Marker | None) -> Stand | None:
    """The stand an attempt offers that decided `decision` on state `decided` and admitted
    nobody."""
    if (
        decided is None
        or not decision.reusable
        or sim.trace is not None
        or sim.chunked is not None
        or not sim.waiting
        or not sim.queue_pass.replayable(len(sim.waiting))
    ):
        return None
    pin_at = math.inf
    for agent in decision.keep_prefixes or ():
        tokens = sim.prefix_tokens.get(agent, 0)
        if agent in sim.pins or not tokens:
            continue
        if sim.cache.probe([(agent_key(agent), 0, tokens)])[0] >= tokens:
            # kept but not pinned for lack of room (`Simulator._keep`: the room is the
            # admission budget; an agent a running request uses costs nothing)
            in_use = any(r.agent == agent for r in sim.running)
            pin_at = min(pin_at, 0 if in_use else tokens)
    return Stand(decision, sim.waiting[0], decided, pin_at)


def run_steps(
    sim: Simulator,
    stand: Stand,
    k: int,
    durs: npt.NDArray[np.float64],
    ends: npt.NDArray[np.float64],
) -> int:
    """How many of the `k` planned decode steps may run before an attempt the stand does not
    cover: the decision's standing, asked for the `k - 1` attempts the run could cover, must
    hold at the attempt after step j (j = 1 .. k - 1, `Standing.holds`)."""
    s = stand.decision.standing(k - 1) if k > 1 else None
    if s is None:
        return 1
    k = min(k, s.steps + 1)
    if k <= 1:
        return 1
    running = sim.running
    cfg = sim.cfg
    steps = np.arange(1, k, dtype=np.float64)[:, None]  # the covered attempts, j = 1 .. k-1
    left = np.array([r.max_new_tokens - r.generated for r in running], dtype=np.float64)
    eos = np.array([r.ignore_eos for r in running], dtype=bool)
    share = np.minimum(left[None, :] - steps, cfg.clip_max_new_tokens)
    ratios = decayed(sim.ratio, k - 2, cfg)  # from the first covered attempt on
    reserved = share[:, ~eos].sum(axis=1) * np.array(ratios) + share[:, eos].sum(axis=1)
    free = sim.free_tokens + sim.cache.evictable_tokens
    budget = free - len(running) * steps[:, 0] - reserved
    tpots = np.array(sim.estimator.tpot_path(durs[: k - 1].tolist()))
    # `Standing.holds` at each covered attempt (its steps are within `s.steps` already),
    # and no kept prefix pinned
    holds = (
        (ends[: k - 1] < s.until_s)
        & (s.tpot_lo_s <= tpots) & (tpots <= s.tpot_hi_s)
        & (s.budget_lo + BUDGET_MARGIN <= budget) & (budget <= s.budget_hi - BUDGET_MARGIN)
        & (budget < stand.pin_at - BUDGET_MARGIN)
    )  # fmt: skip
    return int(np.argmin(holds)) + 1 if not holds.all() else k


def decayed(ratio: float, steps: int, cfg: SimConfig) -> list[float]:
    """`new_token_ratio` now and after each of `steps` decode steps, one step at a time
    (`Simulator._decay(1)` each: the roundings of a step-by-step run)."""
    out = [ratio]
    step, low = cfg.new_token_ratio_decay, cfg.min_new_token_ratio
    for _ in range(steps):
        ratio = max(ratio - step, low)
        out.append(ratio)
        if ratio == low:  # it stays there
            out.extend([low] * (steps + 1 - len(out)))
            break
    return out


def replay(sim: Simulator, stand: Stand, rounds: int) -> None:
    """What `rounds` covered attempts did to the tree, each repeating the decision: the queue
    pass (its touches when due), the kept prefixes' matches, the head's match. A round that
    repeats a round that split nothing changes nothing: the first is replayed (the decided
    attempt may have split), then each touching pass until one splits nothing; the others
    are only counted."""
    qp = sim.queue_pass
    waiting = len(sim.waiting)
    done = 0
    touches_split = True
    while done < rounds:
        due = qp.passes_to_refresh(waiting)
        if done and (due is None or not touches_split or done + due >= rounds):
            qp.skip(waiting, rounds - done)  # nothing left that changes the tree
            return
        if done and due:
            qp.skip(waiting, due)  # to the next touching pass
            done += due
        version = sim.cache.version
        touching = qp.passes_to_refresh(waiting) == 0
        sim.waiting = qp.run(sim.waiting, sim.cache, sim._match_req, sim.processed_tokens)
        if stand.decision.keep_prefixes is not None:
            sim._keep(stand.decision.keep_prefixes)
        sim._match(stand.head.fill(), stand.head.fill_tokens - 1)
        if touching:
            touches_split = sim.cache.version != version
        done += 1


def serve(
    running: list[SimRequest], ends: npt.NDArray[np.float64], start_s: float, steps: int
) -> None:
    """Credit a run's steps to its requests and tasks one step at a time, in the order and
    with the roundings the attempts it covered would have left (a step's duration is its end
    less its start; sums are sequential, as `np.cumsum` adds)."""
    durs = np.diff(np.concatenate(([start_s], ends[:steps])))
    served: dict[int, tuple[SimRequest, int]] = {}
    for req in running:
        req.generated += steps
        req.service_s = float(np.cumsum(np.concatenate(([req.service_s], durs)))[-1])
        task = req.task
        served[id(task)] = (req, served[id(task)][1] + 1 if id(task) in served else 1)
    for req, n in served.values():
        task = req.task
        added = np.concatenate(([task.attained_s], np.repeat(durs, n)))
        task.attained_s = float(np.cumsum(added)[-1])
