"""The baseline policies' orderings on hand-built views, `make_policy`, and every registered
scheduler x every registered workload on the simulator (STYLE 11)."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from fakes import FakeRequest, FakeStage
from topas_bench.errors import TopasError, UnknownNameError
from topas_bench.experiment import plan_run
from topas_bench.harness import run_cell
from topas_bench.results import TABLES, read_meta, read_table
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.runners.sim.engine import SimulationError
from topas_bench.schedulers.autellix import Autellix, critical_path_attained
from topas_bench.schedulers.base import Decision, Policy, RequestView, StageState
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.schedulers.lpm import LPM
from topas_bench.schedulers.registry import BASELINES, SCHEDULERS, make_policy, summary
from topas_bench.schedulers.sglang_stock import StockRow
from topas_bench.schedulers.spf import SPF, expected_remaining_s
from topas_bench.schedulers.validate import InvalidParameter, Param, flag, integer, number, one_of
from topas_bench.schedulers.view import PrefixView
from topas_bench.spec import RunSpec
from topas_bench.workloads.model import Segment
from topas_bench.workloads.registry import WORKLOADS

COST = CostModel(load_preset("a100-qwen32b"))


# -- fake views implementing the protocols of schedulers/base.py -------------------------------
@dataclass
class FakeTask:
    id: str
    arrival_s: float = 0.0
    workflow: str = "fake"
    stages: dict[str, FakeStage] = field(default_factory=dict)  # topological order
    version: int = 0

    @property
    def attained_s(self) -> float:
        return sum(s.request.service_s for s in self.stages.values() if s.request is not None)

    def add(
        self,
        stage_id: str,
        state: StageState,
        *,
        deps: tuple[str, ...] = (),
        agent: str = "a",
        kind: str = "k",
        prompt_tokens: int = 1000,
        rid: int | None = None,
        **request: Any,
    ) -> FakeRequest | None:
        """Add a stage; with `rid`, also the request the client sent for it."""
        req = None
        if rid is not None:
            prompt = request.pop("prompt", None) or (
                Segment(f"agent:{agent}", prompt_tokens - 100),
                Segment(f"{self.id}/{stage_id}/in", 100),
            )
            req = FakeRequest(rid, self.id, stage_id, agent, kind, prompt, **request)
            prompt_tokens = req.prompt_tokens
        self.stages[stage_id] = FakeStage(
            stage_id, agent, kind, deps, (), prompt_tokens, 0.0, state, req
        )
        for d in deps:
            parent = self.stages[d]
            parent.children = (*parent.children, stage_id)
        return req


@dataclass
class FakeView:
    waiting: Sequence[FakeRequest]
    tasks: dict[str, FakeTask]
    now_s: float = 0.0
    hits: dict[int, int] = field(default_factory=dict)  # rid -> cached prompt tokens
    estimator: ServiceEstimator = field(default_factory=lambda: ServiceEstimator(COST))
    running: Sequence[FakeRequest] = ()
    kv_budget_tokens: int = 18_692
    running_tokens: int = 0
    locked_tokens: int = 0
    evictable_tokens: int = 0
    free_tokens: int = 18_692
    host_capacity_tokens: int = 0
    reserved_tokens: float = 0.0

    def cached_tokens(self, req: RequestView) -> int:
        return self.hits.get(req.rid, 0)

    def prefixes(self) -> Sequence[PrefixView]:
        return ()

    def admission_need(self, req: RequestView) -> int:
        return req.prompt_tokens - self.cached_tokens(req) + 1

    def lock_cost(self, req: RequestView) -> int:
        return 0

    def admission_costs(self, reqs: Sequence[RequestView]) -> list[int]:
        return [self.admission_need(r) + self.lock_cost(r) for r in reqs]

    def reload_s(self, agent: str) -> float:
        return 0.0


def view(waiting: Sequence[FakeRequest], tasks: Sequence[FakeTask] = (), **kw: Any) -> FakeView:
    """A view of `waiting`; requests whose task is not in `tasks` get a one-stage task."""
    by_id = {t.id: t for t in tasks}
    for r in waiting:
        if r.task_id not in by_id:
            st = FakeStage(r.stage_id, r.agent, r.kind, state=StageState.WAITING, request=r)
            by_id[r.task_id] = FakeTask(r.task_id, stages={r.stage_id: st})
    return FakeView(list(waiting), by_id, **kw)


def req(rid: int, queued_s: float = 0.0, *prompt: tuple[str, int], **kw: Any) -> FakeRequest:
    """A waiting request of its own task `t<rid>`; `prompt` as (key, tokens) pairs."""
    segs = tuple(Segment(k, n) for k, n in prompt) or (
        Segment("agent:a", 100),
        Segment(f"t{rid}/in", 50),
    )
    return FakeRequest(rid, f"t{rid}", "s0", prompt=segs, queued_s=queued_s, **kw)


def order(policy: Policy, v: FakeView) -> list[int]:
    d = policy.decide(v)
    assert isinstance(d, Decision)
    assert list(d.preempt) == []
    assert sorted(r.rid for r in d.admit) == sorted(r.rid for r in v.waiting)
    return [r.rid for r in d.admit]


# -- fcfs ----------------------------------------------------------------------------------------
def test_fcfs_is_the_queue_as_it_stands() -> None:
    """SGLang's FCFS does not sort: the engine appends new, retracted and preempted requests
    to its queue (`_add_request_to_queue`), and that order is served. Send times, ids and
    queue-entry stamps do not reorder it."""
    waiting = [
        req(1, 9.0, ready_s=0.5, preemptions=1),
        req(2, 3.0, ready_s=3.0),
        req(3, 1.0, ready_s=1.0),
        req(4, 3.0, ready_s=2.0),
    ]
    assert order(make_policy("fcfs"), view(waiting)) == [1, 2, 3, 4]


# -- lpm -----------------------------------------------------------------------------------------
def test_lpm_serves_longest_cached_prefix_first() -> None:
    waiting = [req(1, 1.0), req(2, 2.0), req(3, 3.0), req(4, 4.0)]
    hits = {1: 40, 2: 500, 3: 0, 4: 120}
    assert order(LPM(), view(waiting, hits=hits)) == [2, 4, 1, 3]


def test_lpm_keeps_the_queue_order_among_equal_matches() -> None:
    """`_sort_by_longest_prefix` is a stable sort of the queue as it stands (which earlier
    sorts may have left out of arrival order)."""
    waiting = [req(5, 3.0), req(6, 1.0), req(7, 2.0), req(8, 1.0), req(9, 0.5)]
    hits = {5: 200, 6: 200, 7: 200, 8: 200, 9: 50}
    assert order(LPM(), view(waiting, hits=hits)) == [5, 6, 7, 8, 9]


def test_lpm_matches_at_most_the_prompt_minus_one() -> None:
    """`num_matched_prefix_tokens` is capped at len(fill) - 1 (`_compute_max_prefix_len`): a
    wholly cached 100-token prompt ranks with a 99-token hit."""
    waiting = [req(1, 1.0, ("p", 200)), req(2, 2.0, ("q", 100)), req(3, 3.0, ("r", 300))]
    hits = {1: 99, 2: 100, 3: 100}
    assert order(LPM(), view(waiting, hits=hits)) == [3, 1, 2]


@pytest.mark.parametrize(("n", "fcfs"), [(128, False), (129, True)])
def test_lpm_falls_back_to_fcfs_above_128_waiting(n: int, fcfs: bool) -> None:
    """`_determine_active_policy`: above 128 waiting, no matching: the queue keeps its order
    (here deliberately not by id or arrival)."""
    waiting = [req(i, float(i), ("x", 400)) for i in range(n)]
    queue = waiting[::2] + waiting[1::2]
    hits = {i: 40 + i for i in range(n)}
    got = order(LPM(), view(queue, hits=hits))
    assert got == ([r.rid for r in queue] if fcfs else list(range(n))[::-1])


def test_lpm_fallback_threshold_is_a_parameter() -> None:
    waiting = [req(1, 1.0), req(2, 2.0), req(3, 3.0)]
    hits = {1: 40, 2: 50, 3: 60}
    assert order(LPM(fallback_above=2), view(waiting, hits=hits)) == [1, 2, 3]
    assert order(LPM(fallback_above=3), view(waiting, hits=hits)) == [3, 2, 1]
    assert order(LPM(fallback_above=0), view(waiting, hits=hits)) == [3, 2, 1]  # 0 = never


def test_lpm_in_batch_prefix_deprioritisation() -> None:
    doc = ("doc", 200)
    waiting = [
        req(1, 1.0, ("agent:a", 100), doc, ("q1", 10)),  # first with this prefix: computes it
        req(2, 2.0, ("agent:a", 100), doc, ("q2", 10)),  # shares 300 with rid 1, 0 cached
        req(3, 3.0, ("agent:a", 100), doc, ("q3", 10)),  # shares 300, 32 cached: still checked
        req(4, 4.0, ("agent:a", 100), doc, ("q4", 10)),  # 33 cached: not checked, keeps place
        req(5, 5.0, ("agent:c", 31), ("x5", 100)),
        req(6, 6.0, ("agent:c", 31), ("x6", 100)),  # shares only 31 < 32 tokens with rid 5
        req(7, 7.0, ("agent:e", 32), ("x7", 100)),
        req(8, 8.0, ("agent:e", 32), ("x8", 100)),  # shares exactly 32 tokens with rid 7
    ]
    hits = {1: 0, 2: 0, 3: 32, 4: 33, 5: 0, 6: 0, 7: 0, 8: 0}
    # Not demoted: 4 (33), then 1, 5, 6, 7 (0 cached, FCFS); demoted last: 2, 3, 8 in queue order.
    assert order(LPM(), view(waiting, hits=hits)) == [4, 1, 5, 6, 7, 2, 3, 8]


def test_lpm_demoted_requests_keep_queue_order() -> None:
    # SGLang's `_sort_by_longest_prefix` keys every deprioritised request float("inf"), so they
    # stay in queue order among themselves whatever their own (small) cache hits.
    waiting = [
        req(1, 1.0, ("agent:a", 10), ("doc-a", 100)),
        req(2, 2.0, ("agent:b", 20), ("doc-b", 100)),
        req(3, 3.0, ("agent:a", 10), ("doc-a", 100), ("q3", 5)),  # shares 110 with rid 1
        req(4, 4.0, ("agent:b", 20), ("doc-b", 100), ("q4", 5)),  # shares 120 with rid 2
    ]
    hits = {1: 0, 2: 20, 3: 0, 4: 20}
    assert order(LPM(), view(waiting, hits=hits)) == [2, 1, 3, 4]


def test_lpm_in_batch_thresholds_are_parameters() -> None:
    waiting = [
        req(1, 1.0, ("agent:a", 100), ("x1", 10)),
        req(2, 2.0, ("agent:a", 100), ("x2", 10)),
    ]
    hits = {1: 0, 2: 50}
    assert order(LPM(), view(waiting, hits=hits)) == [2, 1]  # 50 > 32: not checked
    lpm = LPM(in_batch_check_tokens=64)
    assert order(lpm, view(waiting, hits=hits)) == [1, 2]  # checked now: shares 100, demoted
    lpm = LPM(in_batch_check_tokens=64, in_batch_deprioritize_tokens=101)
    assert order(lpm, view(waiting, hits=hits)) == [2, 1]  # 100 shared < 101: kept


# -- spf -----------------------------------------------------------------------------------------
def _chain(tid: str, arrival_s: float, rid: int, n_stages: int, **kw: Any) -> FakeTask:
    """A chain whose first stage waits (request `rid`) and whose later stages are blocked."""
    t = FakeTask(tid, arrival_s)
    t.add("s0", StageState.WAITING, rid=rid, queued_s=arrival_s, **kw)
    for i in range(1, n_stages):
        t.add(f"s{i}", StageState.BLOCKED, deps=(f"s{i - 1}",), **kw)
    return t


def _waiting(tasks: Sequence[FakeTask]) -> list[FakeRequest]:
    return [
        s.request
        for t in tasks
        for s in t.stages.values()
        if s.state == StageState.WAITING and s.request is not None
    ]


def test_spf_expected_remaining_is_the_sum_over_unfinished_stages() -> None:
    t = FakeTask("t", 0.0)
    t.add("s0", StageState.DONE, rid=1, generated=300, admitted_s=1.0, service_s=9.0)
    t.add("s1", StageState.RUNNING, deps=("s0",), rid=2, generated=100, admitted_s=5.0)
    t.add("s2", StageState.WAITING, deps=("s0",), rid=3, prompt_tokens=1100)
    t.add("s3", StageState.BLOCKED, deps=("s1", "s2"), prompt_tokens=2000)
    v = view(_waiting([t]), [t])
    tpot = COST.decode_step_s(1, 1024)  # the estimator's starting time per output token
    expected = (
        (256 - 100) * tpot  # running s1: the prior's 256 tokens minus the 100 it generated
        + 256 * tpot + COST.prefill_s([(0, 1100)])  # waiting s2 still owes its prefill
        + 256 * tpot + COST.prefill_s([(0, 2000)])  # unsent s3
    )  # fmt: skip
    assert expected_remaining_s(t, v) == pytest.approx(expected, rel=1e-12)
    assert v.estimator.tpot_s == tpot


def test_spf_serves_the_task_with_least_expected_remaining_service_first() -> None:
    long_task = _chain("long", 0.0, rid=1, n_stages=3)
    short = _chain("short", 1.0, rid=2, n_stages=1)
    tie = _chain("tie", 2.0, rid=3, n_stages=1)  # same remaining as `short`: arrival decides
    middle = _chain("middle", 3.0, rid=4, n_stages=2)
    tasks = [long_task, short, tie, middle]
    v = view(_waiting(tasks)[::-1], tasks)
    assert order(SPF(), v) == [2, 3, 4, 1]


def test_spf_follows_what_the_estimator_learns() -> None:
    x = _chain("x", 0.0, rid=1, n_stages=1, kind="long")
    y = _chain("y", 1.0, rid=2, n_stages=1, kind="short")
    v = view(_waiting([x, y]), [x, y])
    spf = SPF()
    assert order(spf, v) == [1, 2]  # both at the prior: earlier arrival first
    for _ in range(20):
        v.estimator.observe("a", "long", 3000)
        v.estimator.observe("a", "short", 20)
    assert order(spf, v) == [2, 1]  # same policy instance: its memo follows the estimator


def test_spf_uses_true_lengths_under_the_oracle_hint() -> None:
    x = _chain("x", 0.0, rid=1, n_stages=1)
    y = _chain("y", 1.0, rid=2, n_stages=1)
    truth = {("x", "s0"): 2000, ("y", "s0"): 10}
    est = ServiceEstimator(COST, true_length=lambda t, s: truth[(t, s)])
    assert order(SPF(), view(_waiting([x, y]), [x, y], estimator=est)) == [2, 1]


# -- parrot --------------------------------------------------------------------------------------
def test_parrot_orders_by_task_arrival() -> None:
    old = FakeTask("old", 0.0)
    old.add("s0", StageState.DONE, rid=1)
    old.add("s1", StageState.WAITING, deps=("s0",), rid=2, queued_s=50.0)
    old.add("s2", StageState.WAITING, deps=("s0",), rid=3, queued_s=40.0)
    new = FakeTask("new", 10.0)
    new.add("s0", StageState.WAITING, rid=4, queued_s=10.0)
    twin = FakeTask("a-twin", 10.0)  # same arrival as `new`: the task id decides
    twin.add("s0", StageState.WAITING, rid=5, queued_s=12.0)
    tasks = [old, new, twin]
    v = view(_waiting(tasks), tasks, now_s=60.0)
    assert order(make_policy("parrot"), v) == [3, 2, 5, 4]
    assert order(make_policy("fcfs"), v) == [r.rid for r in _waiting(tasks)]  # the queue


# -- autellix ------------------------------------------------------------------------------------
def _diamond(
    tid: str, arrival_s: float, rid: int, services: tuple[float, float, float]
) -> FakeTask:
    """s0 -> {s1, s2} -> s3, the first three done with `services`, s3 waiting (request `rid`)."""
    t = FakeTask(tid, arrival_s)
    t.add("s0", StageState.DONE, rid=rid * 10, service_s=services[0])
    t.add("s1", StageState.DONE, deps=("s0",), rid=rid * 10 + 1, service_s=services[1])
    t.add("s2", StageState.DONE, deps=("s0",), rid=rid * 10 + 2, service_s=services[2])
    t.add("s3", StageState.WAITING, deps=("s1", "s2"), rid=rid, queued_s=9.0)
    return t


def test_autellix_critical_path_attained_service() -> None:
    t = _diamond("t", 0.0, rid=1, services=(1.0, 2.5, 1.0))
    assert critical_path_attained(t) == {"s0": 0.0, "s1": 1.0, "s2": 1.0, "s3": 3.5}
    assert t.attained_s == 4.5


def test_autellix_levels_follow_attained_service() -> None:
    # quantum 2 s: level thresholds at 2, 4, 8, ... seconds of attained service.
    dag = _diamond("dag", 0.0, rid=1, services=(1.0, 2.5, 1.0))  # critical path 3.5: level 1
    chain = FakeTask("chain", 0.0)  # 4.5 s along its only path: level 2
    chain.add("s0", StageState.DONE, rid=20, service_s=4.5)
    chain.add("s1", StageState.WAITING, deps=("s0",), rid=2, queued_s=8.0)
    fresh = _chain("fresh", 9.5, rid=3, n_stages=2)  # nothing attained: level 0
    own = _chain("own", 8.5, rid=4, n_stages=1, service_s=1.5)  # preempted after 1.5 s: level 0
    tasks = [chain, dag, own, fresh]
    v = view(_waiting(tasks), tasks, now_s=10.0)
    # Level 0 in queue order (own 8.5, fresh 9.5), then dag (1), then chain (2), though chain
    # queued first; with the task's total (4.5 s) instead of the critical path, dag would be
    # level 2 too and queue after chain.
    assert order(Autellix(quantum_s=2.0), v) == [4, 3, 1, 2]
    assert order(Autellix(quantum_s=2.0, levels=1), v) == [2, 4, 1, 3]  # one level: FCFS


@pytest.mark.parametrize(("now_s", "expected"), [(10.0, [2, 1]), (10.01, [1, 2])])
def test_autellix_promotes_starved_calls(now_s: float, expected: list[int]) -> None:
    # rid 1 attained 5 s (level 2); it starves once it has waited more than
    # starvation_ratio (2) x 5 s, and is then promoted to level 0 ahead of later arrivals.
    old = FakeTask("old", 0.0)
    old.add("s0", StageState.DONE, rid=10, service_s=5.0)
    old.add("s1", StageState.WAITING, deps=("s0",), rid=1, queued_s=0.0)
    new = _chain("new", 9.9, rid=2, n_stages=1)
    tasks = [old, new]
    v = view(_waiting(tasks), tasks, now_s=now_s)
    assert order(Autellix(quantum_s=2.0, starvation_ratio=2.0), v) == expected


# -- determinism ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [b for b in BASELINES if b not in ("fcfs", "lpm")])
def test_ties_break_on_rid_whatever_the_queue_order(name: str) -> None:
    """Policies that sort (SGLang's own FCFS and LPM keep the queue's order instead)."""
    t = FakeTask("t", 0.0)
    for rid, sid in zip((7, 3, 11, 5), ("s0", "s1", "s2", "s3"), strict=True):
        t.add(sid, StageState.WAITING, rid=rid, queued_s=1.0)
    hits = {3: 100, 5: 100, 7: 100, 11: 100}  # > 32 cached: no in-batch demotion
    waiting = _waiting([t])
    for perm in itertools.permutations(waiting):
        v = view(list(perm), [t], now_s=1.5, hits=hits)
        assert order(make_policy(name), v) == [3, 5, 7, 11]


# -- make_policy ---------------------------------------------------------------------------------
def test_make_policy_unknown_name_lists_the_known_ones() -> None:
    known = ", ".join(SCHEDULERS.names())
    with pytest.raises(UnknownNameError) as e:
        make_policy("nope")
    assert str(e.value) == f"unknown scheduler 'nope'; known: {known}"
    assert SCHEDULERS.names()[:5] == list(BASELINES)


@pytest.mark.parametrize(
    ("name", "params", "msg"),
    [
        ("fcfs", {"x": 1}, "scheduler 'fcfs' takes no parameters (got x)"),
        ("parrot", {"b": 1, "a": 2}, "scheduler 'parrot' takes no parameters (got a, b)"),
        ("spf", {"x": 1}, "scheduler 'spf' takes no parameters (got x)"),
        ("lpm", {"nope": 1}, "unknown parameter 'nope'; valid: fallback_above, in_batch_check"),
        ("lpm", {"fallback_above": -1}, "lpm: fallback_above must be an integer >= 0, got -1"),
        ("lpm", {"fallback_above": "abc"}, "fallback_above must be an integer >= 0, got 'abc'"),
        ("lpm", {"in_batch_check_tokens": -1}, "in_batch_check_tokens must be an integer >= 0"),
        ("lpm", {"in_batch_deprioritize_tokens": -5}, "in_batch_deprioritize_tokens must be"),
        ("lpm", {"in_batch_check_tokens": "foo"}, "got 'foo'"),
        ("lpm", {"in_batch_deprioritize_tokens": None}, "got None"),
        ("autellix", {"quantum_s": 0}, "quantum_s must be > 0 (valid range (0, inf)), got 0"),
        ("autellix", {"levels": 0}, "levels must be an integer >= 1, got 0"),
        ("autellix", {"starvation_ratio": -1.0}, "starvation_ratio must be > 0"),
        ("autellix", {"quantum_s": "foo"}, "autellix: quantum_s must be a finite number"),
        ("autellix", {"quantum": 1.0}, "unknown parameter 'quantum'; valid: quantum_s, levels"),
    ],
)
def test_make_policy_rejects_bad_parameters(name: str, params: dict[str, Any], msg: str) -> None:
    with pytest.raises(InvalidParameter) as e:
        make_policy(name, **params)
    assert isinstance(e.value, TopasError)
    assert msg in str(e.value)
    assert "\n" not in str(e.value)


def test_param_probe_answers_for_every_scheduler() -> None:
    """scripts/param_probe.py (the before/after check of docs/design.md's issue 34) builds every
    registered scheduler with its defaults, each value, an unknown name, and says what it got."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "scripts" / "param_probe.py"
    spec = importlib.util.spec_from_file_location("param_probe", path)
    assert spec is not None and spec.loader is not None
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    lines = probe.probes()
    assert {ln.split()[0] for ln in lines} == set(SCHEDULERS.names())
    assert "fcfs default ok {}" in lines
    assert (
        "fcfs bogus=1 ERR InvalidParameter: scheduler 'fcfs' takes no parameters (got bogus)"
        in lines
    )
    assert (
        "lpm fallback_above=0.5 ERR InvalidParameter: lpm: fallback_above must be an integer "
        ">= 0, got 0.5"
    ) in lines
    assert (
        "lpm default ok {'fallback_above': 128, 'in_batch_check_tokens': 32, "
        "'in_batch_deprioritize_tokens': 32}"
    ) in lines
    n_values = len(probe.VALUES)
    per = {name: 1 + (n_values * (len(make_policy(name).params) + 1) + 1) for name in SCHEDULERS}
    assert len(lines) == sum(per.values())


def test_make_policy_builds_fresh_instances_with_their_params() -> None:
    a, b = make_policy("autellix", levels=4), make_policy("autellix", levels=4)
    assert a is not b
    assert a.params == {"quantum_s": 2.0, "levels": 4, "starvation_ratio": 2.0}
    assert make_policy("lpm", fallback_above=7).params == {
        "fallback_above": 7,
        "in_batch_check_tokens": 32,
        "in_batch_deprioritize_tokens": 32,
    }
    assert make_policy("fcfs").params == {}


class _Declared(Policy):
    """A policy declaring one parameter of each kind, its state built in `setup`."""

    name = "declared"
    levels = integer(4, 1, 16)
    rate = number(0.5, strict=True, high=1.0)
    count = number(2.0, as_given=True)
    on = flag(True)
    mode = one_of("a", ("a", "b"))

    def setup(self) -> None:
        if self.rate > 0.9 and self.on:
            raise InvalidParameter(f"{self.name}: rate above 0.9 needs on=false")
        self.state: list[int] = [self.levels]

    def decide(self, view: Any) -> Decision:
        return Decision(admit=[])


class _Override(_Declared):
    name = "override"
    rate = number(0.25)  # a subclass's default and check replace its base's, in its place
    extra = integer(1, 0)


def test_declared_parameters_are_checked_set_and_reported_in_order() -> None:
    p = _Declared(count=3, mode="b")
    assert p.params == {"levels": 4, "rate": 0.5, "count": 3, "on": True, "mode": "b"}
    assert type(p.params["count"]) is int and type(_Declared(levels=5).params["rate"]) is float
    assert p.state == [4]  # setup ran after the parameters were set
    assert isinstance(_Declared.__dict__["levels"], Param)  # the class keeps the declaration
    for bad, msg in (
        ({"levels": 0}, "declared: levels must be an integer >= 1, got 0"),
        ({"rate": 0}, "declared: rate must be > 0 (valid range (0, inf)), got 0"),
        ({"rate": 2}, "declared: rate must be at most 1, got 2"),
        ({"on": 1}, "declared: on must be true or false, got 1"),
        ({"mode": "c"}, "declared: mode must be one of a, b, got 'c'"),
        ({"rate": 0.95}, "declared: rate above 0.9 needs on=false"),
        ({"levels": 0, "rate": 0}, "levels must be"),  # the first declared is named first
        ({"x": 1}, "scheduler 'declared': unknown parameter 'x'; valid: levels, rate, count, on"),
    ):
        with pytest.raises(InvalidParameter, match=re.escape(msg)):
            _Declared(**bad)
    assert _Declared(rate=0.95, on=False).params["rate"] == 0.95
    o = _Override(extra=3)
    assert list(o.params) == ["levels", "rate", "count", "on", "mode", "extra"]
    assert o.params["rate"] == 0.25 and _Override(rate=2.0, on=False).params["rate"] == 2.0


# -- every scheduler x every workload on the simulator -------------------------------------------
SAMPLE_TASKS = 8


#: `trace` runs a file: the docs' example, repeated to SAMPLE_TASKS tasks
EXAMPLE = str(Path(__file__).parents[1] / "docs" / "examples" / "writer-reviewer.jsonl")


#: Cells where SGLang 0.5.23 itself runs out of memory, and the simulator with it (the
#: reference engine crashes at the same step, with the same free KV: docs/schedulers.md), with
#: exact lengths at the rate they were found at; with MetaGPT's cap (the default) they run.
SGLANG_CRASHES = {("shortest-prefill-first", "metagpt-tl-full"): 0.0012}


@pytest.mark.parametrize("workload", WORKLOADS.names())
@pytest.mark.parametrize("scheduler", SCHEDULERS.names())
def test_every_scheduler_runs_every_workload(scheduler: str, workload: str, tmp_path: Path) -> None:
    params = {"file": EXAMPLE} if workload == "trace" else {}
    plan = plan_run(RunSpec(workload=workload, schedulers=(scheduler,), num_tasks=SAMPLE_TASKS,
                            out=tmp_path, workload_params=params))  # fmt: skip
    # Re-derive the memory accounting after every event: a policy must not break it.
    plan = replace(plan, sim=replace(plan.sim, check_invariants=True))
    if (scheduler, workload) in SGLANG_CRASHES:
        exact = plan_run(RunSpec(
            workload=workload, schedulers=(scheduler,), num_tasks=SAMPLE_TASKS,
            rate_per_s=SGLANG_CRASHES[scheduler, workload], out=tmp_path / "exact",
            workload_params={"max_tokens": "exact"},
        ))  # fmt: skip
        exact = replace(exact, sim=replace(exact.sim, check_invariants=True))
        with pytest.raises(SimulationError, match=r"out of KV memory allocating 2056 tokens \(82"):
            run_cell(exact, scheduler)
    cell = run_cell(plan, scheduler)
    assert not cell.cached
    assert sorted(p.name for p in cell.run_dir.iterdir()) == sorted(
        [*(f"{t}.parquet" for t in TABLES), "run.json"]
    )

    tasks = read_table(cell.run_dir, "tasks")
    assert sorted(tasks["task_id"]) == sorted(t.id for t in plan.workload.tasks)
    assert (tasks["jct_s"] > 0).all()
    assert tasks["jct_s"].to_numpy() == pytest.approx(
        (tasks["finish_s"] - tasks["arrival_s"]).to_numpy()
    )
    arrivals = {t.id: t.arrival_s for t in plan.workload.tasks}
    assert tasks["arrival_s"].tolist() == [arrivals[t] for t in tasks["task_id"]]

    requests = read_table(cell.run_dir, "requests")
    truth = {(t.id, s.id): s.output_tokens for t, s in plan.workload.stages()}
    assert len(requests) == len(truth)
    keys = zip(requests["task_id"], requests["stage_id"], strict=True)
    produced = dict(zip(keys, requests["output_tokens"], strict=True))
    assert produced == truth  # every call ran to its full output
    assert (requests["status"] == "ok").all()
    assert (requests["finish_s"] >= requests["ready_s"]).all()

    s = cell.summary
    jct = tasks["jct_s"]
    assert s["tasks"] == SAMPLE_TASKS
    assert s["mean_jct_s"] == pytest.approx(jct.mean())
    assert 0 < jct.min() <= s["p50_jct_s"] <= s["p90_jct_s"] <= s["p99_jct_s"] <= jct.max()
    span = tasks["finish_s"].max() - tasks["arrival_s"].min()
    assert s["throughput_tps"] == pytest.approx(SAMPLE_TASKS / span)
    assert 0.0 <= s["prefix_hit_rate"] <= 1.0
    assert s["preemptions"] == requests["preemptions"].sum() >= 0
    assert s["decision_p50_ms"] <= s["decision_p99_ms"]
    assert cell.sim_time_s == pytest.approx(tasks["finish_s"].max())
    assert read_meta(cell.run_dir)["summary"] == pytest.approx(s, nan_ok=True)


@pytest.mark.parametrize("name", SCHEDULERS.names())
def test_every_scheduler_describes_itself(name: str) -> None:
    """`topas-bench schedulers list` shows the first docstring paragraph of each class, on one
    line, a stock row's summary: whole sentences."""
    factory = SCHEDULERS.get(name)
    own = factory.summary if isinstance(factory, StockRow) else factory.__dict__.get("__doc__")
    doc = (own or "").strip()
    assert doc.endswith(".") and len(doc) > 20
    first = doc.split("\n\n")[0]
    assert summary(name) == " ".join(first.split()) and summary(name).endswith(".")
