"""The SGLang adapter against SGLang 0.5.23's real classes on CPU (SchedulePolicy, PrefillAdder,
UnifiedRadixCache with real token-to-KV pools, Req, the plugin HookRegistry). The whole
scheduler, simulator against SGLang iteration by iteration, is `test_sglang_lockstep.py`.

SGLang lives in its own venv (`make sglang-env`, built by scripts/build_sglang_env.sh; the
fixture builds it on first use, ~5 min, then it is cached in .venvs/sglang). This file is both
the pytest module (main venv) and the script that venv runs: `python this_file` runs every
check in one process and prints one JSON line of results; each test asserts on its check.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

CHECKS: dict[str, Callable[[], Any]] = {}


def check(fn: Callable[[], Any]) -> Callable[[], Any]:
    CHECKS[fn.__name__] = fn
    return fn


# -- pytest side (main venv) -----------------------------------------------------------------
if __name__ != "__main__":  # the SGLang venv has no pytest
    import pytest

    from sglang_venv import script_results

    @pytest.fixture(scope="module")
    def results() -> dict[str, Any]:
        return script_results(__file__, timeout=900)

    @pytest.mark.slow
    @pytest.mark.parametrize(
        "name",
        [
            "ordering_applied",
            "admission_respects_sglang_budget",
            "admission_stops_at_policy_cut",
            "kept_prefix_survives_eviction",
            "pins_yield_on_an_idle_server",
            "malformed_custom_params",
            "request_logged",
            "retraction_order",
            "preemption_applied",
            "plugin_replaces_scheduler",
        ],
    )
    def test_adapter(results: dict[str, Any], name: str) -> None:
        assert name in results, f"check {name} did not run"
        res = results[name]
        assert res["ok"], res["error"]


# -- the SGLang venv side --------------------------------------------------------------------
def _setup() -> None:
    from sglang.srt.runtime_context import publish, reset_context
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    sa = ServerArgs(model_path="dummy", device="cpu", page_size=1)
    reset_context()
    publish(sa, role="tokenizer")
    set_global_server_args_for_scheduler(sa)


def _cache(kv_tokens: int) -> tuple[Any, Any]:
    """SGLang's live-server tree (UnifiedRadixCache, python core) over real, tiny KV pools."""
    import torch
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    rtp = ReqToTokenPool(size=64, max_context_len=8192, device="cpu", enable_memory_saver=False)
    kv = MHATokenToKVPool(
        size=kv_tokens, page_size=1, dtype=torch.float16, head_num=1, head_dim=8, layer_num=1,
        device="cpu", enable_memory_saver=False,
    )  # fmt: skip
    alloc = TokenToKVPoolAllocator(
        size=kv_tokens, dtype=torch.float16, device="cpu", kvcache=kv, need_sort=False
    )
    params = CacheInitParams(
        disable=False, req_to_token_pool=rtp, token_to_kv_pool_allocator=alloc, page_size=1,
        tree_components=(ComponentType.FULL,), eviction_policy="lru",
    )  # fmt: skip
    with envs.SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND.override("python"):
        return UnifiedRadixCache(params=params), alloc


def _bridge(policy: str, kv_tokens: int, now: float = 0.0, **params: Any) -> tuple[Any, Any, Any]:
    from topas_bench.runners.sglang.bridge import Bridge
    from topas_bench.runners.sim.cost import CostModel, load_preset
    from topas_bench.schedulers.estimator import ServiceEstimator
    from topas_bench.schedulers.registry import make_policy

    cache, alloc = _cache(kv_tokens)
    est = ServiceEstimator(CostModel(load_preset("a100-qwen32b")))
    bridge = Bridge(
        make_policy(policy, **params), cache, alloc, est, clock=lambda: now, unix_clock=lambda: now
    )
    return bridge, cache, alloc


def _agent_ids(agent: str, n: int) -> list[int]:
    base = 1000 + 1000 * (ord(agent[0]) - ord("A"))
    return list(range(base, base + n))


def _req(task: Any, stage: Any, prefix: int, custom: Any = "encode") -> Any:
    """A real SGLang Req for one stage: agent prefix ids, then ids unique to the task/stage."""
    import zlib
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    from topas_bench.runners.sglang.metadata import encode

    seed = zlib.crc32(f"{task.id}/{stage.id}".encode()) % 50_000
    ids = _agent_ids(stage.agent, prefix) + [
        100_000 + seed * 10 + i for i in range(stage.prompt_tokens - prefix)
    ]
    cp = encode(task, stage, task.arrival_s, prefix) if custom == "encode" else custom
    sp = SamplingParams(max_new_tokens=stage.max_new_tokens, ignore_eos=True, custom_params=cp)
    return Req(f"{task.id}/{stage.id}", "", array("q", ids), sp)


def _workload(sizes: list[tuple[str, int, int]], prefix: int = 200) -> Any:
    """One one-stage task per (agent, input tokens, output tokens), all arriving at t = 0."""
    from topas_bench.workloads.model import Agent, Segment, Stage, Task, Workload, agent_key

    agents = sorted({a for a, _, _ in sizes})
    tasks = []
    for i, (agent, inp, out) in enumerate(sizes):
        st = Stage(
            "s0", agent, (Segment(agent_key(agent), prefix), Segment(f"t{i}/in", inp)), out,
            kind="k", max_new_tokens=out,
        )  # fmt: skip
        tasks.append(Task(f"t{i}", "w", 0.0, (st,)))
    return Workload("diff", tuple(Agent(a, prefix) for a in agents), tuple(tasks))


def _admit_pass(bridge: Any, cache: Any, alloc: Any, waiting: list[Any], **kw: Any) -> Any:
    """SGLang's admission loop (`Scheduler._get_new_batch_prefill_raw`, 0.5.23) over our adder."""
    from sglang.srt.managers.schedule_policy import AddReqResult

    from topas_bench.runners.sglang.adapter import TopasPrefillAdder, TopasSchedulePolicy

    policy = TopasSchedulePolicy("fcfs", cache, False, False, False, bridge=bridge)
    policy.calc_priority(waiting, None, processed_tokens=0)
    adder = TopasPrefillAdder(
        1, cache, alloc, None, 0.7, kw.get("max_prefill", 16384), kw.get("chunk", 8192),
        bridge=bridge,
    )  # fmt: skip
    for req in waiting:
        req.init_next_round_input(cache)
        res = adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
        if res != AddReqResult.CONTINUE:
            break
    return adder


@check
def ordering_applied() -> None:
    # Parrot orders by task arrival: the queue (newest task first) must come out oldest first.
    from topas_bench.runners.sglang.adapter import TopasSchedulePolicy
    from topas_bench.workloads.model import Segment, Stage, Task

    bridge, cache, _ = _bridge("parrot", 4000, now=100.0)
    reqs = []
    for i, arrival in enumerate([30.0, 20.0, 10.0, 0.0]):
        st = Stage("s0", "A", (Segment("agent:A", 50), Segment(f"in{i}", 20)), 8, max_new_tokens=8)
        task = Task(f"t{i}", "w", arrival, (st,))
        reqs.append(_req(task, st, 50))
        bridge.on_new_request(reqs[-1])
    waiting = list(reqs)
    TopasSchedulePolicy("fcfs", cache, False, False, False, bridge=bridge).calc_priority(waiting)
    got = [r.rid for r in waiting]
    assert got == ["t3/s0", "t2/s0", "t1/s0", "t0/s0"], got


@check
def admission_respects_sglang_budget() -> None:
    # 1,000 KV tokens; each request needs 200 + 100 input + 100 output + 1 page = 401 tokens
    # (plus its prefix once cached): SGLang's PrefillBudget lets exactly two in.
    w = _workload([("A", 100, 100)] * 4)
    bridge, cache, alloc = _bridge("fcfs", 1000)
    waiting = [_req(t, t.stages[0], 200) for t in w.tasks]
    for r in waiting:
        bridge.on_new_request(r)
    adder = _admit_pass(bridge, cache, alloc, waiting)
    admitted = [r.rid for r in adder.can_run_list]
    assert admitted == ["t0/s0", "t1/s0"], admitted
    assert adder.rem_total_tokens > 0 and adder.rem_total_tokens < 401, adder.rem_total_tokens


@check
def admission_stops_at_policy_cut() -> None:
    # A policy that admits only the first request: SGLang's loop must stop after it even though
    # memory would allow more.
    from topas_bench.schedulers.base import Decision, Policy

    class OnlyFirst(Policy):
        name = "only-first"

        def decide(self, view: Any) -> Decision:
            return Decision(admit=sorted(view.waiting, key=lambda r: r.rid)[:1])

    w = _workload([("A", 10, 10)] * 3)
    bridge, cache, alloc = _bridge("fcfs", 4000)
    bridge.policy = OnlyFirst()
    waiting = [_req(t, t.stages[0], 200) for t in w.tasks]
    for r in waiting:
        bridge.on_new_request(r)
    adder = _admit_pass(bridge, cache, alloc, waiting)
    assert [r.rid for r in adder.can_run_list] == ["t0/s0"]
    assert bridge.tracker.requests["t0/s0"].admitted_s == 0.0


@check
def kept_prefix_survives_eviction() -> None:
    # Agents A and B have their prefixes cached, unlocked; TOPAS-style pin of A, then eviction
    # pressure for everything: B's prefix goes, A's stays whole.
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    bridge, cache, alloc = _bridge("fcfs", 2000)
    w = _workload([("A", 10, 10), ("B", 10, 10)], prefix=300)
    for t in w.tasks:
        bridge.on_new_request(_req(t, t.stages[0], 300))
    for agent in ("A", "B"):
        ids = _agent_ids(agent, 300)
        cache.insert(InsertParams(key=RadixKey(array("q", ids)), value=alloc.alloc(len(ids))))
    assert cache.evictable_size() == 600
    bridge.keep(frozenset({"A"}), [])
    assert set(bridge.pins) == {"A"} and cache.protected_size() == 300
    cache.evict(EvictParams(num_tokens=10_000))
    assert bridge.match(_agent_ids("A", 300)).device_prefix_len == 300
    assert bridge.match(_agent_ids("B", 300)).device_prefix_len == 0
    bridge.keep(frozenset(), [])  # no longer kept: evictable again
    assert cache.protected_size() == 0 and cache.evictable_size() == 300
    cache.evict(EvictParams(num_tokens=10_000))
    assert bridge.match(_agent_ids("A", 300)).device_prefix_len == 0


@check
def pins_yield_on_an_idle_server() -> None:
    # Two kept prefixes leave too little memory for a request of a third agent while nothing
    # runs: the adder drops the pins and admits it (the simulator's liveness rule).
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    bridge, cache, alloc = _bridge("fcfs", 1000)
    w = _workload([("A", 10, 10), ("B", 10, 10), ("C", 100, 100)], prefix=300)
    reqs = [_req(t, t.stages[0], 300) for t in w.tasks]
    for r in reqs:
        bridge.on_new_request(r)
    for agent in ("A", "B"):
        ids = _agent_ids(agent, 300)
        cache.insert(InsertParams(key=RadixKey(array("q", ids)), value=alloc.alloc(len(ids))))
    bridge.keep(frozenset({"A", "B"}), [])
    assert cache.protected_size() == 600
    adder = _admit_pass(bridge, cache, alloc, [reqs[2]])
    assert [r.rid for r in adder.can_run_list] == ["t2/s0"] and not bridge.pins


@check
def malformed_custom_params() -> None:
    # Each bad form: served as an independent task, counted, no exception; decide still works.
    from topas_bench.runners.sglang.adapter import TopasSchedulePolicy

    bridge, cache, _ = _bridge("topas", 4000)
    w = _workload([("A", 10, 10)] * 6)
    bad = [None, {"topas": "{not json"}, {"topas": json.dumps({"v": 99})}, {"other": 1},
           {"topas": json.dumps({"v": 1, "task": 3})}]  # fmt: skip
    waiting = [_req(t, t.stages[0], 200, custom=c) for t, c in zip(w.tasks, bad, strict=False)]
    waiting.append(_req(w.tasks[5], w.tasks[5].stages[0], 200))  # one good request
    for r in waiting:
        bridge.on_new_request(r)
    counts = bridge.tracker.untagged
    assert sum(counts.values()) == 5, counts
    assert counts["missing"] == 2, counts
    TopasSchedulePolicy("fcfs", cache, False, False, False, bridge=bridge).calc_priority(waiting)
    assert len(waiting) == 6
    tasks = bridge.tracker.tasks
    assert "t5" in tasks and sum(t.startswith("untagged/") for t in tasks) == 5


@check
def request_logged() -> None:
    # The server log names every tagged request (which replica served it, in a cluster), and
    # only those.
    import contextlib
    import io

    from topas_bench.runners.sglang.request_log import served

    bridge, _, _ = _bridge("fcfs", 4000)
    w = _workload([("A", 10, 10)] * 2)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        bridge.on_new_request(_req(w.tasks[0], w.tasks[0].stages[0], 200))
        bridge.on_new_request(_req(w.tasks[1], w.tasks[1].stages[0], 200, custom={"other": 1}))
    assert served(err.getvalue()) == {("t0", "s0")}, err.getvalue()


@check
def retraction_order() -> None:
    # SGLang pops the END of `_get_decode_retraction_order`; our default policy retracts the
    # fewest-output request first: it must be last in the returned indices.
    bridge, _, _ = _bridge("fcfs", 4000)
    w = _workload([("A", 10, 50), ("A", 40, 50), ("A", 20, 50)])
    reqs = [_req(t, t.stages[0], 200) for t in w.tasks]
    for r, n in zip(reqs, [5, 1, 3], strict=True):
        bridge.on_new_request(r)
        r.output_ids.extend([7] * n)
    order = bridge.retraction_indices(reqs)
    assert order == [0, 2, 1], order


@check
def preemption_applied() -> None:
    # The policy preempts a running request: the adder releases it the way SGLang's
    # `preempt_to_schedule` does (release_req, filter_batch, preempt_list, total_offset). A real
    # running ScheduleBatch needs a model runner, so the batch here records the calls.
    from topas_bench.runners.sglang.adapter import TopasPrefillAdder, make_scheduler_class
    from topas_bench.schedulers.base import Decision, Policy

    w = _workload([("A", 10, 50), ("A", 20, 50), ("A", 30, 50)])
    bridge, cache, alloc = _bridge("fcfs", 4000)
    run = [_req(t, t.stages[0], 200) for t in w.tasks[:2]]
    wait = [_req(w.tasks[2], w.tasks[2].stages[0], 200)]
    for r in [*run, *wait]:
        bridge.on_new_request(r)

    class PreemptFirst(Policy):
        name = "preempt-first"

        def decide(self, view: Any) -> Decision:
            return Decision(admit=list(view.waiting), preempt=[view.running[0]])

    class Batch:
        def __init__(self, reqs: list[Any]) -> None:
            self.reqs, self.released = list(reqs), []

        def release_req(self, idx: int, remaining: int) -> bool:
            self.released.append((self.reqs[idx].rid, remaining))
            return True

        def filter_batch(self, keep_indices: list[int]) -> None:
            self.reqs = [self.reqs[i] for i in keep_indices]

    bridge.policy = PreemptFirst()
    batch = Batch(run)
    bridge.decide(wait, batch.reqs)
    assert bridge.preempt_ids == {"t0/s0"}
    cls = make_scheduler_class(lambda: bridge.policy, lambda: None)
    sched = object.__new__(cls)  # the subclass's own methods, without a model runner
    sched.topas = bridge
    sched.new_token_ratio_tracker = type("T", (), {"current": 0.5})()
    factory = sched.get_prefill_adder_class()
    adder = factory(1, cache, alloc, batch, 0.5, 16384, 8192)
    assert isinstance(adder, TopasPrefillAdder) and bridge.new_token_ratio == 0.5
    assert batch.released == [("t0/s0", 1)] and [r.rid for r in batch.reqs] == ["t1/s0"]
    assert [r.rid for r in adder.preempt_list] == ["t0/s0"]
    # the offset of the released request is no longer held back: only t1's 50 tokens are
    assert adder.memory_budget.total_offset == 50
    bridge.tracker.sync([*wait, run[0]], batch.reqs)
    assert bridge.tracker.requests["t0/s0"].preemptions == 1  # back in the queue: counted


@check
def plugin_replaces_scheduler() -> None:
    # The installed entry point, loaded the way SGLang loads it in a scheduler process.
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="sglang.srt.plugins") if e.name == "topas"]
    assert ep.value == "topas_bench.runners.sglang.plugin:register", ep.value
    os.environ["TOPAS_SCHEDULER"] = "topas"
    os.environ["TOPAS_SCHEDULER_PARAMS"] = json.dumps({"beta": 0.2})
    from sglang.srt.managers import scheduler as sched_mod
    from sglang.srt.plugins import load_plugins

    original = sched_mod.Scheduler
    load_plugins()
    new = sched_mod.Scheduler
    assert new is not original and issubclass(new, original), new
    for name in ("init_schedule_policy", "_create_generation_req", "get_prefill_adder_class",
                 "update_running_batch"):  # fmt: skip
        assert name in new.__dict__, name


def main() -> None:
    _setup()
    out: dict[str, Any] = {}
    for name, fn in CHECKS.items():
        try:
            extra = fn()
            out[name] = {"ok": True, "error": None, **(extra or {})}
        except Exception:
            out[name] = {"ok": False, "error": traceback.format_exc()}
        print(f"# {name}: {'ok' if out[name]['ok'] else 'FAILED'}", file=sys.stderr)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
