"""`kairos` (arXiv 2508.06948, Chen-Jin-yuan/Kairos): its three rules, each pinned so that
changing it fails a test: agents ranked by the Wasserstein distance of their remaining-latency
distributions to a zero-latency agent (nearest first); a waiting request refused when its
projected KV over its future time slots exceeds the budget (and nothing behind it passes); the
dispatcher sending a request to the replica with the lowest projected peak over its slots."""

from __future__ import annotations

import numpy as np
import pytest

from test_schedulers import FakeTask, FakeView, req, view
from topas_bench.errors import TopasError
from topas_bench.runners.cluster.routers import Cluster, Route, make_router
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.schedulers.base import StageState
from topas_bench.schedulers.kairos import Kairos, rank_agents, slot_starts, wasserstein
from topas_bench.schedulers.registry import make_policy
from topas_bench.schedulers.validate import InvalidParameter

COST = CostModel(load_preset("a100-qwen32b"))


# -- priority --------------------------------------------------------------------------------
def test_wasserstein_is_the_area_between_the_cdfs() -> None:
    rng = np.random.default_rng(0)
    u, v = rng.exponential(3.0, 40), rng.normal(5.0, 1.0, 25)
    scipy_stats = pytest.importorskip("scipy.stats")
    assert wasserstein(u, v) == pytest.approx(scipy_stats.wasserstein_distance(u, v))
    assert wasserstein(np.array([2.0, 4.0]), np.zeros(50)) == pytest.approx(3.0)


def test_agents_nearest_the_zero_latency_agent_rank_first() -> None:
    samples = {
        "late": [300.0, 320.0, 280.0],
        "early": [5.0, 8.0, 2.0],
        "mid": [100.0, 90.0, 150.0, 120.0],
        "unseen": [],
    }
    assert rank_agents(samples) == {"early": 0, "mid": 1, "late": 2}
    assert rank_agents({}) == {}


def _task_with_two_agents(tid: str, sent_a: float, sent_b: float) -> FakeTask:
    t = FakeTask(tid)
    t.add("s1", StageState.DONE, agent="A", rid=1, ready_s=sent_a)
    t.add("s2", StageState.RUNNING, deps=("s1",), agent="B", rid=2, ready_s=sent_b)
    return t


def test_remaining_latency_is_learned_online_and_orders_the_queue() -> None:
    """A task seen live and then gone gives each of its agents the latency left after its
    request was sent; the queue is then served in the agents' rank, send time within one."""
    policy = Kairos()
    policy.decide(view([], [_task_with_two_agents("t0", 0.0, 80.0)], now_s=90.0))
    assert policy.ranks == {}  # nothing finished yet
    a = req(7, 0.0, agent="A", ready_s=101.0)
    b1 = req(8, 0.0, agent="B", ready_s=103.0)
    b0 = req(9, 0.0, agent="B", ready_s=102.0)
    v = view([a, b1, b0], now_s=100.0)  # t0 ended: A waited 100 s for it, B 20 s
    assert [r.rid for r in policy.decide(v).admit] == [9, 8, 7]
    assert policy.ranks == {"B": 0, "A": 1}
    assert list(policy._samples["A"]) == [100.0] and list(policy._samples["B"]) == [20.0]


# -- memory-aware admission ----------------------------------------------------------------
def _contended(own: int, *behind: int) -> FakeView:
    """One request running (4,000 tokens, nothing shared), and waiting requests of `own` and
    then `behind` uncached prompt tokens, in the queue's order (one agent: one rank)."""
    running = req(1, 0.0, ("run", 4000), admitted_s=0.0)
    waiting = [req(2, 1.0, ("own", own), ready_s=1.0)]
    waiting += [req(3 + i, 1.0, ("x", n), ready_s=2.0 + i) for i, n in enumerate(behind)]
    return view(waiting, running=[running], running_tokens=4000, kv_budget_tokens=10_000,
                now_s=1.0)  # fmt: skip


def test_admission_refuses_what_overflows_a_future_slot() -> None:
    """Now, 4,000 + 5,600 tokens fit a 10,000-token budget; over the slots ahead both requests
    grow by a token per decode step (256 expected output tokens each) and pass it: refused,
    and the 100-token request behind it waits too (the head blocks, as in Kairos's balancer).
    5,000 tokens stay within it over every slot."""
    assert [r.rid for r in Kairos().decide(_contended(5600, 100)).admit] == []
    assert [r.rid for r in Kairos().decide(_contended(5000, 100)).admit] == [2, 3]
    # a looser limit admits it
    loose = Kairos(mem_fraction=1.1).decide(_contended(5600, 100))
    assert [r.rid for r in loose.admit] == [2, 3]


def test_the_projection_spans_the_requests_predicted_slots() -> None:
    slots = slot_starts(1.2, 0.5, 2.0)
    assert slots.tolist() == [1.0, 1.5, 2.0, 2.5, 3.0]  # aligned to the clock, to 3.2 s
    assert slot_starts(1.0, 0.5, 0.0).tolist() == [1.0]


def test_with_nothing_running_the_head_goes_whatever_its_size() -> None:
    huge = req(1, 0.0, ("big", 30_000))
    v = view([huge, req(2, 0.0)], kv_budget_tokens=10_000, free_tokens=100_000)
    got = Kairos().decide(v)
    assert [r.rid for r in got.admit] == [1]


def test_a_head_the_engine_refuses_too_is_passed_to_it() -> None:
    """Where the engine's budget has no room either, the head is passed on, so the engine's
    own refusal (NO_TOKEN) latches the batch as under FCFS."""
    v = _contended(5600, 100)
    v.free_tokens = 3000
    assert [r.rid for r in Kairos().decide(v).admit] == [2]


def test_bad_parameters_are_one_line_errors() -> None:
    with pytest.raises(InvalidParameter, match=r"slot_s must be >= 0\.01"):
        make_policy("kairos", slot_s=0.0)
    with pytest.raises(InvalidParameter, match="bias_factor must be at most 2"):
        make_policy("kairos", bias_factor=3.0)
    with pytest.raises(InvalidParameter, match="mem_fraction must be > 0"):
        make_policy("kairos", mem_fraction=0)
    with pytest.raises(InvalidParameter, match="unknown parameter 'slot'"):
        make_policy("kairos", slot=1.0)


# -- the dispatcher as a router -----------------------------------------------------------------
def _route(rid: int, agent: str, tokens: int) -> Route:
    pieces = ((f"in{rid}", 0, tokens),)
    return Route(rid, f"t{rid}", "s", agent, "k", pieces, pieces, tokens)


def test_router_sends_to_the_lowest_projected_peak_over_the_requests_slots() -> None:
    """Agent L's calls have answered with 4,000 tokens, S's with 10, both in 100 s. Replica 0
    holds an L call of 3,000 prompt tokens, replica 1 an S call of 5,000: fewer tokens now on
    replica 0, but over the next call's slots L's call grows past 6,000 and S's stays near
    5,000, so Kairos sends it to replica 1."""
    cluster = Cluster(2, kv_budget_tokens=20_000, cost=COST)
    r = make_router("kairos", cluster)
    for i, (agent, out) in enumerate([("L", 4000)] * 8 + [("S", 10)] * 8):
        k = r.route(_route(100 + i, agent, 10), 0.0)
        r.release(_route(100 + i, agent, 10), k, 100.0, out)
    assert r.route(_route(1, "L", 3000), 100.0) == 0
    assert r.route(_route(2, "S", 5000), 100.0) == 1
    assert r.route(_route(3, "S", 1000), 100.0) == 1  # 4,000 tokens now on 0, 6,000 on 1
    assert r.stats() == {"fits": 19, "spills": 0}


def test_router_parameters_are_checked() -> None:
    with pytest.raises(TopasError, match=r"slot_s must be a number >= 0\.01"):
        make_router("kairos", Cluster(2, kv_budget_tokens=1000, cost=COST), {"slot_s": 0})
    with pytest.raises(TopasError, match="mem_fraction must be > 0"):
        make_router("kairos", Cluster(2, kv_budget_tokens=1000, cost=COST), {"mem_fraction": 0})
    with pytest.raises(TopasError, match="cost model"):
        make_router("kairos", Cluster(2))


def test_a_prefix_is_counted_once_per_replica() -> None:
    cluster = Cluster(2, kv_budget_tokens=20_000, prefix_tokens={"A": 4000}, cost=COST)
    r = make_router("kairos", cluster)
    first = Route(1, "t1", "s", "A", "k", (), (), 5000)
    assert r.route(first, 0.0) == 0
    assert r.flight(first, 0, 0.0)[2] == 1000  # A's prefix is already there
    assert r.flight(first, 1, 0.0)[2] == 5000
