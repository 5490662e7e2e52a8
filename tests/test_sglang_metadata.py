"""Task metadata on the wire and the plugin's server-side task tracker (no SGLang needed)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas_bench.runners.sglang.metadata import KEY, Limits, StageMeta, decode, encode
from topas_bench.runners.sglang.tracker import TrackedTask, Tracker, _topo
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.schedulers.base import StageState
from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.workloads.model import output_key
from topas_bench.workloads.registry import generate


def _task():  # type: ignore[no-untyped-def]
    w = generate("dag4", num_tasks=1, seed=0, prefix_tokens=30, input_tokens=5, output_tokens=4)
    return w.tasks[0]


def test_round_trip() -> None:
    task = _task()
    st = task.stages[3]
    cp = encode(task, st, 1234.5, 30)
    assert list(cp) == [KEY] and isinstance(cp[KEY], str)  # a flat JSON string (msgpack-safe)
    meta, why = decode(cp)
    assert why is None and meta is not None
    assert (meta.task_id, meta.stage_id, meta.agent, meta.prefix_tokens) == (task.id, "s3", "D", 30)
    assert meta.arrival_unix_s == 1234.5 and meta.segments == st.prompt
    assert [(s.id, s.deps) for s in meta.stages] == [(s.id, s.deps) for s in task.stages]


def test_dag_sends_no_upstream_output_length() -> None:
    """A stage's prompt size goes without its task's outputs (which a client does not know
    before they are made); the tracker shows each once its stage is done (issue 21)."""
    task = _task()
    meta, _ = decode(encode(task, task.stages[0], 0.0, 30))
    assert meta is not None
    by_id = {s.id: s for s in task.stages}
    for m in meta.stages:
        st = by_id[m.id]
        outs = {output_key(task.id, d): d for d in by_id}
        carried = [g for g in st.prompt if g.key in outs]
        assert m.outputs == tuple(outs[g.key] for g in carried)
        assert m.prompt_tokens == st.prompt_tokens - sum(g.tokens for g in carried)
    last = meta.stages[-1]
    assert last.outputs  # the joiner carries its branches' outputs
    tracked = TrackedTask(meta, 0.0)
    view = tracked.stages[last.id]
    assert view.prompt_tokens == last.prompt_tokens
    assert [sid for sid, _, _ in view.pending_outputs] == list(last.outputs)


@pytest.mark.parametrize(
    ("custom", "reason"),
    [
        (None, "missing"),
        ({}, "missing"),
        ([1, 2], "not an object"),
        ({KEY: "{"}, "JSONDecodeError"),
        ({KEY: json.dumps({"v": 2})}, "schema version"),
        ({KEY: json.dumps({"v": 1, "task": "t", "stage": "s9", "agent": "A", "arrival": 0,
                           "prefix": 1, "segments": [], "dag": []})}, "not in the task's DAG"),
        ({KEY: json.dumps({"v": 1, "task": "t", "stage": "a", "agent": "A", "arrival": -1,
                           "prefix": 1, "segments": [], "dag": [["a", "A", "", [], 1, 0]]})},
         "seconds >= 0"),
        ({KEY: json.dumps({"v": 1, "task": "t", "stage": "a", "agent": "A", "arrival": 0,
                           "prefix": 1, "segments": [], "dag": [["a", "A", "", ["zz"], 1, 0]]})},
         "unknown stage"),
    ],
)  # fmt: skip
def test_malformed_metadata_is_a_reason_not_an_exception(custom: Any, reason: str) -> None:
    meta, why = decode(custom)
    assert meta is None and why is not None and reason in why


@dataclass
class FakeReq:
    rid: str
    origin_input_ids: list[int]
    sampling_params: Any
    output_ids: list[int] = field(default_factory=list)
    done: bool = False

    def finished(self) -> bool:
        return self.done


@dataclass
class Params:
    custom_params: Any
    max_new_tokens: int = 4
    ignore_eos: bool = True


def test_tracker_follows_the_dag() -> None:
    task = _task()
    now = [100.0]
    est = ServiceEstimator(CostModel(load_preset("a100-qwen32b")))
    tr = Tracker(est, clock=lambda: now[0], unix_clock=lambda: now[0] + 1000.0)

    def req(i: int) -> FakeReq:
        st = task.stages[i]
        ids = list(range(st.prompt_tokens))
        return FakeReq(f"r{i}", ids, Params(encode(task, st, 1090.0, 30)))

    a = req(0)
    tr.sync([a], [])
    t = tr.tasks[task.id]
    assert t.arrival_s == 90.0  # the client's clock, moved onto the server's
    states = {s.id: s.state for s in t.stages.values()}
    assert states == {"s0": StageState.WAITING, "s1": StageState.BLOCKED,
                      "s2": StageState.BLOCKED, "s3": StageState.BLOCKED}  # fmt: skip
    assert tr.agent_prefixes["A"] == tuple(range(30))
    now[0] = 101.0
    tr.sync([], [a])
    assert t.stages["s0"].state == StageState.RUNNING and tr.requests["r0"].admitted_s == 101.0
    tr.served(a, 1.0)  # a batch of 1 s it was in: attained service
    now[0] = 102.0
    tr.requeued(a)  # back in the queue: preempted (the adapter's `_add_request_to_queue`)
    ra = tr.requests["r0"]
    assert ra.preemptions == 1 and ra.queued_s == 102.0 and ra.service_s == 1.0
    assert t.attained_s == 1.0
    tr.sync([a], [])  # already known to be waiting: no second preemption
    assert ra.preemptions == 1
    tr.sync([], [a])
    a.output_ids.extend([1, 2, 3, 4])
    a.done = True
    now[0] = 104.0
    tr.sync([], [])
    assert t.stages["s0"].state == StageState.DONE
    assert t.stages["s1"].state == StageState.DELAYED and t.stages["s3"].state == StageState.BLOCKED
    assert est.version == 1  # the finished request taught the estimator
    for i in (1, 2, 3):
        r = req(i)
        tr.sync([r], [])
        r.output_ids.extend([1, 2, 3, 4])
        r.done = True
        tr.sync([], [])
    assert task.id not in tr.tasks and not tr.requests  # a finished task leaves


def test_tracker_serves_untagged_requests_as_tasks_of_their_own() -> None:
    est = ServiceEstimator(CostModel(load_preset("a100-qwen32b")))
    tr = Tracker(est, clock=lambda: 5.0, unix_clock=lambda: 5.0)
    bad = FakeReq("x", [1, 2, 3], Params({KEY: "garbage"}))
    long_prefix = _task()
    too_long = FakeReq("y", [1], Params(encode(long_prefix, long_prefix.stages[0], 1.0, 30)))
    tr.sync([bad, too_long], [])
    assert set(tr.tasks) == {"untagged/x", "untagged/y"}
    assert sum(tr.untagged.values()) == 2
    assert tr.untagged["malformed: prefix longer than the prompt"] == 1


# -- hostile metadata: a reason from a fixed set, never an exception (issue 13) ----------------
def _record(**over: Any) -> dict[str, Any]:
    rec = {"v": 1, "task": "t", "stage": "a", "agent": "A", "arrival": 0, "prefix": 1,
           "segments": [["agent:A", 1]], "dag": [["a", "A", "", [], 1, 0]]}  # fmt: skip
    return rec | over


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("[" * 200_000, "nested too deeply"),
        (json.dumps(_record(dag=[["a", "A", "", [[[[[[]]]]]], 1, 0]])), "dag deps"),
        ("9" * 5_000, "invalid JSON (ValueError)"),  # Python's int-digits limit, inside json
        (json.dumps(_record(prefix=True)), "prefix: expected a count"),
        (json.dumps(_record(dag=[["a", "A", "", [], 1, float("nan")]])).replace("NaN", "1e999"),
         "delay_s"),
        (json.dumps(_record(dag=[["a", "A", "", [], 1]])), "6- or 7-item list"),
        (json.dumps(_record(segments=[["k"]])), "[key, tokens] pair"),
        (json.dumps(_record(dag=[["a", "A", "", [], 1, 0], ["a", "A", "", [], 1, 0]])),
         "duplicate stage ids"),
        (json.dumps({"v": 1}), "dag: missing"),
    ],
)  # fmt: skip
def test_hostile_metadata_is_a_reason(raw: str, reason: str) -> None:
    meta, why = decode({KEY: raw})
    assert meta is None and why is not None and reason in why, why


def test_limits_reject_oversized_metadata_with_a_reason() -> None:
    limits = Limits(max_chars=10_000, max_stages=50, max_deps_per_stage=3, max_segments=4)
    dag = [[f"s{i}", "A", "", [], 1, 0] for i in range(51)]
    many_deps = [["a", "A", "", [], 1, 0], ["b", "A", "", ["a"] * 4, 1, 0]]
    cases = {
        "characters": {KEY: " " * 10_001},
        "stages": {KEY: json.dumps(_record(dag=dag, stage="s0"))},
        "deps": {KEY: json.dumps(_record(dag=many_deps))},
        "prompt segments": {KEY: json.dumps(_record(segments=[["k", 1]] * 5))},
    }
    for what, custom in cases.items():
        meta, why = decode(custom, limits)
        assert meta is None and why is not None and why.startswith("too large") and what in why
    assert decode({KEY: json.dumps(_record(dag=dag[:50], stage="s0"))}, limits)[0] is not None
    three = [many_deps[0], ["b", "A", "", ["a"] * 3, 1, 0]]
    assert decode({KEY: json.dumps(_record(dag=three))}, limits)[0] is not None


def test_reasons_never_carry_request_values() -> None:
    # The plugin logs each reason once: a client sending ever new values must not mint new
    # reasons (and so new log lines, new counter keys).
    reasons = {decode({KEY: json.dumps(_record(prefix=-i))})[1] for i in range(1, 50)}
    reasons |= {decode({KEY: json.dumps(_record(stage=f"nope{i}"))})[1] for i in range(50)}
    reasons |= {decode({KEY: "{" * i})[1] for i in range(1, 50)}
    assert len(reasons) == 3, reasons


def test_tracker_degrades_on_any_failure_and_counts_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from topas_bench.runners.sglang import tracker as tracker_mod

    est = ServiceEstimator(CostModel(load_preset("a100-qwen32b")))
    tr = Tracker(est, clock=lambda: 5.0, unix_clock=lambda: 5.0)
    deep = FakeReq("deep", [1, 2, 3], Params({KEY: "[" * 100_000}))
    task = _task()
    good = FakeReq("g", list(range(40)), Params(encode(task, task.stages[0], 1.0, 30)))

    real_topo = tracker_mod._topo

    def boom(stages: Any) -> Any:  # fails on the tagged task's DAG, not on a one-stage fallback
        if len(stages) > 1:
            raise RuntimeError("a bug while building the task")
        return real_topo(stages)

    tr.sync([deep], [])
    monkeypatch.setattr(tracker_mod, "_topo", boom)
    tr.sync([good], [])
    assert set(tr.tasks) == {"untagged/deep", "untagged/g"}
    assert tr.untagged == {
        "malformed: nested too deeply": 1,
        "internal: RuntimeError while tracking the request": 1,
    }
    monkeypatch.undo()
    again = FakeReq("g2", list(range(40)), Params(encode(task, task.stages[0], 1.0, 30)))
    tr.sync([again], [])
    assert task.id in tr.tasks  # the tracker is still whole afterwards


def _reference_topo(stages: list[StageMeta]) -> list[str]:
    """The tracker's former (quadratic) ordering: rounds of ready stages in declaration order,
    a cycle's stages (and what they block) at the end in declaration order."""
    done: set[str] = set()
    out: list[str] = []
    pending = list(stages)
    while pending:
        ready = [s for s in pending if all(d in done for d in s.deps)]
        if not ready:
            return out + [s.id for s in pending]
        for s in ready:
            out.append(s.id)
            done.add(s.id)
        pending = [s for s in pending if s.id not in done]
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 11), max_size=4), min_size=1, max_size=12))
def test_linear_topo_matches_the_reference_order(deps: list[list[int]]) -> None:
    # any graph over 12 ids: edges backwards (a DAG), forwards, self-loops (cycles), and ids
    # beyond the list (unknown stages)
    stages = [
        StageMeta(f"s{i}", "A", "", tuple(f"s{d}" for d in ds), 1, 0.0) for i, ds in enumerate(deps)
    ]
    order, children = _topo(stages)
    assert [stages[i].id for i in order] == _reference_topo(stages)
    for i, s in enumerate(stages):
        for d in s.deps:
            j = int(d[1:])
            if j < len(stages):
                assert i in children[j]


def test_done_is_counted_not_scanned() -> None:
    task = _task()
    meta, _ = decode(encode(task, task.stages[0], 1.0, 30))
    assert meta is not None
    t = TrackedTask(meta, 0.0)
    for sid in ("s0", "s1", "s2", "s3"):
        assert not t.done
        t.stage_done(sid)
    assert t.done
    t.set_state("s1", StageState.WAITING)  # a retried stage: not done any more
    assert not t.done
    t.set_state("s1", StageState.DONE)
    assert t.done


def test_a_large_decode_pauses_the_gc_and_always_restores_it() -> None:
    import gc

    from topas_bench.runners.sglang.metadata import GC_PAUSE_CHARS, gc_paused

    seen: list[bool] = []
    with gc_paused(True):
        seen.append(gc.isenabled())
    assert seen == [False] and gc.isenabled()
    with pytest.raises(RuntimeError), gc_paused(True):
        raise RuntimeError("a failure inside")
    assert gc.isenabled()
    gc.disable()  # already off (the host process's choice): left off
    try:
        with gc_paused(True):
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    big = {KEY: "[" + " " * GC_PAUSE_CHARS + "]"}  # large, and malformed
    assert decode(big)[0] is None and gc.isenabled()
