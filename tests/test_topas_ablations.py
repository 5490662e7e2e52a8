"""TOPAS's ablations: each is TOPAS but for its one lever.

`topas-no-pins` (no residency choice), `topas-no-joint` (R' pinned, admission unrestricted),
`topas-no-move-stall` (a swap-in charged once) and `topas-no-preempt` (asked only where a
baseline is, never preempting) are each held to three things:

1. on a contended run (dag10-wide, 16 tasks at twice the default rate, a 12,000-token budget
   where two or three of its 4,096-token prefixes fit, and TOPAS preempts), its results differ
   from TOPAS's;
2. the lever it switches off is off: no pins sent, no admission restricted to a resident set,
   no preemption; and, on a hand-built state where each lever decides alone, the ablation
   decides otherwise than TOPAS for that lever's reason;
3. what it keeps of TOPAS is there: the resident set R' the search chose, not only the agents
   whose prefixes running requests lock, is what the engine receives as pins
   (`Simulator._keep`, the seam the plugin's `Bridge.keep` mirrors).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest

from test_topas import FixedEstimator, Req, StageV, TaskV, View
from topas_bench.runners.records import SimResult
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.base import Decision, StageState
from topas_bench.schedulers.registry import make_policy
from topas_bench.schedulers.topas import policy as topas_policy
from topas_bench.schedulers.topas import search as topas_search
from topas_bench.schedulers.view import PrefixLocation, PrefixView
from topas_bench.workloads.model import Segment
from topas_bench.workloads.registry import generate, run_defaults

PRESET = load_preset("a100-qwen32b")
ABLATIONS = ("topas-no-pins", "topas-no-joint", "topas-no-move-stall", "topas-no-preempt")
#: The ablations that keep TOPAS's pins of R'.
PINNING = ("topas", "topas-no-joint", "topas-no-move-stall", "topas-no-preempt")


#: Per decision: R' as the search chose it and the agents running requests locked (None where
#: no search ran), and the pins the engine was sent (None if none).
Pins = list[tuple[tuple[frozenset[str], frozenset[str]] | None, frozenset[str] | None]]


@dataclass(frozen=True)
class Observed:
    """A contended run, and what crossed the policy's and the engine's seams in it."""

    result: SimResult
    pins: Pins
    restricted: int  # GREEDY-PACK's calls restricted to a resident set's agents
    unrestricted: int  # and the others


@cache
def contended(scheduler: str) -> Observed:
    rate = run_defaults("dag10-wide", {})[1] * 2.0
    w = generate("dag10-wide", num_tasks=16, rate_per_s=rate, seed=0, max_tokens="exact")
    pins: Pins = []
    packs = Counter[bool]()
    searched: list[tuple[frozenset[str], frozenset[str]]] = []
    search, greedy_pack = topas_policy.search, topas_search.greedy_pack

    def watched_search(inp: Any, *args: Any, **kw: Any) -> Any:
        choice = search(inp, *args, **kw)
        searched.append((choice.keep, inp.locked_agents))
        return choice

    def watched_pack(inp: Any, allowed: frozenset[str] | None, keep: frozenset[str]) -> Any:
        packs[allowed is not None] += 1
        return greedy_pack(inp, allowed, keep)

    class Seam(Simulator):
        sent: frozenset[str] | None = None

        def _keep(self, agents: frozenset[str]) -> None:
            self.sent = agents
            super()._keep(agents)

        def _calc_priority(self) -> Decision | None:
            self.sent = None
            searched.clear()
            decision = super()._calc_priority()
            if decision is not None:
                pins.append((searched[-1] if searched else None, self.sent))
            return decision

    topas_policy.search, topas_search.greedy_pack = watched_search, watched_pack
    try:
        cfg = SimConfig(kv_budget_tokens=12_000)
        result = Seam(w, make_policy(scheduler), CostModel(PRESET), cfg).run()
    finally:
        topas_policy.search, topas_search.greedy_pack = search, greedy_pack
    return Observed(result, pins, packs[True], packs[False])


# -- 1. each ablation changes the results ----------------------------------------------------
@pytest.mark.parametrize("name", ABLATIONS)
def test_each_ablation_changes_topas_results_on_a_contended_run(name: str) -> None:
    mine, theirs = contended("topas").result, contended(name).result
    assert not theirs.tasks["jct_s"].equals(mine.tasks["jct_s"])


# -- 2. the lever is off -----------------------------------------------------------------------
def test_topas_no_pins_sends_no_pin_and_searches_no_resident_set() -> None:
    seen = contended("topas-no-pins")
    assert seen.pins and all(searched is None for searched, _ in seen.pins)
    assert all(sent == frozenset() for _, sent in seen.pins)
    assert any(sent for _, sent in contended("topas").pins)  # TOPAS does send some


@pytest.mark.parametrize("name", ["topas-no-pins", "topas-no-joint"])
def test_no_admission_is_restricted_to_a_resident_set(name: str) -> None:
    seen = contended(name)
    assert (seen.restricted, seen.unrestricted > 0) == (0, True)
    assert contended("topas").restricted > 0  # TOPAS's packs are restricted


def test_topas_no_preempt_never_preempts_where_topas_does() -> None:
    assert int(contended("topas").result.decisions["preempt"].sum()) > 0
    assert int(contended("topas-no-preempt").result.decisions["preempt"].sum()) == 0


def absent_prefix_view() -> View:
    """One request waiting, of agent x, whose 900-token prefix is not on the GPU and takes
    60 s to bring back; one request of agent b running (task u). It fits: only the score
    holds it back. Admitting it gains about the horizon (10 s); bringing x in costs 60 s for
    each task it stalls (the running one and the admitted one: 120 s) and is worth 60 s of
    reuse to x's one user."""
    r = Req(1, "t", "s0", agent="x", prompt=(Segment("agent:x", 900), Segment("t/in", 100)))
    t0 = StageV("s0", agent="x", state=StageState.WAITING, request=r, children=("s1",))
    task = TaskV("t", {"s0": t0, "s1": StageV("s1", agent="x", deps=("s0",))})
    run = Req(2, "u", "s0", agent="b", prompt=(Segment("agent:b", 900), Segment("u/in", 100)))
    run.admitted_s = 0.0
    u0 = StageV("s0", agent="b", state=StageState.RUNNING, request=run)
    prefixes = [
        PrefixView("x", 900, PrefixLocation.NONE, 0, False),
        PrefixView("b", 900, PrefixLocation.GPU, 1, False),
    ]
    est = FixedEstimator({"s0": 10.0, "s1": 10.0})
    return View([r], {"t": task, "u": TaskV("u", {"s0": u0})}, est, running=[run],
                prefix_list=prefixes, reloads={"x": 60.0, "b": 1.0})  # fmt: skip


@pytest.mark.parametrize(
    ("name", "admits"),
    [
        ("topas", False),  # R' without x scores higher: x's request is held back
        ("topas-no-preempt", False),  # the same choice (and the request fits: no misfit)
        ("topas-no-joint", True),  # the same R', but it does not restrict the pack
        ("topas-no-pins", True),  # no R' at all: one unrestricted pack
        ("topas-no-move-stall", True),  # the move costs 60 s once: R' with x wins
    ],
)
def test_each_lever_decides_alone_on_an_absent_prefix(name: str, admits: bool) -> None:
    view = absent_prefix_view()
    decision = make_policy(name).decide(view)  # type: ignore[arg-type]
    assert [r.rid for r in decision.admit] == ([1] if admits else [])
    assert not decision.preempt


def preemption_view() -> View:
    """Request 1 (task t, on its critical path, 100 s of service ahead) waits and does not
    fit the 500 free tokens; request 2 (task u, agent b) runs, has generated nothing, and
    would free 1,100 tokens: preempting it costs 1 s of redo, admitting request 1 gains
    about the 100 s horizon, past the 20 s margin."""
    r = Req(1, "t", "s0")
    t0 = StageV("s0", state=StageState.WAITING, request=r)
    run = Req(2, "u", "r0", agent="b", prompt=(Segment("agent:b", 900), Segment("u/in", 100)))
    run.admitted_s = 0.0
    u0 = StageV("r0", agent="b", state=StageState.RUNNING, request=run)
    prefixes = [
        PrefixView("a", 900, PrefixLocation.NONE, 0, False),
        PrefixView("b", 900, PrefixLocation.GPU, 1, False),
    ]
    est = FixedEstimator({"s0": 10.0, "r0": 100.0})
    return View([r], {"t": TaskV("t", {"s0": t0}), "u": TaskV("u", {"r0": u0})}, est,
                running=[run], free_tokens=500, prefix_list=prefixes)  # fmt: skip


@pytest.mark.parametrize("name", ["topas", *ABLATIONS])
def test_only_topas_no_preempt_declines_a_preemption_that_pays(name: str) -> None:
    """TOPAS and every other ablation preempt request 2 for request 1; `topas-no-preempt`
    does not, and hands request 1 to the engine's check, whose refusal sets the latch."""
    decision = make_policy(name).decide(preemption_view())  # type: ignore[arg-type]
    assert [r.rid for r in decision.admit] == [1]
    assert [r.rid for r in decision.preempt] == ([] if name == "topas-no-preempt" else [2])


# -- 3. R' reaches the engine ------------------------------------------------------------------
@pytest.mark.parametrize("name", PINNING)
def test_the_searched_resident_set_reaches_the_engine_as_pins(name: str) -> None:
    """The pins the engine receives are R' as searched, plus agents whose prefixes running
    requests lock (kept when their next users come), never fewer; and R' is more than those
    locked agents often enough for the check to matter."""
    beyond = 0
    seen = contended(name)
    for searched, sent in seen.pins:
        assert searched is not None and sent is not None
        keep, locked = searched
        assert keep <= sent, f"R' {sorted(keep)} reached the engine as {sorted(sent)}"
        assert sent - keep <= locked
        beyond += bool(keep - locked)
    assert beyond > 0, "R' never went beyond the locked agents: the check is vacuous"
