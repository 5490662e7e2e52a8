"""TOPAS: each score term on hand-built states, GREEDY-PACK, the resident-set search against its
own neighbourhood and against brute force where the neighbourhood is complete, parameter
validation, and simulated properties (budget, K, determinism, bounded waits)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fakes import FakeRequest, FakeStage
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.base import StageState
from topas_bench.schedulers.registry import make_policy
from topas_bench.schedulers.topas import Topas, TopasParams
from topas_bench.schedulers.topas.pack import Candidate, PackInputs, Victim, greedy_pack
from topas_bench.schedulers.topas.paths import task_path
from topas_bench.schedulers.topas.search import AgentInfo, Choice, score_set, search
from topas_bench.schedulers.validate import InvalidParameter
from topas_bench.schedulers.view import PrefixLocation, PrefixView
from topas_bench.workloads.model import Agent, Segment, Stage, Task, Workload, agent_key, output_key

PRESET = load_preset("a100-qwen32b")
COST = CostModel(PRESET)


# -- fakes -----------------------------------------------------------------------------------------
def Req(rid: int, task_id: str, stage_id: str, **kw: Any) -> FakeRequest:
    """A request with a 1,000-token prompt (900 of them agent a's prefix)."""
    kw.setdefault("prompt", (Segment("agent:a", 900), Segment("x", 100)))
    return FakeRequest(rid, task_id, stage_id, **kw)


StageV = FakeStage


@dataclass
class TaskV:
    id: str
    stages: dict[str, FakeStage]
    arrival_s: float = 0.0
    workflow: str = "w"
    attained_s: float = 0.0
    version: int = 0


class FixedEstimator:
    """Service times by stage id; tpot 0.05 s; one learned version."""

    version = 1
    tpot_s = 0.05

    def __init__(self, service: dict[str, float]) -> None:
        self.service = service

    def residual_service_s(self, req: Any, cached_tokens: int = 0) -> float:
        return self.service[req.stage_id]

    def stage_service_s(self, task_id: str, stage: Any, cached_tokens: int = 0) -> float:
        return self.service[stage.id]

    def residual_tokens(self, agent: str, kind: str, generated: int, key: Any = None) -> float:
        return 100.0

    def prefill_s(self, new_tokens: int, cached_tokens: int = 0) -> float:
        return new_tokens * 1e-3


@dataclass
class View:
    waiting: list[FakeRequest]
    tasks: dict[str, TaskV]
    estimator: FixedEstimator
    now_s: float = 0.0
    running: list[FakeRequest] = field(default_factory=list)
    kv_budget_tokens: int = 20_000
    running_tokens: int = 0
    locked_tokens: int = 0
    evictable_tokens: int = 0
    free_tokens: int = 20_000
    host_capacity_tokens: int = 0
    reserved_tokens: float = 0.0
    prefix_list: list[PrefixView] = field(default_factory=list)
    reloads: dict[str, float] = field(default_factory=dict)

    def cached_tokens(self, req: Any) -> int:
        return 0

    def prefixes(self) -> list[PrefixView]:
        return self.prefix_list

    def admission_need(self, req: Any) -> int:
        return int(req.prompt_tokens + 101)

    def lock_cost(self, req: Any) -> int:
        return 0

    def admission_costs(self, reqs: Sequence[Any]) -> list[int]:
        return [self.admission_need(r) + self.lock_cost(r) for r in reqs]

    def reload_s(self, agent: str) -> float:
        return self.reloads.get(agent, 0.0)

    def absent_reload_s(self, agent: str) -> float:
        return self.reloads.get(agent, 0.0)


def chain_task(tid: str, waiting_rid: int, arrival_s: float = 0.0) -> TaskV:
    """s0 waiting, s1 blocked behind it."""
    r = Req(waiting_rid, tid, "s0")
    s0 = StageV("s0", state=StageState.WAITING, request=r, children=("s1",))
    s1 = StageV("s1", deps=("s0",))
    return TaskV(tid, {"s0": s0, "s1": s1}, arrival_s=arrival_s)


# -- parameters ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("params", "needle"),
    [
        ({"beta": -0.1}, "beta must be >= 0"),
        ({"rho": -1}, "rho must be >= 0"),
        ({"max_agents": 0}, "max_agents must be an integer >= 1"),
        ({"max_actions": 0}, "max_actions must be an integer >= 1"),
        ({"h_age_s": 0}, "h_age_s must be > 0"),
        ({"h_age_s": -5.0}, "h_age_s must be > 0"),
        ({"h_age_mult": 0}, "h_age_mult must be > 0"),
        ({"horizon_s": 0}, "horizon_s must be > 0"),
        ({"starvation_mult": -1}, "starvation_mult must be >= 0"),
        ({"beta": "x"}, "beta must be a finite number"),
        ({"beta": float("nan")}, "beta must be a finite number"),
    ],
)
def test_invalid_parameters_name_the_parameter_and_range(
    params: dict[str, Any], needle: str
) -> None:
    with pytest.raises(InvalidParameter, match=needle):
        make_policy("topas", **params)


def test_unknown_parameter_is_rejected() -> None:
    with pytest.raises(
        InvalidParameter, match="topas: unknown parameter 'gamma'; valid: beta, rho"
    ):
        make_policy("topas", gamma=1)
    with pytest.raises(InvalidParameter, match="max_actions given twice"):
        make_policy("topas", K=2, max_actions=3)


@pytest.mark.parametrize(
    "flag", ["use_reuse", "use_aging", "density", "move_stall", "joint", "pins"]
)
@pytest.mark.parametrize("value", ["False", "maybe", 0, None])
def test_switches_must_be_booleans(flag: str, value: object) -> None:
    """A string like "False" is truthy: accepting it would leave an ablation switch on."""
    with pytest.raises(InvalidParameter, match=f"topas: {flag} must be true or false"):
        make_policy("topas", **{flag: value})


@pytest.mark.parametrize(
    ("name", "value"),
    [("move_charge", "all"), ("move_charge", 1), ("reuse_users", "waiting"), ("reuse_users", None)],
)
def test_score_forms_must_be_named(name: str, value: object) -> None:
    with pytest.raises(InvalidParameter, match=f"topas: {name} must be one of"):
        make_policy("topas", **{name: value})
    with pytest.raises(InvalidParameter, match="path_samples must be an integer >= 0"):
        make_policy("topas", path_samples=-1)


def test_the_variants_set_their_forms() -> None:
    assert make_policy("topas").p.stall_charge == "affected"  # type: ignore[attr-defined]
    assert make_policy("topas-no-move-stall").p.stall_charge == "admitted"  # type: ignore[attr-defined]
    prev = make_policy("topas-prev-score").p  # type: ignore[attr-defined]
    assert (prev.move_charge, prev.reuse_users) == ("admitted", "next")
    assert make_policy("topas", move_stall=True).p.stall_charge == "running"  # type: ignore[attr-defined]
    assert make_policy("topas-no-pins").p.pins is False  # type: ignore[attr-defined]
    assert make_policy("topas-expected-path").p.path_samples == 16  # type: ignore[attr-defined]


def test_the_papers_names_are_aliases() -> None:
    p = make_policy("topas", K=2, M=3, H_age=100.0).params
    assert (p["max_actions"], p["max_agents"], p["h_age_s"]) == (2, 3, 100.0)
    base = make_policy("topas-base", use_reuse=True)
    assert isinstance(base, Topas) and base.p.use_reuse is True and base.p.use_aging is False
    with pytest.raises(InvalidParameter, match="max_actions must be an integer >= 1"):
        make_policy("topas", K=0)


def test_ablations_set_their_switches() -> None:
    def p(name: str) -> TopasParams:
        pol = make_policy(name)
        assert isinstance(pol, Topas)
        return pol.p

    assert not p("topas-base").use_reuse and not p("topas-base").use_aging
    assert not p("topas-no-reuse").use_reuse and p("topas-no-reuse").use_aging
    assert not p("topas-no-aging").use_aging and p("topas-no-aging").use_reuse
    assert not p("topas-no-joint").joint and p("topas-no-joint").use_reuse
    assert TopasParams().use_reuse and TopasParams().use_aging and TopasParams().joint
    # an ablation reports every parameter but its own switch (its name says that one)
    params = make_policy("topas-no-joint", beta=0.5).params
    assert "joint" not in params and params["beta"] == 0.5


# -- delta, L_i and the SRPT scale ---------------------------------------------------------------
def test_delta_on_a_diamond_goes_to_the_critical_branch() -> None:
    # A done; B (10 s) and C (4 s) waiting; D (5 s) blocked. Horizon 3 s.
    rb, rc = Req(1, "t", "B", queued_s=1.0), Req(2, "t", "C", queued_s=2.0)
    task = TaskV(
        "t",
        {
            "A": StageV("A", children=("B", "C"), state=StageState.DONE),
            "B": StageV("B", deps=("A",), children=("D",), state=StageState.WAITING, request=rb),
            "C": StageV("C", deps=("A",), children=("D",), state=StageState.WAITING, request=rc),
            "D": StageV("D", deps=("B", "C")),
        },
    )
    est = FixedEstimator({"A": 0.0, "B": 10.0, "C": 4.0, "D": 5.0})
    path = task_path(task, est, 3.0, ["B", "C"])  # type: ignore[arg-type]
    # L = max(10+3, 4+3) + 5+3 = 21 = service 15 + 2 hops x 3
    assert path.length(3.0) == pytest.approx(21.0)
    assert (path.service_s, path.hops) == (15.0, 2)
    # Admitting B removes its 3 s of queueing from the critical path; C has slack.
    assert path.delta_share == {"B": pytest.approx(1.0), "C": pytest.approx(0.0)}


def test_longest_path_takes_the_longer_branch() -> None:
    # A (1 s, not sent) fans out to B (10 s) and C (4 s), both feeding D (5 s): the path runs
    # through B whichever order the branches are listed in.
    for order in (("B", "C"), ("C", "B")):
        stages = {"A": StageV("A", children=order)}
        for sid in order:
            stages[sid] = StageV(sid, deps=("A",), children=("D",))
        stages["D"] = StageV("D", deps=order)
        est = FixedEstimator({"A": 1.0, "B": 10.0, "C": 4.0, "D": 5.0})
        path = task_path(TaskV("t", stages), est, 2.0, [])  # type: ignore[arg-type]
        assert (path.service_s, path.hops) == (16.0, 3)


def test_parallel_branches_share_their_joint_reduction() -> None:
    # planner done, 8 symmetric workers waiting, joiner blocked: admitting all 8 saves one
    # horizon on the critical path; each worker gets an eighth of it.
    stages = {"P": StageV("P", children=tuple(f"W{i}" for i in range(8)), state=StageState.DONE)}
    for i in range(8):
        r = Req(i, "t", f"W{i}", queued_s=float(i))
        stages[f"W{i}"] = StageV(
            f"W{i}", deps=("P",), children=("J",), state=StageState.WAITING, request=r
        )
    stages["J"] = StageV("J", deps=tuple(f"W{i}" for i in range(8)))
    task = TaskV("t", stages)
    est = FixedEstimator({"P": 0.0, "J": 5.0, **{f"W{i}": 10.0 for i in range(8)}})
    path = task_path(task, est, 4.0, [f"W{i}" for i in range(8)])  # type: ignore[arg-type]
    assert path.length(4.0) == pytest.approx(10 + 4 + 5 + 4)
    assert path.delta_share == {f"W{i}": pytest.approx(1 / 8) for i in range(8)}
    assert sum(path.delta_share.values()) == pytest.approx(1.0)


def test_delta_on_a_chain_is_the_horizon() -> None:
    task = chain_task("t", 1)
    est = FixedEstimator({"s0": 7.0, "s1": 2.0})
    path = task_path(task, est, 4.0, ["s0"])  # type: ignore[arg-type]
    assert path.length(4.0) == pytest.approx(7 + 2 + 2 * 4)
    assert path.delta_share == {"s0": 1.0}


def two_tasks() -> tuple[View, TaskV, TaskV]:
    """`short` (a 2-stage chain, arrived at 0) and `long` (3 stages, arrived at 400), both
    waiting on their first stage at t = 600."""
    short, long = chain_task("short", 1, arrival_s=0.0), chain_task("long", 2, arrival_s=400.0)
    est = FixedEstimator({"s0": 10.0, "s1": 10.0, "s2": 40.0})
    long.stages["s1"] = StageV("s1", deps=("s0",), children=("s2",))
    long.stages["s2"] = StageV("s2", deps=("s1",))
    waiting = [short.stages["s0"].request, long.stages["s0"].request]
    tasks = {"short": short, "long": long}
    v = View([r for r in waiting if r is not None], tasks, est, now_s=600.0)
    return v, short, long


def gains(policy: Topas, v: View, horizon: float) -> dict[str, float]:
    pool = policy._candidates(v, horizon, {})  # type: ignore[arg-type]
    return {c.req.task_id: c.gain for c in pool.ranked}


def test_gain_is_aging_times_delta_times_srpt_scale() -> None:
    v, _, _ = two_tasks()
    policy = Topas(horizon_s=5.0, rho=1.0, h_age_s=300.0, srpt_exponent=1.0)
    got = gains(policy, v, 5.0)
    l_short, l_long = 20 + 2 * 5, 60 + 3 * 5
    mean = (l_short + l_long) / 2
    g_short = 1 + math.log1p(600 / 300)
    g_long = 1 + math.log1p(200 / 300)
    assert got["short"] == pytest.approx(g_short * 5 * mean / l_short)
    assert got["long"] == pytest.approx(g_long * 5 * mean / l_long)
    no_aging = gains(Topas(horizon_s=5.0, use_aging=False, srpt_exponent=1.0), v, 5.0)
    assert no_aging["short"] == pytest.approx(5 * mean / l_short)
    flat = gains(Topas(horizon_s=5.0, use_aging=False, srpt_exponent=0.0), v, 5.0)
    assert flat == {"short": pytest.approx(5.0), "long": pytest.approx(5.0)}


def test_aging_runs_on_the_workloads_own_time_scale() -> None:
    """h_age defaults to h_age_mult x T0, T0 = the mean unloaded critical path of the tasks
    seen (each when first seen): here (20 + 60) / 2 = 40 s."""
    v, _, _ = two_tasks()
    policy = Topas(horizon_s=5.0, rho=1.0, h_age_mult=2.0, srpt_exponent=0.0)
    got = gains(policy, v, 5.0)
    assert policy.unloaded_jct_s() == pytest.approx(40.0)
    assert got["short"] == pytest.approx(5 * (1 + math.log1p(600 / 80)))
    assert got["long"] == pytest.approx(5 * (1 + math.log1p(200 / 80)))


def test_density_ranks_by_gain_per_token() -> None:
    # Same gain; rid 1 (a 5,000-token prompt) takes 5,101 tokens, rid 2 takes 1,101.
    t1, t2 = chain_task("t1", 1), chain_task("t2", 2)
    big = Req(1, "t1", "s0", prompt=(Segment("agent:a", 900), Segment("y", 4100)))
    t1.stages["s0"].request = big
    small = t2.stages["s0"].request
    assert small is not None
    est = FixedEstimator({"s0": 10.0, "s1": 10.0})
    v = View([big, small], {"t1": t1, "t2": t2}, est)

    def order(density: bool) -> list[tuple[int, float]]:
        p = Topas(horizon_s=5.0, density=density, use_aging=False)
        ranked = p._candidates(v, 5.0, {}).ranked  # type: ignore[arg-type]
        return [(c.req.rid, c.gain) for c in ranked]

    # equal gains: by gain, ties go to the earlier queue entry, then the lower rid
    assert order(False) == [(1, 5.0), (2, 5.0)]
    assert order(True) == [(2, 5.0), (1, 5.0)]


def test_a_starving_request_comes_first() -> None:
    v, _, _ = two_tasks()
    v.waiting[0].ready_s = 0.0  # short's request has waited 600 s
    v.waiting[1].ready_s = 590.0
    # T0 = 40 s: a limit of 4 x T0 = 160 s marks only the first as urgent
    ranked = Topas(horizon_s=5.0, starvation_mult=4.0)._candidates(v, 5.0, {}).ranked  # type: ignore[arg-type]
    assert [(c.req.task_id, c.urgent) for c in ranked] == [("short", True), ("long", False)]
    ranked = Topas(horizon_s=5.0, starvation_mult=0)._candidates(v, 5.0, {}).ranked  # type: ignore[arg-type]
    assert not any(c.urgent for c in ranked)


def test_redo_and_revoke_make_up_a_victims_keep_value() -> None:
    est = FixedEstimator({"s0": 3.0})
    running = Req(9, "t", "s0", generated=300)
    v = View([], {}, est, running=[running])
    policy = Topas()
    policy._credit[9] = 12.5
    (victim,) = policy._victims(v, {})  # type: ignore[arg-type]
    # redo: its decoded tokens and its prompt's prefill; revoke: the gain credited at admission
    assert victim.keep_value_s == pytest.approx(0.05 * 300 + 1000 * 1e-3 + 12.5)
    # frees its context and the expected rest of its output
    assert victim.frees == 1000 + 300 + 100
    assert victim.release_s == 3.0
    # a request preempted max_preemptions times already is not a victim again
    running.preemptions = 1
    assert policy._victims(v, {}) == []  # type: ignore[arg-type]


def test_an_admission_records_its_gain_as_the_revoke_cost() -> None:
    v, _, _ = two_tasks()
    policy = Topas(horizon_s=5.0)
    d = policy.decide(v)  # type: ignore[arg-type]
    ranked = policy._candidates(v, 5.0, {}).ranked  # type: ignore[arg-type]
    gain = {c.req.rid: c.gain for c in ranked}
    assert d.admit and {r.rid: policy._credit[r.rid] for r in d.admit} == {
        r.rid: pytest.approx(gain[r.rid]) for r in d.admit
    }


def test_agent_info_counts_one_hop_stages_whose_deps_are_done() -> None:
    est = FixedEstimator({})
    r = Req(1, "t", "s0", agent="a")
    task = TaskV(
        "t",
        {
            "s0": StageV(
                "s0", agent="a", children=("s1", "s2", "s4"), state=StageState.RUNNING, request=r
            ),
            "s1": StageV("s1", agent="b", deps=("s0",)),
            "s2": StageV("s2", agent="b", deps=("s0",), children=("s3",)),
            "s3": StageV("s3", agent="c", deps=("s2",)),  # two hops away: not counted
            "s4": StageV("s4", agent="c", deps=("s0", "s5")),  # waits on s5 too: not counted
            "s5": StageV("s5", agent="d", children=("s4",)),
        },
    )
    prefixes = {
        "b": PrefixView("b", 2000, PrefixLocation.GPU, 0, False),
        "c": PrefixView("c", 3000, PrefixLocation.HOST, 0, False),
    }
    v = View([], {"t": task}, est, running=[r], reloads={"b": 2.0, "c": 0.5})
    info = Topas(reuse_users="next")._agents(v, prefixes, [])  # type: ignore[arg-type]
    assert info["b"] == AgentInfo(2.0, True, 2000, 2, 1)  # one running task a move stalls
    assert info["c"] == AgentInfo(0.5, False, 3000, 0, 1)


def test_agent_users_count_waiting_requests_with_reuse_users_all() -> None:
    """`reuse_users="all"` (the default): n_a is the one-hop users plus the agent's waiting
    requests; "next": the one-hop users only."""
    est = FixedEstimator({})
    r = Req(1, "t", "s0", agent="a")
    w1, w2 = Req(2, "u", "s0", agent="b"), Req(3, "v", "s0", agent="b")
    task = TaskV("t", {
        "s0": StageV("s0", agent="a", children=("s1",), state=StageState.RUNNING, request=r),
        "s1": StageV("s1", agent="b", deps=("s0",)),
    })  # fmt: skip
    waits = {
        tid: TaskV(tid, {"s0": StageV("s0", agent="b", state=StageState.WAITING, request=q)})
        for tid, q in (("u", w1), ("v", w2))
    }
    prefixes = {"b": PrefixView("b", 2000, PrefixLocation.GPU, 0, False)}
    v = View([w1, w2], {"t": task, **waits}, est, running=[r], reloads={"b": 2.0})
    one_hop = Topas(reuse_users="next")._agents(v, prefixes, [])  # type: ignore[arg-type]
    assert one_hop["b"].next_users == 1
    assert Topas()._agents(v, prefixes, [])["b"].next_users == 3  # type: ignore[arg-type]


# -- GREEDY-PACK ---------------------------------------------------------------------------------
def cand(rid: int, agent: str, gain: float, cost: int, *, prefix: int = 0, absent: bool = False,
         service: float = 10.0, urgent: bool = False) -> Candidate:  # fmt: skip
    req = Req(rid, f"t{rid}", "s0", agent=agent)
    return Candidate(req, agent, gain, cost, prefix, absent, service, urgent)


def victim(rid: int, value: float, frees: int, release: float = 10.0, agent: str = "v") -> Victim:
    return Victim(Req(rid, f"t{rid}", "s0", agent=agent), agent, value, frees, release)


def inputs(ranked: list[Candidate], budget: float, **kw: Any) -> PackInputs:
    base: dict[str, Any] = dict(
        victims=(), prefix_tokens={}, kept_unlocked={}, locked_agents=frozenset(),
        max_actions=8, scan=64, preempt_margin_s=5.0,
    )  # fmt: skip
    base.update(kw)
    return PackInputs(ranked=ranked, budget=budget, **base)


def test_pack_pays_an_agent_prefix_once_and_skips_what_does_not_fit() -> None:
    ranked = [
        cand(1, "a", 9.0, 3000, prefix=2000),
        cand(2, "a", 8.0, 3000, prefix=2000),  # shares a's prefix: costs 1000 after rid 1
        cand(3, "b", 7.0, 9000),  # too big: reserved; later ones backfill around it
        cand(4, "c", 6.0, 1500, service=1.0),
    ]
    pack = greedy_pack(inputs(ranked, 6000.0), None, frozenset())
    assert [c.req.rid for c in pack.admits] == [1, 2, 4]
    assert pack.used == pytest.approx(3000 + 1000 + 1500)
    assert pack.gain == pytest.approx(9 + 8 + 6)


def test_an_admission_stays_strictly_below_the_budget() -> None:
    # SGLang admits only while the need is below the remaining total, never equal to it
    assert not greedy_pack(inputs([cand(1, "a", 5.0, 1000)], 1000.0), None, frozenset()).admits
    assert greedy_pack(inputs([cand(1, "a", 5.0, 999)], 1000.0), None, frozenset()).admits


def test_pack_admits_one_request_per_absent_prefix() -> None:
    ranked = [cand(1, "a", 9.0, 3000, absent=True), cand(2, "a", 8.0, 3000, absent=True)]
    pack = greedy_pack(inputs(ranked, 20000.0), None, frozenset())
    assert [c.req.rid for c in pack.admits] == [1]


def test_pack_respects_k() -> None:
    ranked = [cand(i, "a", 50.0 - i, 1000) for i in range(10)]
    pack = greedy_pack(inputs(ranked, 1e9, max_actions=3), None, frozenset())
    assert len(pack.admits) == 3


def test_pack_preempts_when_the_gain_beats_redo_and_revoke() -> None:
    big = [cand(1, "a", 40.0, 5000)]
    cheap, dear = victim(8, 10.0, 4000), victim(9, 38.0, 9000)
    pack = greedy_pack(inputs(big, 2000.0, victims=[cheap, dear]), None, frozenset())
    assert [v.req.rid for v in pack.preempts] == [8]
    assert [c.req.rid for c in pack.admits] == [1]
    assert (pack.gain, pack.lost) == (40.0, 10.0)
    # A victim whose keep value eats the margin is spared, and nothing is admitted.
    pack = greedy_pack(inputs(big, 2000.0, victims=[dear]), None, frozenset())
    assert (pack.preempts, pack.admits) == ([], [])


def test_pack_preempts_several_victims_when_one_is_not_enough() -> None:
    big = [cand(1, "a", 40.0, 5000)]
    small = [victim(7, 3.0, 1500), victim(8, 4.0, 2000)]
    pack = greedy_pack(inputs(big, 2000.0, victims=small), None, frozenset())
    assert sorted(v.req.rid for v in pack.preempts) == [7, 8]
    assert pack.actions == 3
    # three actions do not fit K = 2: nothing happens
    pack = greedy_pack(inputs(big, 2000.0, victims=small, max_actions=2), None, frozenset())
    assert pack.actions == 0


def test_backfill_never_delays_a_reserved_candidate() -> None:
    # rid 1 needs 5,000; 3,000 is free now and a running request frees 3,000 at t = 10.
    # rid 2 (1,500 tokens, done at t = 2) backfills: it is gone before rid 1 could fit anyway.
    # rid 3 (1,500 tokens, running until t = 50) would hold rid 1 off past t = 10: refused.
    run = [victim(9, 1e9, 3000, release=10.0)]
    blocked = cand(1, "a", 40.0, 5000)
    quick, slow = cand(2, "b", 5.0, 1500, service=2.0), cand(3, "c", 5.0, 1500, service=50.0)
    pack = greedy_pack(inputs([blocked, quick], 3000.0, victims=run), None, frozenset())
    assert [c.req.rid for c in pack.admits] == [2]
    pack = greedy_pack(inputs([blocked, slow], 3000.0, victims=run), None, frozenset())
    assert pack.admits == []


def test_pack_admits_only_the_allowed_agents_and_urgent_ones() -> None:
    ranked = [cand(1, "a", 9.0, 100), cand(2, "b", 8.0, 100), cand(3, "c", 1.0, 100, urgent=True)]
    pack = greedy_pack(inputs(ranked, 1e6), frozenset({"b"}), frozenset())
    assert [c.req.rid for c in pack.admits] == [2, 3]


def test_pinning_a_prefix_costs_its_tokens_and_releasing_returns_them() -> None:
    ranked = [cand(1, "b", 5.0, 3000)]
    inp = inputs(ranked, 4000.0, prefix_tokens={"a": 2000}, kept_unlocked={"k": 1500})
    assert greedy_pack(inp, None, frozenset({"k"})).admits  # keep k, 4000 left
    assert not greedy_pack(inp, None, frozenset({"a", "k"})).admits  # 2000 left: no fit
    assert greedy_pack(inp, None, frozenset({"a"})).admits  # k released: 4000 - 2000 + 1500
    assert greedy_pack(inp, None, frozenset({"a"})).used == pytest.approx(2000 - 1500 + 3000)


# -- the resident-set score and search ------------------------------------------------------------
def agent(reload_s: float, *, resident: bool = True, tokens: int = 1000, users: int = 0,
          stall: int = 0) -> AgentInfo:  # fmt: skip
    return AgentInfo(reload_s, resident, tokens, users, stall)


@pytest.mark.parametrize(
    ("charge", "payers"),
    [("admitted", 1), ("running", 1 + 3), ("affected", 3 + 2)],
)
def test_score_charges_swap_in_per_move_charge(charge: str, payers: int) -> None:
    """One absent prefix (a) brought in by two admissions: "admitted" charges its reload once,
    "running" once plus once per running task, "affected" once per task it stalls: the three
    running tasks (x, y, z) and the two the pack admits (t1, t2)."""
    ranked = [cand(1, "a", 9.0, 3000, absent=True), cand(2, "b", 4.0, 1000)]
    agents = {"a": agent(2.5, resident=False, stall=3), "b": agent(1.0)}
    inp = inputs(ranked, 1e6, running_tasks=frozenset({"x", "y", "z"}))
    got = score_set(inp, agents, frozenset(), beta=0.0, joint=False, charge=charge)
    assert [c.req.rid for c in got.pack.admits] == [1, 2]
    assert got.score == pytest.approx(13.0 - 2.5 * payers)
    # a task both running and admitted pays once
    inp = inputs(ranked, 1e6, running_tasks=frozenset({"t1", "y", "z"}))
    both = score_set(inp, agents, frozenset(), beta=0.0, joint=False, charge="affected")
    assert both.score == pytest.approx(13.0 - 2.5 * 4)


def test_score_charges_swap_out_when_the_pack_needs_an_unkept_prefix() -> None:
    # 5,000 budget, of which b's resident, unkept prefix holds 2,000; the pack takes 4,000:
    # 1,000 of it comes from evicting b, whose 3 next users each pay its reload.
    ranked = [cand(1, "a", 9.0, 4000)]
    agents = {"a": agent(1.0), "b": agent(0.5, tokens=2000, users=3)}
    inp = inputs(ranked, 5000.0, prefix_tokens={"b": 2000})
    evict = score_set(inp, agents, frozenset(), beta=0.0, joint=False)
    assert evict.score == pytest.approx(9.0 - 3 * 0.5)
    # the pack fits in what b leaves: no swap-out
    small = inputs([cand(1, "a", 9.0, 2500)], 5000.0, prefix_tokens={"b": 2000})
    assert score_set(small, agents, frozenset(), beta=0.0, joint=False).score == 9.0


def test_score_subtracts_what_preemptions_lose() -> None:
    ranked = [cand(1, "a", 40.0, 5000)]
    inp = inputs(ranked, 2000.0, victims=[victim(8, 10.0, 4000)])
    got = score_set(inp, {"a": agent(1.0)}, frozenset(), beta=0.0, joint=False)
    assert [v.req.rid for v in got.pack.preempts] == [8]
    assert got.score == pytest.approx(40.0 - 10.0)


def test_score_adds_beta_times_reuse_of_resident_kept_agents() -> None:
    agents = {"b": agent(0.5, users=4), "c": agent(2.0, resident=False, users=5)}
    inp = inputs([], 1e6, prefix_tokens={"b": 1000})
    got = score_set(inp, agents, frozenset({"b", "c"}), beta=0.5, joint=True)
    assert got.score == pytest.approx(0.5 * 4 * 0.5)  # c is absent: keeping it saves nothing


def test_joint_search_can_hold_back_a_request_to_keep_a_valuable_prefix() -> None:
    """The joint choice: admitting rid 1 (agent x, gain 9) needs b's prefix evicted, and b's 10
    next users would each pay its 2 s reload; keeping b (reuse 0.5 x 10 x 2) and admitting the
    smaller rid 2 (agent y, gain 3) wins, though rid 1 ranks first."""
    ranked = [cand(1, "x", 9.0, 4500), cand(2, "y", 3.0, 500)]
    agents = {"x": agent(1.0), "y": agent(1.0), "b": agent(2.0, tokens=2000, users=10)}
    inp = inputs(ranked, 5000.0, prefix_tokens={"b": 2000})
    best = search(inp, agents, frozenset(), {"x": 9.0, "y": 3.0}, beta=0.5, joint=True, top=8)
    assert best.keep == frozenset({"b", "y"})
    assert [c.req.rid for c in best.pack.admits] == [2]
    assert best.score == pytest.approx(3.0 + 10.0)
    # without the joint choice, the pack admits by rank alone and evicts b
    loose = score_set(inp, agents, frozenset(), 0.5, joint=False)
    assert [c.req.rid for c in loose.pack.admits] == [1]  # rid 2 no longer fits below 5,000


def neighbourhood(
    inp: PackInputs, current: frozenset[str], options: list[str]
) -> list[frozenset[str]]:
    base = current - inp.locked_agents
    sets = [base, frozenset()]
    sets += [base ^ {a} for a in options]
    sets += [base - {a} for a in base]
    sets += [(base - {a}) | {b} for a in base for b in options if b not in base]
    return sets


@st.composite
def search_cases(draw: st.DrawFn) -> tuple[PackInputs, dict[str, AgentInfo], frozenset[str]]:
    """Consistent states: an agent is resident and unlocked (`prefix_tokens`), kept and
    unlocked (`kept_unlocked`), locked by running requests, or absent; a candidate of an
    unlocked resident agent pays its prefix in its cost, one of an absent agent computes it."""
    names = ["a", "b", "c", "d", "e"]
    where = {a: draw(st.sampled_from(["free", "kept", "locked", "absent"])) for a in names}
    tokens = {a: draw(st.integers(500, 5000)) for a in names}
    prefix_tokens = {a: tokens[a] for a in names if where[a] == "free"}
    kept = {a: tokens[a] for a in names if where[a] == "kept"}
    locked = frozenset(a for a in names if where[a] == "locked")
    ranked = []
    for i in range(draw(st.integers(0, 8))):
        a = draw(st.sampled_from(names))
        unpaid = tokens[a] if where[a] in ("free", "kept") else 0
        ranked.append(cand(
            i, a, draw(st.floats(0.1, 50)), unpaid + draw(st.integers(100, 6000)),
            prefix=unpaid if where[a] == "free" else 0, absent=where[a] == "absent",
            service=draw(st.floats(0.5, 60)), urgent=draw(st.booleans()) and i == 0,
        ))  # fmt: skip
    ranked.sort(key=lambda c: (not c.urgent, -c.gain))
    agents = {
        a: AgentInfo(draw(st.floats(0.0, 5.0)), where[a] != "absent", tokens[a],
                     draw(st.integers(0, 4)), 0)
        for a in names
    }  # fmt: skip
    victims = sorted(
        (victim(100 + i, draw(st.floats(0, 40)), draw(st.integers(100, 6000)),
                draw(st.floats(0.5, 60)), agent=draw(st.sampled_from(sorted(locked) or ["z"])))
         for i in range(draw(st.integers(0, 3)))),
        key=lambda v: (v.keep_value_s, v.req.rid),
    )  # fmt: skip
    inp = inputs(ranked, float(draw(st.integers(0, 20000))), prefix_tokens=prefix_tokens,
                 kept_unlocked=kept, locked_agents=locked, victims=victims,
                 max_actions=draw(st.integers(1, 8)))  # fmt: skip
    return inp, agents, locked | frozenset(kept)


def agent_gain(inp: PackInputs) -> dict[str, float]:
    out: dict[str, float] = {}
    for c in inp.ranked:
        out[c.agent] = out.get(c.agent, 0.0) + c.gain
    return out


@settings(max_examples=150, deadline=None)
@given(search_cases(), st.booleans(), st.integers(1, 6))
def test_search_is_at_least_as_good_as_every_set_in_its_neighbourhood(
    case: tuple[PackInputs, dict[str, AgentInfo], frozenset[str]], joint: bool, top: int
) -> None:
    """The neighbourhood: the current set, the empty set, one of the `top` agents by waiting
    gain added or removed, one current agent removed, one swapped for a top agent."""
    inp, agents, current = case
    gains = agent_gain(inp)
    best = search(inp, agents, current, gains, beta=1.0, joint=joint, top=top)
    # the reported score is the score of the reported set
    again = score_set(inp, agents, best.keep, 1.0, joint)
    assert best.score == pytest.approx(again.score)
    free = [a for a in agents if a not in inp.locked_agents]
    options = sorted(free, key=lambda a: (-gains.get(a, 0.0), a))[:top]
    for keep in neighbourhood(inp, current, options):
        assert best.score >= score_set(inp, agents, keep, 1.0, joint).score - 1e-9


@settings(max_examples=100, deadline=None)
@given(search_cases())
def test_search_finds_the_brute_force_optimum_when_one_agent_is_free(
    case: tuple[PackInputs, dict[str, AgentInfo], frozenset[str]],
) -> None:
    """With at most one agent to decide about, the neighbourhood holds every subset."""
    inp, agents, current = case
    free = [a for a in agents if a not in inp.locked_agents]
    agents = {a: i for a, i in agents.items() if a in inp.locked_agents or a == (free or [""])[0]}
    if free:
        ranked = [c for c in inp.ranked if c.agent in agents]
        inp = replace(inp, ranked=ranked)
        current = current & frozenset(agents)
    best = search(inp, agents, current, agent_gain(inp), beta=1.0, joint=True, top=8)
    subsets = [frozenset(c) for n in range(2) for c in itertools.combinations(free[:1], n)]
    optimum = max(score_set(inp, agents, k, 1.0, True).score for k in subsets)
    assert best.score == pytest.approx(optimum)


@settings(max_examples=100, deadline=None)
@given(search_cases())
def test_pack_stays_within_budget_and_k(
    case: tuple[PackInputs, dict[str, AgentInfo], frozenset[str]],
) -> None:
    inp, agents, current = case
    choice: Choice = search(inp, agents, current, agent_gain(inp), beta=1.0, joint=True, top=8)
    pack = choice.pack
    assert pack.actions <= inp.max_actions
    freed = sum(v.frees for v in pack.preempts)
    if pack.admits:
        assert pack.used < inp.budget + freed
    assert len({c.req.rid for c in pack.admits}) == len(pack.admits)
    absent = [c.agent for c in pack.admits if c.absent]
    assert len(absent) == len(set(absent))


def test_must_admit_prefers_a_set_that_admits() -> None:
    # the only candidate costs more reload than it gains: an idle server still runs it
    ranked = [cand(1, "a", 1.0, 1000, absent=True)]
    agents = {"a": agent(5.0, resident=False)}
    inp = inputs(ranked, 1e6)
    lazy = search(inp, agents, frozenset(), {"a": 1.0}, beta=0.0, joint=True, top=8)
    assert lazy.pack.admits == []
    idle = search(inp, agents, frozenset(), {"a": 1.0}, beta=0.0, joint=True, top=8,
                  must_admit=True)  # fmt: skip
    assert [c.req.rid for c in idle.pack.admits] == [1]


# -- simulated properties ------------------------------------------------------------------------
def stream(
    n_short: int, gap_s: float, long_output: int, long_input: int = 500, long_at_s: float = 0.0
) -> Workload:
    """One long call at `long_at_s`, and a stream of short two-call tasks over three agents."""
    agents = ("a", "b", "c")
    long_prompt = (Segment(agent_key("a"), 1000), Segment("long/in", long_input))
    tasks = [
        Task("long", "w", long_at_s, (Stage("s0", "a", long_prompt, long_output,
                                      max_new_tokens=long_output),))
    ]  # fmt: skip
    for i in range(n_short):
        ag, nx, tid = agents[i % 3], agents[(i + 1) % 3], f"s{i:04d}"
        p0 = (Segment(agent_key(ag), 1000), Segment(f"{tid}/in", 200))
        p1 = (Segment(agent_key(nx), 1000), Segment(output_key(tid, "s0"), 40))
        s0 = Stage("s0", ag, p0, 40, max_new_tokens=40)
        s1 = Stage("s1", nx, p1, 40, deps=("s0",), max_new_tokens=40)
        tasks.append(Task(tid, "w", 0.5 + i * gap_s, (s0, s1)))
    return Workload("stream", tuple(Agent(a, 1000) for a in agents), tuple(tasks))


def run(policy: str, w: Workload, budget: int, **params: Any) -> Any:
    cfg = SimConfig(kv_budget_tokens=budget, check_invariants=True)
    return Simulator(w, make_policy(policy, **params), COST, cfg).run()


def long_jct(res: Any) -> float:
    return float(res.tasks.set_index("task_id").loc["long", "jct_s"])


@pytest.mark.slow
def test_a_long_request_behind_a_stream_of_short_ones_does_not_starve() -> None:
    # The long call needs almost the whole budget: any running short call keeps it out. SRPT
    # with greedy backfilling keeps admitting short calls (log aging cannot outweigh a 40x
    # smaller remaining path), so without the starvation barrier it waits for the whole
    # stream; with it, its wait is bounded by starvation_factor x the mean remaining path.
    w = stream(n_short=800, gap_s=1.0, long_output=1600, long_input=1500, long_at_s=5.0)
    span = 0.5 + 800 * 1.0 - 5.0
    starved = run("topas", w, 4200, starvation_mult=0)
    bounded = run("topas", w, 4200)
    assert len(bounded.tasks) == len(w.tasks)
    assert long_jct(starved) > 0.9 * span
    assert long_jct(bounded) < 0.25 * long_jct(starved)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_decisions_respect_k_and_the_budget(k: int) -> None:
    w = stream(n_short=120, gap_s=0.3, long_output=300)
    res = run("topas", w, 6000, max_actions=k)  # check_invariants guards the budget
    d = res.decisions
    assert len(d) > 0
    assert int((d["admit"] + d["preempt"]).max()) <= max(k, 1)


def test_decisions_are_deterministic() -> None:
    w = stream(n_short=80, gap_s=0.4, long_output=400)
    a, b = run("topas", w, 5000), run("topas", w, 5000)
    assert a.requests.equals(b.requests) and a.tasks.equals(b.tasks)
    assert a.timeline.equals(b.timeline)
    assert a.decisions[["t_s", "waiting", "admit", "preempt"]].equals(
        b.decisions[["t_s", "waiting", "admit", "preempt"]]
    )


def test_same_view_same_decision() -> None:
    task = chain_task("t", 1)
    other = chain_task("u", 2, arrival_s=3.0)
    est = FixedEstimator({"s0": 10.0, "s1": 10.0})
    waiting = [task.stages["s0"].request, other.stages["s0"].request]
    v = View([r for r in waiting if r is not None], {"t": task, "u": other}, est, now_s=50.0)
    policy = Topas()
    first = policy.decide(v)  # type: ignore[arg-type]
    again = policy.decide(replace(v))  # type: ignore[arg-type]
    assert [r.rid for r in first.admit] == [r.rid for r in again.admit]
    assert first.keep_prefixes == again.keep_prefixes


def test_requests_with_nothing_reusable_are_never_held_back() -> None:
    ranked = [cand(1, "a", 9.0, 100), cand(2, "solo", 8.0, 100)]
    inp = inputs(ranked, 1e6, open_agents=frozenset({"solo"}))
    pack = greedy_pack(inp, frozenset(), frozenset())
    assert [c.req.rid for c in pack.admits] == [2]


# -- L_i as E[LP(Z)] ------------------------------------------------------------------------------
def _fork(width: int) -> TaskV:
    """A planner done, `width` parallel workers not sent yet, a joiner: a DAG whose longest
    path is a maximum over branches."""
    stages = {"P": StageV("P", kind="p", children=tuple(f"W{i}" for i in range(width)),
                          state=StageState.DONE)}  # fmt: skip
    for i in range(width):
        stages[f"W{i}"] = StageV(f"W{i}", kind="w", deps=("P",), children=("J",))
    stages["J"] = StageV("J", kind="j", deps=tuple(stages)[1:])
    return TaskV("t", stages)


def _spread_estimator() -> Any:
    from topas_bench.schedulers.estimator import ServiceEstimator

    est = ServiceEstimator(COST)
    for n in (10, 1000) * 10:  # workers end short or long, half each
        est.observe("a", "w", n)
    return est


def test_expected_longest_path_exceeds_the_longest_expected_path_on_branches() -> None:
    """Eight branches each short or long: LP(E[Z]) runs every branch at its mean; E[LP(Z)] is
    nearly the long one (the chance that all eight are short is 1/256)."""
    est, task = _spread_estimator(), _fork(8)
    mean = task_path(task, est, 2.0, [])  # type: ignore[arg-type]
    expected = task_path(task, est, 2.0, [], samples=64)  # type: ignore[arg-type]
    long_gap = (1000 - 505) * est.tpot_s
    assert expected.service_s > mean.service_s + 0.8 * long_gap
    assert expected.hops == mean.hops == 2
    # seeded by the task id: the same draws every time
    assert task_path(task, est, 2.0, [], samples=64) == expected  # type: ignore[arg-type]


def test_expected_longest_path_of_a_chain_is_the_sum_of_means() -> None:
    stages = {"A": StageV("A", kind="w", children=("B",)), "B": StageV("B", kind="w", deps=("A",))}
    est = _spread_estimator()
    got = task_path(TaskV("t", stages), est, 2.0, [], samples=32)  # type: ignore[arg-type]
    assert got == task_path(TaskV("t", stages), est, 2.0, [])  # type: ignore[arg-type]
