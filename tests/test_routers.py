"""The routers, request by request: sglang-router 0.3.2's cache_aware tree and rules (replaying
the decisions the real router made in ../shared/sglang-router-notes, phases P1, P4 and P5),
round-robin, least-load, agent-affinity and workflow-aware."""

from __future__ import annotations

from typing import Any

import pytest

from topas_bench.errors import TopasError
from topas_bench.runners.cluster.routers import Cluster, Route, make_router
from topas_bench.runners.cluster.routers.cache_aware import CacheAware
from topas_bench.runners.cluster.tree import TEXT, TOKENS, ApproxTree
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.workloads.model import agent_key


def test_tree_matches_and_owners() -> None:
    t: ApproxTree[str] = ApproxTree(TEXT)
    t.insert("hello world", 1)
    t.insert("hello there", 2)  # splits "hello " off; the upper half keeps tenant 1 as owner
    assert t.prefix_match("hello world, again") == (11, 1)
    assert t.prefix_match("hello thx") == (8, 2)  # a partial match inside "there": its owner
    assert t.prefix_match("hello") == (5, 1)  # inside "hello ": the earliest request's worker
    assert t.prefix_match("bye")[0] == 0
    assert t.size == {1: 11, 2: 11}  # "hello " is shared, counted for each worker
    t.insert("hello world", 2)
    assert t.size[2] == 16
    assert t.prefix_match("hello world")[1] == 1  # last_tenant is the creator, not the latest


def test_tree_over_tokens() -> None:
    t: ApproxTree[Any] = ApproxTree(TOKENS)
    a = ((agent_key("A"), 0, 100), ("task1", 0, 20))
    b = ((agent_key("A"), 0, 100), ("task2", 0, 30))
    t.insert(a, 0)
    assert t.prefix_match(b) == (100, 0)
    t.insert(b, 1)
    assert t.prefix_match(b) == (130, 1)
    assert t.prefix_match(((agent_key("B"), 0, 50),))[0] == 0


def test_tree_eviction_by_size() -> None:
    t: ApproxTree[str] = ApproxTree(TEXT)
    for i, text in enumerate(["aaaa1", "aaaa2", "bbbb3"]):
        t.insert(text, 0)
        t.insert("z" * (i + 1), 1)
    assert t.size[0] == 4 + 1 + 1 + 5
    t.evict(6)  # worker 0 loses its least recently used leaves until it holds 6 units or fewer
    assert t.size[0] <= 6
    assert t.prefix_match("bbbb3") == (5, 0)  # the newest survives
    assert t.prefix_match("aaaa1")[0] < 5
    assert t.size[1] == 3  # worker 1 was within the limit: untouched


# -- cache_aware against the real router's recorded decisions ------------------------------
PREFIX = {p: f"You are agent {p}. " + p * n for p, n in (("A", 3000), ("B", 4000), ("C", 5000))}


def _req(i: int, text: str) -> Route:
    return Route(i, f"t{i}", "s", "a", "k", text)


def _router(order: tuple[int, ...], **params: Any) -> CacheAware:
    from topas_bench.runners.cluster.routers.base import parse_params

    cluster = Cluster(3, order=order)
    return CacheAware(cluster, parse_params(CacheAware, params), units=TEXT)


def _texts(prefixes: str) -> list[str]:
    return [PREFIX[p] + f"Task {i}: do thing {i * 7919 % 1000}" for i, p in enumerate(prefixes)]


def test_cache_aware_sequential_traffic_stays_on_the_first_worker() -> None:
    """P1: 60 sequential requests of three prefixes all land on the first registered worker."""
    r = _router((2, 1, 0))
    for i, text in enumerate(_texts("ABC" * 20)):
        req = _req(i, text)
        assert r.route(req, 0.0) == 2
        r.release(req, 2, 0.0, 4)


def test_cache_aware_concurrent_cold_tree_spreads_prefixes() -> None:
    """P4 (balance_abs_threshold 2, registry order w2, w1, w0): the first A, B, C miss and go
    to the least-loaded worker in registry order; then each prefix sticks to its worker."""
    r = _router((2, 1, 0), balance_abs_threshold=2)
    got = [r.route(_req(i, t), 0.0) for i, t in enumerate(_texts("ABC" * 10))]
    assert got == [2, 1, 0] * 10


def test_cache_aware_spills_under_imbalance() -> None:
    """P5: 24 concurrent requests of prefix A, owned by w2: the owner takes 3, then the balance
    test spills, and balanced-mode hits go back to the owner (the tree's `last_tenant` is the
    first worker that reached that depth): 2 2 2 1 0 2 1 0 ..., 7/7/10 over w0/w1/w2."""
    r = _router((2, 1, 0), balance_abs_threshold=2)
    warm = _req(99, PREFIX["A"] + "warm-up")
    r.release(warm, r.route(warm, 0.0), 0.0, 4)
    got = [r.route(_req(i, t), 0.0) for i, t in enumerate(_texts("A" * 24))]
    assert got[:8] == [2, 2, 2, 1, 0, 2, 1, 0]
    assert [got.count(k) for k in (0, 1, 2)] == [7, 7, 10]


def test_cache_aware_threshold_and_eviction() -> None:
    r = _router((0, 1, 2), eviction_interval_secs=10, max_tree_size=50)
    a = _req(0, "x" * 100)
    assert r.route(a, 0.0) == 0
    b = _req(1, "x" * 20 + "y" * 80)  # matches 20%: below 0.3, so the least loaded
    assert r.route(b, 1.0) == 1
    c = _req(2, "x" * 40 + "z" * 60)  # 40% of its text is cached by worker 0 (the creator)
    assert r.route(c, 2.0) == 0
    for req, k in ((a, 0), (b, 1), (c, 0)):
        r.release(req, k, 3.0, 4)
    assert r.tree.size[0] > 50
    r.route(_req(3, "q"), 11.0)  # the first routing after 10 s runs the eviction first
    assert r.tree.size[0] <= 50


def test_router_params_are_checked() -> None:
    with pytest.raises(TopasError, match="unknown parameter 'foo'; valid: cache_threshold"):
        make_router("cache-aware", Cluster(2), {"foo": 1})
    with pytest.raises(TopasError, match="balance_abs_threshold must be an integer >= 0"):
        make_router("agent-affinity", Cluster(2), {"balance_abs_threshold": 1.5})
    with pytest.raises(TopasError, match="it takes none"):
        make_router("round-robin", Cluster(2), {"x": 1})
    with pytest.raises(TopasError, match="cost model"):
        make_router("workflow-aware", Cluster(2))
    with pytest.raises(TopasError, match="not a permutation"):
        Cluster(3, order=(0, 0, 1))


# -- the other routers --------------------------------------------------------------------------
def test_round_robin_and_least_load() -> None:
    rr = make_router("round-robin", Cluster(3, order=(2, 0, 1)))
    assert [rr.route(_req(i, ""), 0.0) for i in range(5)] == [2, 0, 1, 2, 0]
    ll = make_router("least-load", Cluster(3))
    got = [ll.route(_req(i, ""), 0.0) for i in range(4)]
    assert got == [0, 1, 2, 0]
    ll.release(_req(1, ""), 1, 0.0, 1)
    assert ll.route(_req(9, ""), 0.0) == 1


def _agent_req(i: int, agent: str) -> Route:
    return Route(i, f"t{i}", "s", agent, "k", "")


def test_agent_affinity_pins_then_rebalances() -> None:
    r = make_router("agent-affinity", Cluster(3), {"balance_abs_threshold": 2})
    assert r.route(_agent_req(0, "A"), 0.0) == 0
    assert r.route(_agent_req(1, "B"), 0.0) == 1  # the replica hosting the fewest agents
    assert r.route(_agent_req(2, "C"), 0.0) == 2
    got = [r.route(_agent_req(3 + i, "A"), 0.0) for i in range(3)]
    assert got == [0, 0, 0]  # loads 4/1/1: 4 - 1 > 2 at the next one
    assert r.route(_agent_req(9, "A"), 0.0) == 1  # A spills to replica 1, which joins its set
    assert r.homes["A"] == [0, 1]
    assert r.stats()["rebalances"] == 1


def test_workflow_aware_weighs_reload_against_wait() -> None:
    cost = CostModel(load_preset("a100-qwen32b"))
    prefix = 8000
    cluster = Cluster(2, kv_budget_tokens=18_692, prefix_tokens={"A": prefix}, cost=cost)
    r = make_router("workflow-aware", cluster)

    def req(i: int, own: int) -> Route:
        pieces = ((agent_key("A"), 0, prefix), (f"in{i}", 0, own))
        return Route(i, f"t{i}", "s", "A", "k", pieces, pieces, prefix + own)

    first = req(0, 500)
    assert r.route(first, 0.0) == 0
    r.release(first, 0, 1.0, 200)
    # replica 0 holds A's prefix: a reload elsewhere costs more than nothing waits here
    assert r.route(req(1, 500), 2.0) == 0
    # fill replica 0 far past its budget: the wait outweighs the 8,000-token reload
    for i in range(2, 8):
        r.route(req(i, 6000), 2.0)
    assert r.route(req(9, 500), 2.0) == 1
