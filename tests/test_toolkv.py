"""KV during tool waits: the engine's `Policy.context_action` (keep / offload with a timed
upload / drop), and the key rules of `tokencake` and `astraea` (docs/schedulers.md)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from test_engine import by_stage, call, seg, sim, workload
from test_schedulers import COST, FakeTask, FakeView, order, view
from topas_bench.runners.sim.engine import Simulator
from topas_bench.schedulers.astraea import Astraea
from topas_bench.schedulers.base import DROP, ContextAction, RequestView, StageState
from topas_bench.schedulers.fcfs import FCFS
from topas_bench.schedulers.registry import make_policy
from topas_bench.schedulers.tokencake import TokenCake, adapt_reserve, offload_worth
from topas_bench.schedulers.validate import InvalidParameter
from topas_bench.schedulers.view import EngineView, PrefixLocation, PrefixView
from topas_bench.workloads.model import Task, Workload, agent_key, output_key

CONTEXT = 599  # t1/s0's context in the tree: prompt 500 + all outputs but the last (99)


def tool_workload(delay_s: float = 3.0) -> Workload:
    """T1: agent A twice, the second call extending the first after a `delay_s` tool call;
    G decodes meanwhile; F's long call, arriving during the tool call, fits only if T1's
    context leaves the GPU (as `test_peers.continuum_workload`)."""
    a, f, g = seg(agent_key("A"), 300), seg(agent_key("F"), 300), seg(agent_key("G"), 100)
    first = (a, seg("t1/in0", 200))
    t1 = Task("t1", "wf", 0.0, (
        call("s0", "A", first, 100),
        call("s1", "A", (*first, seg(output_key("t1", "s0"), 100), seg("t1/in1", 50)), 10,
             deps=("s0",), delay_s=delay_s),
    ))  # fmt: skip
    t0 = Task("t0", "wf", 0.0, (call("s0", "G", (g, seg("t0/in", 100)), 400),))
    t2 = Task("t2", "wf", 1.0, (call("s0", "F", (f, seg("t2/in", 1700)), 50),))
    return workload({"A": 300, "F": 300, "G": 100}, t0, t1, t2)


class Scripted(FCFS):
    """FCFS with a given action for t1/s0's context; records the host tier's tokens when F's
    request is first decided on, and the link's last load."""

    def __init__(self, action: ContextAction) -> None:
        super().__init__()
        self.action = action
        self.sim: Simulator | None = None
        self.host_at_f: int | None = None

    def decide(self, view: EngineView) -> Any:
        if self.host_at_f is None and any(r.task_id == "t2" for r in view.waiting):
            assert self.sim is not None
            self.host_at_f = self.sim.cache.host_tokens
        return super().decide(view)

    def context_action(self, finished: RequestView, view: EngineView) -> ContextAction:
        return self.action if (finished.task_id, finished.stage_id) == ("t1", "s0") else DROP


def scripted(action: ContextAction, **cfg: Any) -> tuple[Scripted, dict[Any, Any], Simulator]:
    p = Scripted(action)
    s = sim(tool_workload(), p, kv_budget_tokens=3000, **cfg)
    p.sim = s
    return p, by_stage(s.run()), s


def test_keep_locks_the_context_on_the_gpu_until_the_next_call() -> None:
    _, dropped, _ = scripted(DROP)
    p, kept, _ = scripted(ContextAction(keep_s=10.0))
    assert dropped[("t1", "s1")]["cached_tokens"] < CONTEXT  # F's prefill evicted it
    assert kept[("t1", "s1")]["cached_tokens"] == CONTEXT
    assert p.host_at_f == 0
    assert kept[("t2", "s0")]["first_admitted_s"] > dropped[("t2", "s0")]["first_admitted_s"]


def test_offload_moves_the_context_to_host_and_uploads_it_before_the_tool_returns() -> None:
    host = {"host_tier_tokens": 5000}
    _, dropped, _ = scripted(DROP, **host)
    p, off, s = scripted(ContextAction(offload=True, upload_in_s=2.0), **host)
    assert p.host_at_f == 299  # the context's own part (below A's 300-token prefix) moved
    assert off[("t1", "s1")]["cached_tokens"] == CONTEXT
    # F is admitted without waiting for the context to be evicted by its own prefill
    assert off[("t2", "s0")]["first_admitted_s"] <= dropped[("t2", "s0")]["first_admitted_s"]
    finished = off[("t1", "s0")]["finish_s"]
    upload_end = s.prefetcher.link_free_s
    assert finished + 2.0 <= upload_end - COST.host_load_s(299) < finished + 3.0  # on time
    assert upload_end < off[("t1", "s1")]["ready_s"]  # loaded before the tool returned


def test_offload_without_an_upload_is_loaded_back_when_matched() -> None:
    p, off, s = scripted(ContextAction(offload=True), host_tier_tokens=5000)
    assert p.host_at_f == 299
    assert off[("t1", "s1")]["cached_tokens"] == CONTEXT  # a host hit: loaded at admission
    assert s.prefetcher.link_free_s == 0.0  # no prefetch ran


def test_offload_without_a_host_tier_is_a_drop() -> None:
    _, dropped, _ = scripted(DROP)
    _, off, _ = scripted(ContextAction(offload=True, upload_in_s=2.0))
    assert off == dropped


def test_context_action_is_validated() -> None:
    with pytest.raises(ValueError):
        ContextAction(keep_s=1.0, offload=True)
    with pytest.raises(ValueError):
        ContextAction(upload_in_s=1.0)
    with pytest.raises(ValueError):
        ContextAction(keep_s=-1.0)


def test_tool_times_are_observed_by_the_shared_estimator() -> None:
    s = sim(tool_workload(delay_s=3.0), FCFS(), kv_budget_tokens=3000)
    s.run()
    seen = s.estimator.tool_s("A", "")
    assert seen is not None and 3.0 <= seen < 3.2  # the delay, seen at an iteration boundary


# -- tokencake ----------------------------------------------------------------------------------
def test_tokencake_offloads_only_when_the_stall_exceeds_the_transfer_with_margin() -> None:
    assert offload_worth(1.0, 0.2)
    assert not offload_worth(0.5, 0.2)  # margin 0.3 < 2 x transfer
    assert not offload_worth(0.2, 0.2)  # no gain over the transfer
    assert not offload_worth(0.04, 0.0)  # margin below 0.05 s
    assert offload_worth(0.06, 0.0)


def test_tokencake_reserve_adapts_within_its_bounds() -> None:
    p = TokenCake()
    r = p.reserve_min
    assert r == 0.05
    for _ in range(10):
        r = adapt_reserve(r, 0.9, p)
    assert r == pytest.approx(0.30)
    r = adapt_reserve(r, 0.5, p)  # between the watermarks: unchanged
    assert r == pytest.approx(0.30)
    for _ in range(10):
        r = adapt_reserve(r, 0.1, p)
    assert r == pytest.approx(0.05)
    with pytest.raises(InvalidParameter):
        make_policy("tokencake", reserve_min=0.4, reserve_max=0.3)


@dataclass
class HostView(FakeView):
    """A fake view with a host tier and agent `a`'s prefix of 900 tokens."""

    def prefixes(self) -> Sequence[PrefixView]:
        return (PrefixView("a", 900, PrefixLocation.GPU, 0, False),)

    def absent_reload_s(self, agent: str) -> float:
        return COST.host_load_s(900)


def stalled(tool_s: float) -> tuple[RequestView, HostView]:
    t = FakeTask("t")
    done = t.add("s0", StageState.DONE, agent="a", rid=1, generated=200)
    t.add("s1", StageState.DELAYED, deps=("s0",), agent="a")
    v = HostView([], {"t": t}, host_capacity_tokens=10_000)
    v.estimator.observe_tool("a", "k", tool_s)
    assert done is not None
    return done, v


def test_tokencake_time_scheduler_offloads_a_long_stall_and_uploads_before_it_ends() -> None:
    done, v = stalled(5.0)
    act = TokenCake().context_action(done, v)
    transfer = COST.host_load_s(300)  # prompt 1000 + 200 generated, less the 900 prefix
    assert act.offload and act.upload_in_s == pytest.approx(5.0 - max(0.10, 1.25 * transfer))
    short, v2 = stalled(0.004)  # under 3 x the transfer: not worth it
    assert TokenCake().context_action(short, v2) == DROP
    assert TokenCake(offload=False).context_action(done, v) == DROP


def test_tokencake_orders_by_score_critical_path_first() -> None:
    t = FakeTask("t", arrival_s=0.0)
    t.add("a", StageState.DONE, rid=9)
    on = t.add("b", StageState.WAITING, deps=("a",), rid=1, queued_s=0.0)
    t.add("c", StageState.WAITING, deps=("a",), rid=2, queued_s=0.0)
    t.add("d", StageState.BLOCKED, deps=("b",))
    assert on is not None
    u = FakeTask("u", arrival_s=0.0)
    u.add("x", StageState.WAITING, rid=3, queued_s=0.0)
    v = view([u.stages["x"].request, t.stages["c"].request, on], [t, u], now_s=1.0)  # type: ignore[list-item]
    # b lies on the longest path (a-b-d) with a stage left; x starts a one-stage task
    assert order(TokenCake(), v)[0] == 1


# -- astraea ------------------------------------------------------------------------------------
def test_astraea_promotes_a_task_that_yields_to_a_tool_within_its_quota() -> None:
    p = Astraea(base_quota_tokens=2048)
    t = FakeTask("t")
    small = t.add("s0", StageState.DONE, rid=1, prompt_tokens=1000, generated=100)
    t.add("s1", StageState.DELAYED, deps=("s0",))
    assert small is not None
    p.level["t"] = 2
    assert p.feedback(small, t) == 1  # yielded within quota 2048 x 16: up one level
    t.stages["s1"].state = StageState.WAITING  # the next call already arrived: no yield
    assert p.feedback(small, t) == 1
    big = FakeTask("u")
    heavy = big.add("s0", StageState.DONE, rid=2, prompt_tokens=3000, generated=100)
    big.add("s1", StageState.DELAYED, deps=("s0",))
    assert heavy is not None
    assert p.feedback(heavy, big) == 1  # over level 0's quota: down, whatever the yield


def test_astraea_orders_by_level_then_highest_response_ratio() -> None:
    p = Astraea(aging_s=1e9)
    a, b, c = FakeTask("ta"), FakeTask("tb"), FakeTask("tc")
    # a: waited longer (ratio higher) than b; c: same wait as a but one level down
    ra = a.add("s0", StageState.WAITING, rid=1, queued_s=0.0, ready_s=0.0)
    rb = b.add("s0", StageState.WAITING, rid=2, queued_s=8.0, ready_s=8.0)
    rc = c.add("s0", StageState.WAITING, rid=3, queued_s=0.0, ready_s=0.0)
    assert ra is not None and rb is not None and rc is not None
    p.level["tc"] = 1
    v = view([rb, rc, ra], [a, b, c], now_s=10.0)
    assert order(p, v) == [1, 2, 3]
    p.level["tc"] = 0  # same level: HRRN puts c (equal to a) before b
    assert order(p, v) == [1, 3, 2]


def test_astraea_waiting_counts_the_whole_task() -> None:
    p = Astraea()
    a, b = FakeTask("ta"), FakeTask("tb")
    a.add("s0", StageState.DONE, rid=1, ready_s=0.0, admitted_s=20.0)  # waited 20 s before
    ra = a.add("s1", StageState.WAITING, deps=("s0",), rid=2, queued_s=29.0, ready_s=29.0)
    rb = b.add("s0", StageState.WAITING, rid=3, queued_s=25.0, ready_s=25.0)
    assert ra is not None and rb is not None
    assert order(p, view([rb, ra], [a, b], now_s=30.0)) == [2, 3]


def test_astraea_oracle_differs_only_by_the_oracle_estimator() -> None:
    plain, oracle = make_policy("astraea"), make_policy("astraea-oracle")
    assert type(oracle).__mro__[1] is Astraea and oracle.params == plain.params
    assert oracle.oracle_lengths and not plain.oracle_lengths
    w = tool_workload()
    assert sim(w, oracle).estimator.oracle and not sim(w, plain).estimator.oracle
