"""Every scheduler's declared capabilities (`schedulers.base.Capabilities`) are true.

A contended simulated run (metagpt-tl at a 14,000-token budget, twice the default rate, where
TOPAS preempts) of every registered scheduler, on an instrumented engine: one declared not to
preempt asks for no preemption; one declared not to act while full is never asked while
SGLang's `batch_is_full` latch is set, and never leaves a full batch without it; and those
declared to do either are seen doing it, so the observables are live. The declarations agree
with what the engines read (`needs`) and with docs/schedulers.md's table.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

from topas_bench.runners.records import SimResult
from topas_bench.runners.sim.admission import PrefillAdder
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.runners.sim.engine import SimulationError, Simulator
from topas_bench.runners.sim.view import SimView
from topas_bench.schedulers.base import Decision
from topas_bench.schedulers.fcfs import FCFS
from topas_bench.schedulers.registry import SCHEDULERS, capabilities, make_policy
from topas_bench.schedulers.view import EngineView
from topas_bench.workloads.model import Agent, Segment, Stage, Task, Workload
from topas_bench.workloads.registry import generate, run_defaults

PRESET = load_preset("a100-qwen32b")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "schedulers.md"


class Watched(Simulator):
    """The simulator, counting what a policy that does not act while full must never meet.

    asked_latched: decisions asked for at prefill attempts that begin with SGLang's
        `batch_is_full` latch set, a request running and no chunked prefill in flight (where
        SGLang skips the attempt unless the policy opened the door).
    full_unlatched: attempts that admit nobody and leave the batch full (a request running,
        no waiting request fits the admission budget, as the policy's view counts it) but the
        latch clear, so that the engine asks the policy again at the next iteration.
    """

    asked_latched = 0
    full_unlatched = 0
    _latched = False

    def _prefill_attempt(self) -> PrefillAdder | None:
        self._latched = self.batch_is_full and bool(self.running) and self.chunked is None
        adder = super()._prefill_attempt()
        if adder is None and self.chunked is None and not self.batch_is_full:
            self.full_unlatched += self._full()
        return adder

    def _calc_priority(self) -> Decision | None:
        decision = super()._calc_priority()
        self.asked_latched += decision is not None and self._latched
        return decision

    def _full(self) -> bool:
        if not (self.running and self.waiting):
            return False
        view = SimView(self)
        budget = view.free_tokens + view.evictable_tokens - view.reserved_tokens
        return all(cost >= budget for cost in view.admission_costs(view.waiting))


@cache
def contended(scheduler: str) -> tuple[SimResult, Watched]:
    """The contended run of `scheduler`: its results and the instrumented engine."""
    rate = run_defaults("metagpt-tl", {})[1] * 2.0
    w = generate("metagpt-tl", num_tasks=8, rate_per_s=rate, seed=1, max_tokens="cap")
    cfg = SimConfig(kv_budget_tokens=14_000)
    sim = Watched(w, make_policy(scheduler), CostModel(PRESET), cfg)
    return sim.run(), sim


@pytest.mark.parametrize("name", SCHEDULERS.names())
def test_a_scheduler_preempts_only_if_it_declares_it(name: str) -> None:
    result, _ = contended(name)
    asked = int(result.decisions["preempt"].sum())  # the policy's own, not the engine's
    if capabilities(name).preempts:
        assert asked > 0, f"{name} declares that it preempts, but never does here"
    else:
        assert asked == 0


@pytest.mark.parametrize("name", SCHEDULERS.names())
def test_a_scheduler_acts_while_full_only_if_it_declares_it(name: str) -> None:
    """Not acting while full: never asked while the latch is set, and never leaving a full
    batch unlatched (which has the engine ask again before a request leaves: what a policy
    that cuts its pass short of memory would get, door or no door). The door's policies do
    leave it so: their passes end at their own cutoff, and they are asked at every
    iteration."""
    _, sim = contended(name)
    if capabilities(name).acts_while_full:
        assert sim.full_unlatched > 0, f"{name} declares that it acts while full, but never is"
    else:
        assert (sim.asked_latched, sim.full_unlatched) == (0, 0)


@pytest.mark.parametrize("name", SCHEDULERS.names())
def test_the_engines_open_the_door_exactly_for_the_declared(name: str) -> None:
    """`ServerNeeds.acts_while_full`, what every engine reads, is the class's declaration."""
    policy = make_policy(name)
    assert policy.capabilities == capabilities(name)
    assert policy.needs.acts_while_full == capabilities(name).acts_while_full


def test_topas_and_its_ablations_declare_both_but_topas_no_preempt() -> None:
    for name in SCHEDULERS.names():
        caps = capabilities(name)
        both = name.startswith("topas") and name != "topas-no-preempt"
        assert (caps.acts_while_full, caps.preempts) == (both, both), name


class Preempter(FCFS):
    """FCFS that preempts the youngest running request whenever a request waits."""

    name = "preempter"

    def decide(self, view: EngineView) -> Decision:
        d = super().decide(view)
        return Decision(admit=d.admit, preempt=list(view.running)[-1:])


def test_the_simulator_refuses_a_preemption_a_scheduler_declared_it_never_makes() -> None:
    rate = run_defaults("dag4", {})[1] * 2.0
    w = generate("dag4", num_tasks=6, rate_per_s=rate, seed=0)
    sim = Simulator(w, Preempter(), CostModel(PRESET), SimConfig(kv_budget_tokens=9000))
    with pytest.raises(SimulationError, match="'preempter' declares that it never preempts"):
        sim.run()


def test_the_engines_retractions_are_not_the_policys_preemptions() -> None:
    """SGLang retracts running requests when a decode step does not fit, whatever the policy:
    FCFS, which never preempts, is retracted here (a low `new_token_ratio` over-admits); the
    run's `preemptions` counts it, the decisions' `preempt` does not."""

    def task(tid: str, arrival: float, prompt: int) -> Task:
        stage = Stage("s", tid, (Segment(f"{tid}/in", prompt),), 350, max_new_tokens=400)
        return Task(tid, "wf", arrival, (stage,))

    agents = tuple(Agent(a, 1) for a in ("r1", "r2", "r3"))
    tasks = (task("r1", 0.0, 200), task("r2", 0.1, 150), task("r3", 0.1, 120))
    cfg = SimConfig(kv_budget_tokens=1000, init_new_token_ratio=0.1)
    result = Simulator(Workload("retract", agents, tasks), FCFS(), CostModel(PRESET), cfg).run()
    assert result.preemptions > 0
    assert int(result.decisions["preempt"].sum()) == 0


def docs_table() -> dict[str, tuple[bool, bool]]:
    """docs/schedulers.md's capability table: name -> (acts while full, preempts)."""
    text = DOCS.read_text(encoding="utf-8")
    head = text.index("| scheduler | acts while full | preempts |")
    rows = {}
    for line in text[head:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        names = re.findall(r"`([^`]+)`", cells[0])
        for name in names:
            rows[name] = (cells[1] == "yes", cells[2] == "yes")
    return rows


def test_the_docs_table_is_the_registrys() -> None:
    declared = {n: (capabilities(n).acts_while_full, capabilities(n).preempts)
                for n in SCHEDULERS.names()}  # fmt: skip
    assert docs_table() == declared
