"""Issue 32's peers, each one's key rule pinned (docs/schedulers.md): `cachesage` evicts the
prefix of the agent its learned chain expects next after a more recent one it does not (and,
with `score=hits-decay`, the prefix of the agent called often and lately last); `sglang-ttl`
keeps a finished context until its TTL expires, and a hit on it restarts the TTL."""

from __future__ import annotations

from typing import Any

import pytest

from test_engine import by_stage, call, run, seg, workload
from test_schedulers import req, view
from topas_bench.errors import TopasError
from topas_bench.runners.sim.pins import set_prefix_priorities
from topas_bench.runners.sim.radix import RadixCache
from topas_bench.schedulers.base import sim_only_error
from topas_bench.schedulers.cachesage import BASE_PRIORITY, AgentChain, CacheSage
from topas_bench.schedulers.registry import (
    SCHEDULERS,
    capabilities,
    make_policy,
    refuse_sim_only,
)
from topas_bench.schedulers.sglang_ttl import SglangTTL
from topas_bench.schedulers.validate import InvalidParameter
from topas_bench.workloads.model import Task, agent_key, output_key
from topas_bench.workloads.pieces import pieces


# -- cachesage ---------------------------------------------------------------------------------
def test_the_chain_learns_transitions_and_survival_within_the_horizon() -> None:
    chain = AgentChain()
    for a in "ABABAAC":  # the repeated A is one touch, not a transition
        chain.touch(a)
    assert chain.counts == {"A": {"B": 2, "C": 1}, "B": {"A": 2}}
    assert chain.survival(1) == dict.fromkeys("ABC", 0.0)  # nothing seen to follow C
    chain.touch("A")  # C -> A
    one = chain.survival(1)
    assert one == pytest.approx({"A": 0.0, "B": 2 / 3, "C": 1 / 3})
    two = chain.survival(2)  # A comes back through B or C
    assert two == pytest.approx({"A": 1.0, "B": 2 / 3, "C": 1 / 3})


def agent_req(rid: int, agent: str, t: float) -> Any:
    return req(rid, t, (agent_key(agent), 100), (f"t{rid}/in", 10), agent=agent)


def evicted_first(policy: CacheSage, stream: str) -> str:
    """Show `policy` one request per agent of `stream` (in order), apply its prefix
    priorities to a cache under `priority` eviction holding each agent's 100-token prefix
    (inserted in stream order: later agents are more recent), evict 100 tokens, and return
    the agent whose prefix went."""
    waiting = [agent_req(i, a, float(i)) for i, a in enumerate(stream)]
    decision = policy.decide(view(waiting))
    cache = RadixCache(eviction="priority")
    agents = sorted(set(stream))
    for a in [a for a in dict.fromkeys(reversed(stream))][::-1]:  # last touch order
        cache.insert(pieces([seg(agent_key(a), 100)]), 1)
    assert decision.prefix_priority is not None
    set_prefix_priorities(cache, decision.prefix_priority, dict.fromkeys(agents, 100))
    cache.evict(100)
    gone = [a for a in agents if cache.probe(pieces([seg(agent_key(a), 100)]))[0] == 0]
    assert len(gone) == 1
    return gone[0]


def test_cachesage_keeps_the_agent_expected_next_over_a_more_recent_one() -> None:
    # Y always follows Z; X follows Y. The last touch is Z, so Y is due next; X is more recent
    # than Y but not expected within 1 step: X goes, where LRU would evict Y.
    stream = "ZYXZYXZYXZ"
    assert evicted_first(CacheSage(horizon=1), stream) == "X"
    lru = RadixCache(eviction="lru")
    for a in "YXZ":
        lru.insert(pieces([seg(agent_key(a), 100)]), 1)
    lru.evict(100)
    assert lru.probe(pieces([seg(agent_key("Y"), 100)]))[0] == 0  # LRU loses Y


def test_cachesage_prefix_priority_is_its_survival_class() -> None:
    policy = CacheSage()  # weight 4, horizon 3
    policy.decide(view([agent_req(i, a, float(i)) for i, a in enumerate("ZYXZYXZ")]))
    p = policy.chain.survival(3)
    assert p == pytest.approx({"X": 1.0, "Y": 1.0, "Z": 1.0})
    assert policy.priorities() == dict.fromkeys("XYZ", BASE_PRIORITY + 4)


def test_cachesage_hits_decay_keeps_the_agent_called_often_and_lately() -> None:
    # W is called five times, long ago; V once, just now; U often and lately: under
    # hits x exp(-decay x age) with decay 1, W's score decays to ~0 and goes first.
    stream = "WWWWWUUUUUV"
    policy = CacheSage(score="hits-decay", decay=1.0)
    assert evicted_first(policy, stream) == "W"
    scores = policy.chain.hits_decay(1.0)
    assert scores["U"] > scores["V"] > scores["W"]


def test_cachesage_counts_each_request_once_and_orders_no_queue() -> None:
    policy = CacheSage()
    waiting = [agent_req(2, "B", 1.0), agent_req(1, "A", 0.0)]
    first = policy.decide(view(waiting))
    assert [r.rid for r in first.admit] == [2, 1]  # the queue as it stands (FCFS)
    policy.decide(view(waiting))  # the same requests still waiting: no new touches
    assert policy.chain.step == 2 and policy.chain.counts == {"A": {"B": 1}}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"score": "lru"}, "score must be one of predictive, hits-decay"),
        ({"weight": -1}, "weight must be >= 0"),
        ({"horizon": 0}, "horizon must be an integer >= 1"),
        ({"decay": "x"}, "decay must be a finite number"),
    ],
)
def test_cachesage_rejects_bad_parameters(params: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidParameter, match=message):
        make_policy("cachesage", **params)


def test_cachesage_runs_end_to_end_and_sets_prefix_priorities() -> None:
    w = ttl_workload(3.0, 6.0)
    res = by_stage(run(w, make_policy("cachesage"), kv_budget_tokens=3000))
    assert len(res) == 5
    assert make_policy("cachesage").needs.eviction == "priority"


# -- sglang-ttl --------------------------------------------------------------------------------
def ttl_workload(hit_at: float, need_at: float) -> Any:
    """T1's first call (agent A) ends at 0.75 s and its task goes on (a later turn in 100 s):
    its context is kept. T3 arrives at `hit_at` with a prompt covering that context (a hit).
    G decodes until ~8.9 s, so the server never idles; F arrives at `need_at` and fits only if
    the kept context is evicted."""
    a, f, g = seg(agent_key("A"), 300), seg(agent_key("F"), 300), seg(agent_key("G"), 100)
    first = (a, seg("t1/in0", 200))
    ctx = (*first, seg(output_key("t1", "s0"), 100))
    t1 = Task("t1", "wf", 0.0, (
        call("s0", "A", first, 100),
        call("s1", "A", (*ctx, seg("t1/in1", 50)), 10, deps=("s0",), delay_s=100.0),
    ))  # fmt: skip
    t0 = Task("t0", "wf", 0.0, (call("s0", "G", (g, seg("t0/in", 100)), 1200),))
    t3 = Task("t3", "wf", hit_at, (call("s0", "A", (*ctx, seg("t3/in", 20)), 5),))
    t2 = Task("t2", "wf", need_at, (call("s0", "F", (f, seg("t2/in", 900)), 20),))
    return workload({"A": 300, "F": 300, "G": 100}, t0, t1, t2, t3)


def f_admitted(policy: Any, hit_at: float = 3.0) -> float:
    res = by_stage(run(ttl_workload(hit_at, 6.0), policy, kv_budget_tokens=3000))
    assert res[("t3", "s0")]["cached_tokens"] == 599  # the hit: prompt + outputs but the last
    return float(res[("t2", "s0")]["first_admitted_s"])


#: F admitted as it arrives (the first iteration boundary after 6 s)
ARRIVAL = pytest.approx(6.0, abs=0.01)


class NoRefresh(SglangTTL):
    refreshes_contexts = False


def test_sglang_ttl_keeps_a_context_until_its_ttl_expires() -> None:
    assert f_admitted(make_policy("fcfs")) == ARRIVAL  # nothing kept: F evicts the context
    assert f_admitted(NoRefresh(ttl_s=30.0)) > 8.0  # kept past 6 s: F waits for memory
    assert f_admitted(NoRefresh(ttl_s=3.0)) == ARRIVAL  # expired at 3.75 s


def test_sglang_ttl_a_hit_restarts_the_ttl() -> None:
    # TTL 5 s: the context expires at 5.75 s, before F arrives, unless T3's hit at 3 s
    # refreshed it to 8 s
    assert f_admitted(NoRefresh(ttl_s=5.0)) == ARRIVAL
    assert f_admitted(make_policy("sglang-ttl", ttl_s=5.0)) > 8.0
    # a hit after the context expired refreshes nothing
    assert f_admitted(make_policy("sglang-ttl", ttl_s=2.0), hit_at=3.0) == ARRIVAL


def test_sglang_ttl_is_sim_only_and_validates_its_ttl() -> None:
    with pytest.raises(TopasError, match="simulator mechanism"):
        refuse_sim_only(("fcfs", "sglang-ttl"), "the sglang-cpu reference")
    refuse_sim_only(("fcfs", "cachesage"), "the sglang-cpu reference")
    # the plugin's adapter asks the same check of its policy's class
    assert sim_only_error(SCHEDULERS.get("cachesage"), "cachesage", "the SGLang plugin") is None
    for name, words in (("sglang-ttl", "simulator mechanism"), ("astraea-oracle", "oracle")):
        error = sim_only_error(SCHEDULERS.get(name), name, "the SGLang plugin")
        assert error is not None and words in error and "the SGLang plugin" in error
    with pytest.raises(InvalidParameter, match="ttl_s must be >= 0"):
        make_policy("sglang-ttl", ttl_s=-1)
    assert capabilities("sglang-ttl") == capabilities("cachesage") == capabilities("fcfs")
