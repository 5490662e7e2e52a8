"""Workload generators: shapes, lengths, determinism, arrivals, overrides."""

from __future__ import annotations

import math
from dataclasses import fields
from itertools import pairwise
from typing import Any

import pytest

from topas_bench.errors import TopasError
from topas_bench.workloads.metagpt import SopParams, TlParams
from topas_bench.workloads.model import Segment, Stage, Task, Workload, agent_key, output_key
from topas_bench.workloads.registry import WORKLOADS, generate
from topas_bench.workloads.synthetic import SyntheticParams

NAMES = ["chain3", "dag4", "dag10-wide", "metagpt-sop", "metagpt-tl"]


def _chain(n: int) -> dict[str, tuple[str, ...]]:
    return {f"s{i}": (f"s{i - 1}",) if i else () for i in range(n)}


WORKERS = tuple(f"s{i}" for i in range(1, 9))
DEPS: dict[str, dict[str, tuple[str, ...]]] = {
    "chain3": _chain(3),
    "dag4": {"s0": (), "s1": ("s0",), "s2": ("s0",), "s3": ("s1", "s2")},
    "dag10-wide": {"s0": (), **dict.fromkeys(WORKERS, ("s0",)), "s9": WORKERS},
    "metagpt-sop": _chain(5),
    "metagpt-tl": _chain(9),
}
AGENTS = {
    "chain3": ["A", "B", "C"],
    "dag4": ["A", "B", "C", "D"],
    "dag10-wide": ["P", *(f"W{i}" for i in range(1, 9)), "J"],
    "metagpt-sop": ["ProductManager", "Architect", "ProjectManager", "Engineer", "QaEngineer"],
    "metagpt-tl": [
        *("TeamLeader", "ProductManager", "TeamLeader", "Architect"),
        *("TeamLeader", "ProjectManager", "TeamLeader", "Engineer", "TeamLeader"),
    ],
}
PARAMS = {
    "chain3": SyntheticParams,
    "dag4": SyntheticParams,
    "dag10-wide": SyntheticParams,
    "metagpt-sop": SopParams,
    "metagpt-tl": TlParams,
}


def _ancestors(task: Task, stage: Stage) -> set[str]:
    seen: set[str] = set()
    todo = list(stage.deps)
    while todo:
        sid = todo.pop()
        if sid not in seen:
            seen.add(sid)
            todo.extend(task.stage(sid).deps)
    return seen


def _worst_case_overrides(name: str) -> dict[str, Any]:
    """Every sampled range pinned at its maximum: the largest request the defaults allow."""
    return {f.name: f.default[1] for f in fields(PARAMS[name]) if isinstance(f.default, tuple)}


def test_registered_names() -> None:
    assert set(NAMES) <= set(WORKLOADS.names())
    for name in NAMES:
        spec = WORKLOADS.get(name)
        assert spec.name == name and spec.default_rate_per_s > 0


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_per_seed(name: str) -> None:
    a = generate(name, num_tasks=20, seed=3)
    assert a == generate(name, num_tasks=20, seed=3)
    b = generate(name, num_tasks=20, seed=4)
    assert a.tasks != b.tasks


@pytest.mark.parametrize("name", NAMES)
def test_identity_and_params(name: str) -> None:
    w = generate(name, num_tasks=7, rate_per_s=0.5, seed=11)
    assert (w.name, w.seed, w.generator) == (name, 11, name)
    assert [t.id for t in w.tasks] == [f"t{i:04d}" for i in range(7)]
    assert all(t.workflow == name for t in w.tasks)
    assert w.params["num_tasks"] == 7 and w.params["rate_per_s"] == 0.5
    assert set(w.params) == {"num_tasks", "rate_per_s"} | {f.name for f in fields(PARAMS[name])}
    default = generate(name, num_tasks=1)
    assert default.params["rate_per_s"] == WORKLOADS.get(name).default_rate_per_s


@pytest.mark.parametrize("name", NAMES)
def test_poisson_arrivals(name: str) -> None:
    rate = 2.0
    w = generate(name, num_tasks=2000, rate_per_s=rate, seed=5)
    times = [t.arrival_s for t in w.tasks]
    assert times[0] > 0
    assert all(b >= a for a, b in pairwise(times))
    assert times[-1] / len(times) == pytest.approx(1 / rate, rel=0.10)


@pytest.mark.parametrize("name", NAMES)
def test_rate_rescales_arrivals_and_more_tasks_extend(name: str) -> None:
    slow = generate(name, num_tasks=10, rate_per_s=0.1, seed=2)
    fast = generate(name, num_tasks=10, rate_per_s=1.0, seed=2)
    for s, f in zip(slow.tasks, fast.tasks, strict=True):
        assert s.stages == f.stages
        assert s.arrival_s == pytest.approx(10 * f.arrival_s)
    more = generate(name, num_tasks=15, rate_per_s=0.1, seed=2)
    assert more.tasks[:10] == slow.tasks


@pytest.mark.parametrize("name", NAMES)
def test_shape(name: str) -> None:
    w = generate(name, num_tasks=5, seed=1)
    for task in w.tasks:
        assert {s.id: s.deps for s in task.stages} == DEPS[name]
        assert [s.id for s in task.stages] == list(DEPS[name])
        assert [s.agent for s in task.stages] == AGENTS[name]
    assert {a.name for a in w.agents} == set(AGENTS[name])
    assert len({a.name for a in w.agents}) == len(w.agents)


@pytest.mark.parametrize("name", NAMES)
def test_prompts(name: str) -> None:
    w = generate(name, num_tasks=50, seed=9)
    prefix = {a.name: a.prefix_tokens for a in w.agents}
    for task in w.tasks:
        for stage in task.stages:
            first = stage.prompt[0]
            assert (first.key, first.tokens) == (agent_key(stage.agent), prefix[stage.agent])
            assert stage.output_tokens > 0
            # the MetaGPT shapes send MetaGPT's cap by default, the synthetic ones exact lengths
            cap = 4096 if name.startswith("metagpt") else stage.output_tokens
            assert stage.max_new_tokens == cap
            assert stage.kind
            ancestors = _ancestors(task, stage)
            keys = [seg.key for seg in stage.prompt]
            assert len(keys) == len(set(keys))
            for seg in stage.prompt[1:]:
                assert seg.tokens > 0 and seg.key.startswith(f"{task.id}/")  # no cross-task keys
                if seg.key.endswith("/out"):
                    sid = seg.key.split("/")[1]
                    assert sid in ancestors
                    assert seg.key == output_key(task.id, sid)
                    assert seg.tokens == task.stage(sid).output_tokens
            if not stage.deps:
                assert f"{task.id}/input" in keys


def test_synthetic_lengths() -> None:
    w = generate("dag10-wide", num_tasks=1)
    joiner = w.tasks[0].stage("s9")
    assert [seg.tokens for seg in joiner.prompt] == [4096] + [256] * 8
    assert [seg.tokens for seg in w.tasks[0].stage("s0").prompt] == [4096, 256]
    assert all(s.output_tokens == 256 and s.delay_s == 0 for s in w.tasks[0].stages)
    assert w.tasks[0].stage("s1").kind == "worker"


@pytest.mark.parametrize("name", ["metagpt-sop", "metagpt-tl"])
def test_sampled_lengths_in_ranges(name: str) -> None:
    w = generate(name, num_tasks=200, seed=4)
    field_of = {
        "write_prd": "prd_tokens",
        "write_design": "design_tokens",
        "write_tasks": "tasks_tokens",
        "write_code": "code_tokens",
        "write_test": "test_tokens",
        "plan": "plan_tokens",
        "route": "route_tokens",
        "status": "status_tokens",
    }
    for task in w.tasks:
        lo, hi = w.params["requirement_tokens"]
        assert lo <= task.stage("s0").prompt[1].tokens <= hi
        for stage in task.stages:
            lo, hi = w.params[field_of[stage.kind]]
            assert lo <= stage.output_tokens <= hi
    assert len({t.stages for t in w.tasks}) == len(w.tasks)  # lengths really vary


def test_sop_prefixes_from_facts() -> None:
    w = generate("metagpt-sop", num_tasks=1)
    assert [a.prefix_tokens for a in w.agents] == [916, 721, 505, 375, 447]
    eng = w.tasks[0].stage("s3")
    assert [seg.key for seg in eng.prompt[1:]] == [output_key("t0000", s) for s in ("s1", "s2")]


def test_tl_calls_extend_previous_tl_call() -> None:
    w = generate("metagpt-tl", num_tasks=30, seed=6)
    assert [a.prefix_tokens for a in w.agents] == [3628, 4858, 1982, 1982, 9000]
    for task in w.tasks:
        tl = [s for s in task.stages if s.agent == "TeamLeader"]
        assert [s.id for s in tl] == ["s0", "s2", "s4", "s6", "s8"]
        for prev, cur in pairwise(tl):
            # memory = the previous TL call's memory + every output since, in order
            since = task.stages[int(prev.id[1:]) : int(cur.id[1:])]
            new = [Segment(output_key(task.id, s.id), s.output_tokens) for s in since]
            assert cur.prompt[:-1] == (*prev.prompt[:-1], *new)
        for stage in task.stages:  # the command prompt ends every call, keyed per call
            last = stage.prompt[-1]
            assert (last.key, last.tokens) == (f"{task.id}/{stage.id}/cmd", 368)
            if stage.agent != "TeamLeader":  # workers read the routing message first
                assert stage.prompt[1].key == output_key(task.id, stage.deps[0])


@pytest.mark.parametrize("name", NAMES)
def test_requests_fit_kv_budget(name: str) -> None:
    w = generate(name, num_tasks=300, seed=8)
    assert w.max_request_tokens < 18_000
    worst = generate(name, num_tasks=1, **_worst_case_overrides(name))
    assert worst.max_request_tokens < (17_000 if name == "metagpt-tl" else 18_000)


def test_overrides() -> None:
    w = generate("chain3", num_tasks=3, prefix_tokens=1000, output_tokens=64, delay_s=0.5)
    assert {a.prefix_tokens for a in w.agents} == {1000}
    assert all(s.prompt[0].tokens == 1000 for _, s in w.stages())
    assert all(
        s.output_tokens == 64 == s.max_new_tokens and s.delay_s == 0.5 for _, s in w.stages()
    )
    assert w.params["prefix_tokens"] == 1000
    sop = generate("metagpt-sop", num_tasks=5, code_tokens=[500, 500], test_tokens=700)
    assert {t.stage("s3").output_tokens for t in sop.tasks} == {500}
    assert {t.stage("s4").output_tokens for t in sop.tasks} == {700}
    assert sop.params["code_tokens"] == [500, 500]
    tl = generate("metagpt-tl", num_tasks=2, engineer_prefix_tokens=5000, command_tokens=100)
    assert tl.agent_map["Engineer"].prefix_tokens == 5000
    assert all(s.prompt[-1].tokens == 100 for _, s in tl.stages())


def test_unknown_override_names_parameter_and_valid_ones() -> None:
    with pytest.raises(TopasError, match="prefix_token") as e:
        generate("chain3", num_tasks=3, prefix_token=1000)
    assert "prefix_tokens, input_tokens, output_tokens, delay_s" in str(e.value)
    assert "\n" not in str(e.value)
    with pytest.raises(TopasError, match="unknown workload"):
        generate("chain4", num_tasks=3)


@pytest.mark.parametrize(
    ("name", "kwargs", "param"),
    [
        ("chain3", {"prefix_tokens": 0}, "prefix_tokens"),
        ("dag4", {"input_tokens": -5}, "input_tokens"),
        ("dag10-wide", {"output_tokens": "256"}, "output_tokens"),
        ("chain3", {"prefix_tokens": True}, "prefix_tokens"),
        ("chain3", {"delay_s": -1.0}, "delay_s"),
        ("chain3", {"delay_s": math.inf}, "delay_s"),
        ("metagpt-sop", {"code_tokens": (900, 100)}, "code_tokens"),
        ("metagpt-sop", {"prd_tokens": (0, 10)}, "prd_tokens"),
        ("metagpt-tl", {"plan_tokens": (1, 2, 3)}, "plan_tokens"),
        ("metagpt-tl", {"engineer_prefix_tokens": 2.5}, "engineer_prefix_tokens"),
        ("chain3", {"num_tasks": 0}, "num_tasks"),
        ("chain3", {"rate_per_s": 0.0}, "rate_per_s"),
        ("metagpt-tl", {"rate_per_s": -1.0}, "rate_per_s"),
        ("dag4", {"rate_per_s": math.nan}, "rate_per_s"),
        ("dag4", {"seed": -1}, "seed"),
    ],
)
def test_bad_values_raise(name: str, kwargs: dict[str, Any], param: str) -> None:
    kwargs = {"num_tasks": 2, **kwargs}
    with pytest.raises(TopasError, match=param) as e:
        generate(name, **kwargs)
    assert str(e.value).startswith(f"workload {name!r}: ") and "\n" not in str(e.value)


@pytest.mark.parametrize("name", NAMES)
def test_generated_workloads_validate_and_round_trip(name: str) -> None:
    from topas_bench.workloads.trace import dumps_workload, loads_workload, validate

    w: Workload = generate(name, num_tasks=20, seed=1)
    assert validate(w) == []
    assert validate(w, kv_budget_tokens=18_000) == []
    assert loads_workload(dumps_workload(w)) == w  # params are JSON-shaped
