"""The peers the paper left out: each one's defining behaviour, pinned (docs/schedulers.md).

Exactness against SGLang's own code is `test_sglang_lockstep.py`'s job (every scheduler here
runs there, natively or through the plugin); these tests pin what makes each scheduler what it
is, in the simulator, so that losing it fails a test: KVFlow keeps the prefix of the agent due
next and prefetches it from the host, Continuum keeps a context until its TTL expires, k-LPM
interleaves the oldest request with the best matches, and SGLang's eviction and queue policies
order things as SGLang does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from test_engine import by_stage, call, run, seg, sim, workload
from test_schedulers import FakeTask, FakeView, order, req, view
from topas_bench.runners.sim.calc_priority import QueuePass, dfs_weight_order
from topas_bench.runners.sim.pins import set_prefix_priorities
from topas_bench.runners.sim.radix import RadixCache
from topas_bench.schedulers.base import RequestView, StageState
from topas_bench.schedulers.continuum import Continuum, next_turn
from topas_bench.schedulers.kvflow import BASE_PRIORITY, KVFlow, steps_to_execution
from topas_bench.schedulers.registry import make_policy
from topas_bench.schedulers.view import EngineView, PrefixLocation, PrefixView
from topas_bench.workloads.model import Task, agent_key, output_key
from topas_bench.workloads.pieces import pieces


def keys(cache: RadixCache, *names: str) -> dict[str, int]:
    """GPU tokens of each single-segment key (`name`, 100 tokens) in `cache`."""
    return {n: cache.probe(pieces([seg(n, 100)]))[0] for n in names}


# -- SGLang's eviction policies ----------------------------------------------------------------
def test_slru_keeps_what_was_hit_twice_where_lru_keeps_the_newest() -> None:
    """`slru`: a node two requests inserted (hit twice) outlives a newer node hit once."""
    out = {}
    for policy in ("lru", "slru"):
        cache = RadixCache(eviction=policy)
        cache.insert(pieces([seg("old", 100)]), 0, 0)
        cache.insert(pieces([seg("old", 100)]), 0, 0)  # a second request: protected under slru
        cache.insert(pieces([seg("new", 100)]), 0, 0)
        cache.evict(100)
        out[policy] = keys(cache, "old", "new")
    assert out["lru"] == {"old": 0, "new": 100}
    assert out["slru"] == {"old": 100, "new": 0}


def test_lfu_evicts_the_least_hit_first() -> None:
    cache = RadixCache(eviction="lfu")
    for n, hits in (("a", 3), ("b", 1), ("c", 2)):
        for _ in range(hits):
            cache.insert(pieces([seg(n, 100)]), 0, 0)
    cache.evict(100)
    assert keys(cache, "a", "b", "c") == {"a": 100, "b": 0, "c": 100}
    cache.evict(100)
    assert keys(cache, "a", "b", "c") == {"a": 100, "b": 0, "c": 0}


def test_priority_eviction_retains_a_finished_prompt_over_newer_outputs() -> None:
    """`priority` with SGLang's prompt retention: a finished request's output (0) goes, then
    anything else at 0, before its prompt (re-inserted at 1), whatever the recency."""
    finished = [seg("prompt", 100), seg("output", 100)]
    out = {}
    for policy in ("lru", "priority"):
        cache = RadixCache(eviction=policy)
        cache.insert(pieces(finished), 0, 0)
        cache.insert(pieces(finished[:1]), 1)  # `checkpoint_into_tree`'s prompt re-insert
        cache.insert(pieces([seg("newer", 100)]), 0, 0)
        cache.evict(200)
        out[policy] = keys(cache, "prompt", "newer")
    assert out["lru"] == {"prompt": 0, "newer": 100}
    assert out["priority"] == {"prompt": 100, "newer": 0}


def test_the_simulator_reinserts_a_finished_prompt_at_priority_one() -> None:
    w = workload({"a": 50}, Task("t", "wf", 0.0, (call("s", "a", (seg(agent_key("a"), 50),
                                                              seg("in", 50)), 20),)))  # fmt: skip
    s = sim(w, make_policy("lpm-priority"))
    s.run()
    prompt = s.cache.device_path(pieces([seg(agent_key("a"), 50), seg("in", 50)]))
    output = s.cache.device_path(
        pieces([seg(agent_key("a"), 50), seg("in", 50), seg(output_key("t", "s"), 19)])
    )
    assert [n.priority for n in prompt] == [1] and [n.priority for n in output[1:]] == [0]


# -- SGLang's queue policies ---------------------------------------------------------------------
@dataclass
class Waiting:
    """What `QueuePass` reads of a waiting request."""

    rid: int
    max_new_tokens: int = 100
    prompt_tokens: int = 100
    generated: int = 0
    arrival_processed_tokens: int = 0
    enqueue_seq: int = 0
    prefix_len: int = 0
    task_id: str = "t"
    stage_id: str = "s"
    prompt: tuple[Any, ...] = field(default_factory=tuple)

    @property
    def fill_tokens(self) -> int:
        return self.prompt_tokens + self.generated


def test_lof_serves_the_longest_max_new_tokens_first_stably() -> None:
    q = [Waiting(1, 10), Waiting(2, 500), Waiting(3, 10), Waiting(4, 90)]
    out = QueuePass("lof", "lru").run(q, RadixCache(), lambda r: (0, None), 0)  # type: ignore[arg-type,return-value]
    assert [r.rid for r in out] == [2, 4, 1, 3]


def test_random_is_a_seeded_shuffle() -> None:
    q = [Waiting(i) for i in range(12)]

    def shuffle(seed: int) -> list[int]:
        out = QueuePass("random", "lru", seed).run(q, RadixCache(), lambda r: (0, None), 0)  # type: ignore[arg-type,return-value]
        return [r.rid for r in out]

    assert shuffle(0) == shuffle(0) and sorted(shuffle(0)) == list(range(12))
    assert shuffle(0) != shuffle(1) and shuffle(0) != list(range(12))


def test_hrrn_serves_the_highest_response_ratio_first() -> None:
    """Prefill tokens processed since a request queued, per uncached input token: of two that
    queued together the short one goes first; a long one that has waited long enough
    overtakes a short newcomer; cached tokens do not count as work."""
    qp = QueuePass("hrrn", "lru")
    long_ = Waiting(1, prompt_tokens=1000, arrival_processed_tokens=9_000, stage_id="a")
    short = Waiting(2, prompt_tokens=100, arrival_processed_tokens=9_000, stage_id="b")
    qp.matched = {1: 0, 2: 0}
    assert qp._hrrn_key(short, 10_000) < qp._hrrn_key(long_, 10_000)  # type: ignore[arg-type]
    long_.arrival_processed_tokens = 0
    short.arrival_processed_tokens = 9_900
    assert qp._hrrn_key(long_, 10_000) < qp._hrrn_key(short, 10_000)  # type: ignore[arg-type]
    qp.matched = {1: 990, 2: 0}  # 10 uncached tokens left
    long_.arrival_processed_tokens = 9_900
    assert qp._hrrn_key(long_, 10_000) < qp._hrrn_key(short, 10_000)  # type: ignore[arg-type]


def test_dfs_weight_serves_the_busiest_subtree_first() -> None:
    cache = RadixCache()
    a, _ = cache.insert(pieces([seg("A", 100)]), 0, 0)
    b, _ = cache.insert(pieces([seg("B", 100)]), 0, 0)  # a later child of the root
    q = [Waiting(1), Waiting(2), Waiting(3), Waiting(4)]
    nodes = {1: a, 2: b, 3: b, 4: cache.root}  # request 1 under A, 2 and 3 under B
    order_ = dfs_weight_order(cache.root, q, nodes)  # type: ignore[arg-type]
    assert [r.rid for r in order_] == [2, 3, 1, 4]


def test_shortest_prefill_first_cuts_the_chunk_for_shorter_requests() -> None:
    qp = QueuePass("shortest-prefill-first", "lru")
    chunked = Waiting(0, prompt_tokens=5000, prefix_len=1000)
    short = [Waiting(1, prompt_tokens=300), Waiting(2, prompt_tokens=200)]
    qp.matched = {1: 0, 2: 0}
    assert qp.chunk_limit(chunked, short, 4096) == 4096 - 500  # type: ignore[arg-type]
    assert QueuePass("fcfs", "lru").chunk_limit(chunked, short, 4096) is None  # type: ignore[arg-type]


def test_routing_key_groups_the_agents_already_running() -> None:
    waiting = [req(1, agent="x"), req(2, agent="y"), req(3, agent="z"), req(4, agent="y")]
    running = [req(5, agent="y"), req(6, agent="y"), req(7, agent="z")]
    assert order(make_policy("routing-key"), view(waiting, running=running)) == [2, 4, 3, 1]
    assert order(make_policy("routing-key"), view(waiting)) == [1, 2, 3, 4]


# -- lpm-aging (k-LPM) ---------------------------------------------------------------------------
def test_k_lpm_interleaves_the_oldest_with_the_best_matches() -> None:
    waiting = [req(1, 0.0), req(2, 1.0), req(3, 2.0), req(4, 3.0)]
    hits = {1: 0, 2: 100, 3: 120, 4: 140}  # of 150-token prompts
    v = view(waiting, hits=hits)
    assert order(make_policy("lpm-aging", k=2), v) == [1, 4, 2, 3]
    assert order(make_policy("lpm-aging", k=1), v) == [1, 2, 3, 4]  # FCFS
    assert order(make_policy("lpm-aging", k=100), v) == [1, 4, 3, 2]  # the oldest, then LPM
    assert order(make_policy("lpm"), v) == [4, 3, 2, 1]  # the cold request last


def test_lpm_aging_lets_a_cold_request_grow_past_fresh_hot_ones() -> None:
    """SGLang PR #31723's term: N tokens of credit per pass waited."""
    policy = make_policy("lpm-aging", k=100, aging_tokens_per_pass=100)
    # the oldest takes the FCFS slot each pass; distinct agents: no in-batch demotion
    oldest = req(0, 0.0, ("agent:o", 100), ("t0/in", 50))
    cold = req(1, 0.5, ("agent:c", 100), ("t1/in", 50))
    for _ in range(2):
        order(policy, view([oldest, cold], hits={0: 0, 1: 0}))
    hot = req(5, 2.0)
    hits = {0: 0, 1: 0, 5: 140}
    assert order(policy, view([oldest, hot, cold], hits=hits)) == [0, 1, 5]  # 300 > 100 + 140
    fresh = make_policy("lpm-aging", k=100, aging_tokens_per_pass=100)
    assert order(fresh, view([oldest, hot, cold], hits=hits)) == [0, 5, 1]


# -- kvflow ----------------------------------------------------------------------------------------
def test_steps_to_execution_over_a_dag() -> None:
    t = FakeTask("t")
    t.add("a", StageState.DONE, agent="A")
    t.add("b", StageState.RUNNING, deps=("a",), agent="B")
    t.add("c", StageState.DELAYED, deps=("a",), agent="C")
    t.add("d", StageState.BLOCKED, deps=("b", "c"), agent="D")
    t.add("e", StageState.BLOCKED, deps=("d",), agent="B")
    assert steps_to_execution(t) == {"B": 0, "C": 1, "D": 2}  # B's nearest stage runs now


@dataclass
class PrefixFakeView(FakeView):
    agents: dict[str, PrefixLocation] = field(default_factory=dict)

    def prefixes(self) -> list[PrefixView]:
        return [PrefixView(a, 100, w, 0, False) for a, w in self.agents.items()]


def test_kvflow_classes_agents_by_steps_and_prefetches_the_next_ones() -> None:
    t = FakeTask("t")
    t.add("a", StageState.WAITING, agent="A", rid=1)
    t.add("b", StageState.BLOCKED, deps=("a",), agent="B")
    t.add("c", StageState.BLOCKED, deps=("b",), agent="C")
    t.add("d", StageState.BLOCKED, deps=("c",), agent="D")
    t.add("e", StageState.BLOCKED, deps=("d",), agent="E")
    loc = {a: PrefixLocation.HOST for a in "ABCDEF"}
    v = PrefixFakeView([], {"t": t}, agents=loc, host_capacity_tokens=10_000)
    d = KVFlow().decide(v)
    assert d.prefix_priority is not None
    top = BASE_PRIORITY + 3
    assert d.prefix_priority == {"A": top, "B": top - 1, "C": top - 2, "D": top - 3,
                                 "E": top - 3, "F": BASE_PRIORITY}  # fmt: skip
    assert list(d.prefetch) == ["A", "B", "C"]  # within two steps, soonest first
    no_host = PrefixFakeView([], {"t": t}, agents=loc)
    assert list(KVFlow().decide(no_host).prefetch) == []


def test_prefix_priorities_order_eviction_against_recency() -> None:
    cache = RadixCache(eviction="priority")
    cache.insert(pieces([seg(agent_key("due"), 100)]), 1)  # older, its agent runs next
    cache.insert(pieces([seg(agent_key("idle"), 100)]), 1)
    set_prefix_priorities(cache, {"due": 5, "idle": 2}, {"due": 100, "idle": 100})
    cache.evict(100)
    left = {a: cache.probe(pieces([seg(agent_key(a), 100)]))[0] for a in ("due", "idle")}
    assert left == {"due": 100, "idle": 0}


def kvflow_workload() -> Any:
    """T1: Y, then X, then (after a long tool call) Y again; T2 (agent Z) arrives while T1 waits
    for its tool and needs memory: one agent prefix has to go. X has nothing left to run; Y
    runs next, but its prefix is older than X's."""
    y, x, z = (seg(agent_key(a), 800) for a in "YXZ")
    t1 = Task("t1", "wf", 0.0, (
        call("s0", "Y", (y, seg("t1/in0", 100)), 10),
        call("s1", "X", (x, seg("t1/in1", 100)), 10, deps=("s0",)),
        call("s2", "Y", (y, seg("t1/in2", 100)), 10, deps=("s1",), delay_s=30.0),
    ))  # fmt: skip
    t2 = Task("t2", "wf", 5.0, (call("s0", "Z", (z, seg("t2/in", 1200)), 10),))
    return workload({"Y": 800, "X": 800, "Z": 800}, t1, t2)


def test_kvflow_keeps_the_prefix_of_the_agent_due_next() -> None:
    w = kvflow_workload()
    lru = by_stage(run(w, make_policy("fcfs"), kv_budget_tokens=3000))
    kvflow = by_stage(run(w, make_policy("kvflow"), kv_budget_tokens=3000))
    assert lru[("t1", "s2")]["cached_tokens"] < 800  # LRU evicted Y's older prefix
    assert kvflow[("t1", "s2")]["cached_tokens"] == 800


def prefetch(s: Any, agents: list[str]) -> None:
    s.prefetcher.run(agents, s.prefix_tokens, s.now, lambda: s.free_tokens, s._evict_for)


def test_kvflow_prefetch_loads_a_host_prefix_in_the_background() -> None:
    s = sim(kvflow_workload(), make_policy("kvflow"), kv_budget_tokens=3000,
            host_tier_tokens=10_000)  # fmt: skip
    key = pieces([seg(agent_key("Y"), 800)])
    s.cache.insert(key, 1)
    s.cache.evict(800)  # to the host tier
    assert s.cache.probe(key) == (0, 800)
    s.now = 1.0
    prefetch(s, ["Y"])
    assert s.cache.probe(key) == (800, 0)
    load = s.cost.host_load_s(800)
    assert s.prefetcher.link_free_s == pytest.approx(1.0 + load)
    assert all(n.ready_s == s.prefetcher.link_free_s for n in s.cache.device_path(key))
    last = s.cache.device_path(key)[-1]
    assert s.prefetcher.stall([last], 1.0) == pytest.approx(load)  # a prefill waits for it
    assert s.prefetcher.stall([last], 2.0 + load) == 0.0
    s.cache.lock(s.cache.device_path(key)[-1])
    x = pieces([seg(agent_key("X"), 100)])
    s.cache.insert(x, 1)
    s.cache.evict(100)  # X to the host; nothing else is evictable
    filler = pieces([seg("filler", 2150)])
    s.cache.insert(filler, 0)
    s.cache.lock(s.cache.device_path(filler)[-1])
    assert s.free_tokens == 50 and s.cache.evictable_tokens == 0
    prefetch(s, ["X"])  # 100 tokens do not fit: it stops
    assert s.cache.probe(x) == (0, 100)


# -- continuum -------------------------------------------------------------------------------------
def continuum_workload() -> Any:
    """T1: agent A twice, the second call extending the first (append-only memory) after a
    3 s tool call. G decodes meanwhile (the server stays busy), and F's long call, arriving
    during the tool call, fits only if T1's context is evicted."""
    a, f, g = seg(agent_key("A"), 300), seg(agent_key("F"), 300), seg(agent_key("G"), 100)
    first = (a, seg("t1/in0", 200))
    t1 = Task("t1", "wf", 0.0, (
        call("s0", "A", first, 100),
        call("s1", "A", (*first, seg(output_key("t1", "s0"), 100), seg("t1/in1", 50)), 10,
             deps=("s0",), delay_s=3.0),
    ))  # fmt: skip
    t0 = Task("t0", "wf", 0.0, (call("s0", "G", (g, seg("t0/in", 100)), 400),))
    t2 = Task("t2", "wf", 1.0, (call("s0", "F", (f, seg("t2/in", 1700)), 50),))
    return workload({"A": 300, "F": 300, "G": 100}, t0, t1, t2)


class FixedTTL(Continuum):
    """Continuum's engine seam with a given TTL."""

    def __init__(self, ttl_s: float) -> None:
        super().__init__()
        self.ttl_s = ttl_s

    def context_ttl(self, finished: RequestView, view: EngineView) -> float:
        return self.ttl_s if finished.stage_id == "s0" else 0.0


def test_continuum_keeps_the_context_for_the_next_turn() -> None:
    w = continuum_workload()
    parrot = by_stage(run(w, make_policy("parrot"), kv_budget_tokens=3000))
    cont = by_stage(run(w, make_policy("continuum", memory_price=0.001), kv_budget_tokens=3000))
    assert parrot[("t1", "s1")]["cached_tokens"] < 599  # F's prefill evicted the context
    assert cont[("t1", "s1")]["cached_tokens"] == 599  # prompt + all outputs but the last
    assert cont[("t2", "s0")]["first_admitted_s"] > parrot[("t2", "s0")]["first_admitted_s"]


def test_a_kept_context_expires_on_its_own() -> None:
    w = continuum_workload()
    kept = by_stage(run(w, FixedTTL(10.0), kv_budget_tokens=3000))
    expired = by_stage(run(w, FixedTTL(0.5), kv_budget_tokens=3000))
    assert kept[("t1", "s1")]["cached_tokens"] == 599
    assert expired[("t1", "s1")]["cached_tokens"] < 599


def test_continuum_ttl_weighs_reload_cost_against_the_expected_wait() -> None:
    t = FakeTask("t")
    done = t.add("a", StageState.DONE, agent="A", rid=1, generated=100)
    t.add("b", StageState.BLOCKED, deps=("a",), agent="B")
    t.add("c", StageState.BLOCKED, deps=("b",), agent="A")
    assert next_turn(t, "a", "A") == "c"
    assert next_turn(t, "b", "B") is None and next_turn(t, "c", "A") is None
    v = FakeView([], {"t": t})
    assert done is not None
    cheap = Continuum(memory_price=0.001).context_ttl(done, v)
    dear = Continuum(memory_price=1.0).context_ttl(done, v)
    assert cheap > 0 and dear == 0.0
    est = v.estimator
    mu = est.stage_service_s("t", t.stages["b"])
    tokens = done.prompt_tokens + done.generated
    c = 0.001 * tokens / v.kv_budget_tokens
    assert cheap == pytest.approx(mu * math.log(est.prefill_s(tokens) / (c * mu)))
    assert Continuum(memory_price=0.0).context_ttl(done, v) == math.inf
    alone = FakeTask("u")
    last = alone.add("a", StageState.DONE, agent="A", rid=2)
    assert last is not None
    assert Continuum(memory_price=0.0).context_ttl(last, FakeView([], {"u": alone})) == 0.0


def test_continuum_admits_program_level_fcfs() -> None:
    t1, t2 = FakeTask("t1", arrival_s=0.0), FakeTask("t2", arrival_s=5.0)
    late = t1.add("b", StageState.WAITING, rid=1, queued_s=9.0)
    early = t2.add("a", StageState.WAITING, rid=2, queued_s=6.0)
    assert late is not None and early is not None
    assert order(make_policy("continuum"), view([early, late], [t1, t2])) == [1, 2]


def test_sglang_stock_schedulers_take_an_eviction_policy() -> None:
    p = make_policy("hrrn", eviction="slru", slru_protected_threshold=3)
    assert (p.needs.eviction, p.needs.eviction_config_dict) == (
        "slru", {"protected_threshold": 3},
    )  # fmt: skip
    assert make_policy("lpm-slru").needs.eviction == "slru"
    assert make_policy("kvflow").needs.eviction == "priority"
    with pytest.raises(Exception, match="eviction must be one of"):
        make_policy("dfs-weight", eviction="tlru")
