"""Standing decisions (`schedulers.base.Standing`): the fast path changes no result.

The simulator runs closed-form decode across a TOPAS decision while it stands
(`runners.sim.standing`); `Simulator(stand=False)` asks the policy at every attempt. The two
must give bit-identical requests, tasks and non-empty decisions on every workload, small
budgets and a host tier; the check must catch a bound one step too late; and every decision
a standing claim covers on the step-by-step path must be the claimed one (the certificate,
`schedulers.topas.standing`, checked directly).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from topas_bench.runners.cluster.routers import Cluster, make_router
from topas_bench.runners.cluster.sim import ClusterSim
from topas_bench.runners.records import SimResult
from topas_bench.runners.sglang_cpu.lockstep import budget_flip_config, budget_flip_workload
from topas_bench.runners.sim import standing as sim_standing
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.base import Decision, Standing
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.schedulers.registry import make_policy
from topas_bench.schedulers.topas.standing import LADDER
from topas_bench.schedulers.view import EngineView
from topas_bench.workloads.model import Workload
from topas_bench.workloads.registry import generate, run_defaults

PRESET = load_preset("a100-qwen32b")
WORKLOADS = ("chain3", "dag4", "dag10-wide", "metagpt-sop", "metagpt-tl")
#: The client's length settings (`workloads.lengths`): exact lengths with ignore_eos (the
#: reservation counts every remaining token), and MetaGPT's cap ending at EOS (the reservation
#: decays with `new_token_ratio`, so the admission budget drifts up as well as down).
MODES = ("exact", "cap")
#: The smallest budget each workload's largest call allows, rounded up: memory-bound.
SMALL = {"chain3": 9000, "dag4": 9000, "dag10-wide": 9000, "metagpt-sop": 9000,
         "metagpt-tl": 14000}  # fmt: skip
#: Tasks per run: enough for queues, preemptions and admissions held back by memory.
TASKS = {"chain3": 16, "dag4": 12, "dag10-wide": 8, "metagpt-sop": 12, "metagpt-tl": 8}
#: Arrival rates, a multiple of each workload's default: queues, so that decisions stand.
LOAD = 2.0
#: (seed, KV budget, host tier tokens) of each setting; cap mode draws its own seeds (+3).
SETTINGS = {"derived": (0, None, 0), "small": (1, "small", 0), "host": (2, "small", 100_000)}


def case(workload: str, setting: str, mode: str, tasks: int = 0) -> tuple[Workload, SimConfig]:
    """The sampled workload and the engine settings of one differential case."""
    seed, budget, host = SETTINGS[setting]
    kv = SMALL[workload] if budget == "small" else PRESET.derived_kv_budget_tokens
    seed += 3 * MODES.index(mode)
    w = sample(workload, tasks or TASKS[workload], seed, mode)
    return w, SimConfig(kv_budget_tokens=kv, host_tier_tokens=host)


def simulate(
    workload: str,
    setting: str,
    *,
    stand: bool,
    mode: str = "exact",
    scheduler: str = "topas",
    tasks: int = 0,
    params: dict[str, Any] | None = None,
) -> SimResult:
    w, cfg = case(workload, setting, mode, tasks)
    policy = make_policy(scheduler, **(params or {}))
    return Simulator(w, policy, CostModel(PRESET), cfg, stand=stand).run()


def sample(workload: str, tasks: int, seed: int, mode: str = "exact") -> Workload:
    rate = run_defaults(workload, {})[1] * LOAD
    return generate(workload, num_tasks=tasks, rate_per_s=rate, seed=seed, max_tokens=mode)


def acted(decisions: pd.DataFrame) -> pd.DataFrame:
    """The decisions that admit or preempt something (the others are what a stand skips)."""
    d = decisions[(decisions["admit"] > 0) | (decisions["preempt"] > 0)]
    return d[["t_s", "waiting", "admit", "preempt"]].reset_index(drop=True)


def differences(fast: SimResult, slow: SimResult) -> list[str]:
    """What differs between two runs: the requests' and tasks' tables (every time and count,
    to the last bit), the decisions that act, the iteration and preemption counts."""
    out = [name for name in ("requests", "tasks") if not getattr(fast, name).equals(
        getattr(slow, name))]  # fmt: skip
    if not acted(fast.decisions).equals(acted(slow.decisions)):
        out.append("decisions")
    if (fast.iterations, fast.preemptions) != (slow.iterations, slow.preemptions):
        out.append("counters")
    return out


#: The cases cheap enough for the default run (the rest are slow-marked: about 2 minutes).
QUICK = {("chain3", "derived"), ("dag4", "derived")}


def _case(workload: str, setting: str, mode: str) -> Any:
    slow = (workload, setting) not in QUICK
    return pytest.param(workload, setting, mode, marks=[pytest.mark.slow] if slow else [])


@pytest.mark.parametrize(
    ("workload", "setting", "mode"),
    [_case(w, s, m) for m in MODES for w in WORKLOADS for s in SETTINGS],
)
def test_fast_path_is_the_step_by_step_path(workload: str, setting: str, mode: str) -> None:
    fast = simulate(workload, setting, stand=True, mode=mode)
    slow = simulate(workload, setting, stand=False, mode=mode)
    assert differences(fast, slow) == []
    assert len(fast.decisions) < len(slow.decisions)  # the fast path did skip attempts


#: TOPAS's ablations and score variants (scheduler, params): the certificate must be as
#: conservative for each as for the default.
VARIANTS = {
    "no-joint": ("topas-no-joint", {}),
    "no-pins": ("topas-no-pins", {}),
    "no-move-stall": ("topas-no-move-stall", {}),
    "no-preempt": ("topas-no-preempt", {}),
    "prev-score": ("topas-prev-score", {}),
    "move-running": ("topas", {"move_charge": "running"}),
    "path-samples": ("topas", {"path_samples": 16}),
}


def _variant_case(variant: str, workload: str, setting: str, mode: str) -> Any:
    quick = (workload, setting, mode) == ("dag4", "derived", "cap")
    return pytest.param(variant, workload, setting, mode,
                        marks=[] if quick else [pytest.mark.slow])  # fmt: skip


@pytest.mark.parametrize(
    ("variant", "workload", "setting", "mode"),
    [
        _variant_case(v, w, s, m)
        for v in VARIANTS
        for w, s in (("dag4", "derived"), ("dag4", "small"), ("metagpt-tl", "small"))
        for m in MODES
    ],
)
def test_fast_path_holds_for_the_variants(
    variant: str, workload: str, setting: str, mode: str
) -> None:
    scheduler, params = VARIANTS[variant]
    fast = simulate(workload, setting, stand=True, mode=mode, scheduler=scheduler, params=params)
    slow = simulate(workload, setting, stand=False, mode=mode, scheduler=scheduler, params=params)
    assert differences(fast, slow) == []


def one_step_late(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutation: every closed-form run covers one attempt more than its stand allows
    (`runners.sim.standing.run_steps`, where the stand is what ends the run; a run still ends
    at the engine's own events)."""
    right = sim_standing.run_steps

    def late(sim: Any, stand: Any, k: int, durs: Any, ends: Any) -> int:
        return min(right(sim, stand, k, durs, ends) + 1, k)

    monkeypatch.setattr(sim_standing, "run_steps", late)


#: Differential cases where a standing's bound is exact somewhere (a request fits at the one
#: step the decaying reservation first lets it, or a budget band's edge is crossed), so that
#: a bound one step late changes the results; the quick ones run by default.
SHARP = [
    pytest.param("chain3", "derived", "cap"),
    pytest.param("dag4", "derived", "cap"),
    pytest.param("metagpt-sop", "small", "exact", marks=[pytest.mark.slow]),
    pytest.param("metagpt-tl", "host", "exact", marks=[pytest.mark.slow]),
    pytest.param("metagpt-sop", "host", "cap", marks=[pytest.mark.slow]),
    pytest.param("metagpt-tl", "host", "cap", marks=[pytest.mark.slow]),
]


@pytest.mark.parametrize(("workload", "setting", "mode"), SHARP)
def test_the_differential_test_catches_a_bound_one_step_late(
    workload: str, setting: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`test_fast_path_is_the_step_by_step_path` fails on its own cases when the bound is one
    step too late: waking late is a bug the comparison sees."""
    slow = simulate(workload, setting, stand=False, mode=mode)
    assert differences(simulate(workload, setting, stand=True, mode=mode), slow) == []
    one_step_late(monkeypatch)
    assert differences(simulate(workload, setting, stand=True, mode=mode), slow) != []


def test_a_bound_one_step_late_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison is sharp where a bound is exact: on a stream whose admission comes at
    the one step the budget first lets it fit, a run that covers one attempt more than the
    stand allows changes the results."""
    w = budget_flip_workload()

    def run(stand: bool) -> SimResult:
        sim = Simulator(w, make_policy("topas"), CostModel(PRESET), budget_flip_config(),
                        stand=stand)  # fmt: skip
        return sim.run()

    slow, fast = run(False), run(True)
    assert differences(fast, slow) == []
    assert len(fast.decisions) < len(slow.decisions) / 10
    one_step_late(monkeypatch)
    assert differences(run(True), slow) != []


@pytest.mark.slow
@pytest.mark.parametrize(
    ("replicas", "router", "kv", "mode"),
    [(3, "cache-aware", 0, "exact"), (2, "round-robin", 14000, "cap")],
)
def test_fast_path_on_a_cluster(replicas: int, router: str, kv: int, mode: str) -> None:
    """Replicas cut their runs where a request reaches them (`runners.cluster.replica`): the
    attempts a cut run covered are replayed as they were, the ratio decays as step by step."""
    cost = CostModel(PRESET)
    cfg = SimConfig(kv_budget_tokens=kv or PRESET.derived_kv_budget_tokens)
    w = generate("metagpt-tl", num_tasks=16, seed=0,
                 rate_per_s=run_defaults("metagpt-tl", {})[1] * replicas * LOAD,
                 max_tokens=mode)  # fmt: skip
    prefixes = {a.name: a.prefix_tokens for a in w.agents}

    def run(stand: bool) -> Any:
        cluster = Cluster(replicas, kv_budget_tokens=cfg.kv_budget_tokens,
                          prefix_tokens=prefixes, cost=cost)  # fmt: skip
        policies = [make_policy("topas") for _ in range(replicas)]
        sim = ClusterSim(w, policies, cost, cfg, make_router(router, cluster))
        for r in sim.replicas:
            r.stand = stand
        return sim.run()

    fast, slow = run(True), run(False)
    for name in ("requests", "tasks"):
        assert fast.table(name).equals(slow.table(name)), name
    assert len(fast.table("decisions")) < len(slow.table("decisions"))


class Auditor:
    """Wraps a policy on the step-by-step path: every decision made while an earlier one's
    standing claim holds (same discrete state, drivers in range) must be that decision."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.decide = sim.policy.decide
        self.claim: tuple[Decision, Standing, tuple[Any, ...], int] | None = None
        self.covered = 0
        self.wrong: list[str] = []

    def state(self, view: EngineView) -> tuple[Any, ...]:
        sim = self.sim
        return (
            tuple(r.rid for r in view.waiting), tuple(r.rid for r in view.running),
            sim.cache.version, sim.cache.evictable_tokens, frozenset(sim.pins),
            sim.estimator.version,
        )  # fmt: skip

    def __call__(self, view: EngineView) -> Decision:
        d = self.decide(view)
        state = self.state(view)
        if self.claim is not None and self.claim[2] == state and view.running:
            first, stands, _, generated = self.claim
            steps = view.running[0].generated - generated
            budget = view.free_tokens + view.evictable_tokens - view.reserved_tokens
            if stands.holds(steps, view.now_s, view.estimator.tpot_s, budget):
                self.covered += 1
                if d.admit or d.preempt or d.keep_prefixes != first.keep_prefixes:
                    self.wrong.append(f"t={view.now_s:.3f}: {d} while {stands} holds")
                return d
        self.claim = None
        if d.reusable and view.running:
            # the proof, asked right after the decision (`base.ProvesStanding`)
            proved = d.standing(LADDER[-1])
            if proved is not None:
                self.claim = (d, proved, state, view.running[0].generated)
        return d


@pytest.mark.parametrize(
    ("workload", "mode"),
    [
        pytest.param(w, m, marks=[pytest.mark.slow] if (w, m) != ("dag4", "exact") else [])
        for m in MODES
        for w in WORKLOADS
    ],
)
def test_every_claim_holds_on_the_step_by_step_path(workload: str, mode: str) -> None:
    w, cfg = case(workload, "small", mode)
    sim = Simulator(w, make_policy("topas"), CostModel(PRESET), cfg, stand=False)
    audit = Auditor(sim)
    sim.policy.decide = audit  # type: ignore[method-assign]
    sim.run()
    assert audit.wrong == []
    assert audit.covered > 0


def test_standing_holds_checks_every_bound() -> None:
    s = Standing(steps=3, until_s=10.0, tpot_lo_s=0.1, tpot_hi_s=0.2, budget_lo=5, budget_hi=9)
    assert s.holds(3, 9.9, 0.15, 7.0)
    assert not s.holds(4, 9.9, 0.15, 7.0)
    assert not s.holds(1, 10.0, 0.15, 7.0)
    assert not s.holds(1, 1.0, 0.21, 7.0)
    assert not s.holds(1, 1.0, 0.15, 9.0)  # within a rounding margin of the edge: asks again
    assert Standing(steps=1).holds(1, 1e9, 5.0, -1e12)  # the defaults bound nothing else


class _Cost:
    def prefill_s(self, items: Any) -> float:
        return 0.001 * float(sum(n for _, n in items))

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        return 0.02


@pytest.mark.parametrize("seen", [[], [100.0, 130.0, 131.0, 400.0, 900.0]])
@pytest.mark.parametrize(("generated", "steps"), [(0, 1), (0, 300), (120, 20), (129, 3), (950, 64)])
def test_residual_range_is_the_exact_range(seen: list[float], generated: int, steps: int) -> None:
    est = ServiceEstimator(_Cost())
    for x in seen:
        est.observe("a", "k", int(x))
    lo, hi = est.residual_tokens_range("a", "k", generated, steps)
    values = [est.residual_tokens("a", "k", g) for g in range(generated, generated + steps + 1)]
    assert (lo, hi) == (min(values), max(values))


#: Settings in which the precheck refuses proofs (in the others it never fires).
PRECHECKED = [("chain3", "derived"), ("dag4", "derived"), ("dag10-wide", "derived"),
              ("metagpt-sop", "small"), ("metagpt-tl", "derived")]  # fmt: skip


@pytest.mark.parametrize(("workload", "setting"), PRECHECKED)
def test_the_score_precheck_refuses_only_what_the_proof_refuses(
    monkeypatch: pytest.MonkeyPatch, workload: str, setting: str
) -> None:
    """`Certificate._scores_cannot_hold` stops a proof early; wherever it does, the whole proof
    (prepared, every window of the ladder) finds no standing either."""
    import copy

    from topas_bench.schedulers.topas.standing import Certificate

    precheck = Certificate._scores_cannot_hold
    refused = 0

    def checked(self: Certificate) -> bool:
        nonlocal refused
        verdict = precheck(self)
        if verdict:
            twin = copy.copy(self)
            twin._scores_cannot_hold = lambda: False  # type: ignore[method-assign]
            twin.tally = None
            assert twin._prove() is None
            refused += 1
        return verdict

    monkeypatch.setattr(Certificate, "_scores_cannot_hold", checked)
    simulate(workload, setting, stand=True, mode="cap", tasks=3 * TASKS[workload])
    assert refused > 0
