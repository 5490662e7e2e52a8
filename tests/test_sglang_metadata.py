"""Task metadata on the wire and the plugin's server-side task tracker (no SGLang needed)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from topas_bench.runners.sglang.metadata import KEY, decode, encode
from topas_bench.runners.sglang.tracker import Tracker
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.schedulers.base import StageState
from topas_bench.schedulers.estimator import ServiceEstimator
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
