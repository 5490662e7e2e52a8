"""Property tests: random DAG workloads x KV budgets x every scheduler x host tier on/off.

Every run uses `check_invariants=True` (memory accounting and lock counts re-derived after each
event), plus the stronger lock check below; the properties are about the recorded tables.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, load_preset
from topas_bench.runners.sim.engine import SimResult, SimulationError, Simulator
from topas_bench.runners.sim.radix import Node
from topas_bench.schedulers.registry import BASELINES, SCHEDULERS, make_policy
from topas_bench.workloads.model import (
    Agent,
    Segment,
    Stage,
    Task,
    Workload,
    agent_key,
    output_key,
)
from topas_bench.workloads.pieces import first_token
from topas_bench.workloads.trace import validate

COST = CostModel(load_preset("h100-llama8b"))


# -- strategies -----------------------------------------------------------------------------------
def _ancestors(stages: list[Stage], deps: tuple[str, ...]) -> list[str]:
    by_id = {s.id: s for s in stages}
    seen: list[str] = []
    todo = list(deps)
    while todo:
        sid = todo.pop()
        if sid not in seen:
            seen.append(sid)
            todo.extend(by_id[sid].deps)
    return sorted(seen)


@st.composite
def workloads(draw: st.DrawFn, max_tasks: int = 4, max_stages: int = 4) -> Workload:
    n_agents = draw(st.integers(1, 3))
    agents = [Agent(f"A{i}", draw(st.integers(1, 200))) for i in range(n_agents)]
    docs = {f"doc{i}": draw(st.integers(1, 150)) for i in range(2)}  # shared across tasks
    sampled = draw(st.booleans())  # whether any call sends max_new_tokens > output
    tasks = []
    for ti in range(draw(st.integers(1, max_tasks))):
        tid = f"t{ti}"
        arrival = draw(st.integers(0, 400)) / 1000
        stages: list[Stage] = []
        for si in range(draw(st.integers(1, max_stages))):
            sid = f"s{si}"
            agent = draw(st.sampled_from(agents))
            earlier = [s.id for s in stages]
            deps = tuple(
                sorted(draw(st.sets(st.sampled_from(earlier)) if earlier else st.just(set())))
            )
            ancestors = _ancestors(stages, deps)
            own = [s for s in stages if s.id in ancestors and s.agent == agent.name]
            if own and draw(st.booleans()):
                # append-only memory: the agent's earlier call and its output prefix this one
                prev = draw(st.sampled_from(own))
                prompt = [*prev.prompt, Segment(output_key(tid, prev.id), prev.output_tokens)]
            else:
                prompt = [Segment(agent_key(agent.name), agent.prefix_tokens)]
                for doc in draw(st.lists(st.sampled_from(sorted(docs)), max_size=1)):
                    prompt.append(Segment(doc, docs[doc]))
            quoted = draw(st.lists(st.sampled_from(ancestors), unique=True)) if ancestors else []
            by_id = {s.id: s for s in stages}
            prompt += [Segment(output_key(tid, q), by_id[q].output_tokens) for q in quoted]
            if draw(st.booleans()) or len(prompt) == 1:
                prompt.append(Segment(f"{tid}/{sid}/in", draw(st.integers(1, 300))))
            keys = [p.key for p in prompt]
            if len(set(keys)) != len(keys):  # a quoted output already in the history
                prompt = list({p.key: p for p in prompt}.values())
            out = draw(st.integers(1, 120))
            max_new = out + draw(st.integers(1, 600)) if sampled and draw(st.booleans()) else out
            delay = draw(st.sampled_from([0.0, 0.0, 0.002, 0.03]))
            stages.append(Stage(sid, agent.name, tuple(prompt), out, deps, delay, "k", max_new))
        tasks.append(Task(tid, "wf", arrival, tuple(stages)))
    return Workload("prop", tuple(agents), tuple(tasks))


def least_budget(w: Workload) -> int:
    """A budget every call fits: SGLang accepts a prompt below min(context, budget) - 6
    (`max_req_input_len`) and clips `max_new_tokens` to budget - prompt - 2; this budget also
    leaves every call its whole output."""
    return max(
        max(s.prompt_tokens + 7, s.prompt_tokens + s.output_tokens + 2) for _, s in w.stages()
    )


budget_slack = st.one_of(st.integers(0, 40), st.integers(0, 3000))
host_tier = st.one_of(st.just(0), st.integers(50, 3000))


# -- running and checking -----------------------------------------------------------------------
class CheckedSimulator(Simulator):
    """Adds to the engine's own invariants: every locked path (of a live request or a kept
    prefix) is on the GPU *and still attached to the tree*, which the engine's tree walk alone
    cannot see for a node that eviction dropped."""

    def check_invariants(self) -> None:
        super().check_invariants()
        live = [*self.running, *self.prefilling]
        if self.chunked is not None:
            live.append(self.chunked)
        for node in [*(r.lock_node for r in live), *self.pins.values()]:
            n: Node | None = node
            while n is not None and n is not self.cache.root:
                parent = n.parent
                attached = parent is not None and parent.children.get(first_token(n.edge[0])) is n
                if not n.on_gpu or not attached:
                    raise SimulationError(f"locked node {n.edge[:1]} was evicted")
                n = parent


def simulate(w: Workload, scheduler: str, budget: int, host: int) -> SimResult:
    cfg = SimConfig(kv_budget_tokens=budget, host_tier_tokens=host, check_invariants=True)
    return CheckedSimulator(w, make_policy(scheduler), COST, cfg).run()


def check_result(w: Workload, res: SimResult, budget: int) -> None:
    rows = {(r["task_id"], r["stage_id"]): r for r in res.requests.to_dict("records")}
    # every stage ran exactly once, to completion
    assert len(res.requests) == sum(len(t.stages) for t in w.tasks)
    assert set(rows) == {(t.id, s.id) for t, s in w.stages()}
    assert (res.requests["status"] == "ok").all()
    for t, s in w.stages():
        r = rows[t.id, s.id]
        assert r["output_tokens"] == s.output_tokens
        assert r["prompt_tokens"] == s.prompt_tokens
        assert 0 <= r["cached_tokens"] <= s.prompt_tokens
        # sent after all its dependencies finished plus the tool delay, admitted after that
        dep_done = max((rows[t.id, d]["finish_s"] for d in s.deps), default=t.arrival_s)
        assert r["ready_s"] == pytest.approx(dep_done + s.delay_s, abs=1e-12)
        assert r["first_admitted_s"] >= dep_done + s.delay_s - 1e-12
        # (a preempted request keeps its first token time; admitted_s is its last admission)
        assert r["first_admitted_s"] <= r["first_token_s"] <= r["finish_s"]
        assert r["first_admitted_s"] <= r["admitted_s"] <= r["finish_s"]
        if r["preemptions"] == 0:
            assert r["admitted_s"] == r["first_admitted_s"]
        assert r["service_s"] > 0
    assert res.preemptions == int(res.requests["preemptions"].sum())
    # tasks: one row each, JCT = last stage's finish - arrival
    assert sorted(res.tasks["task_id"]) == sorted(t.id for t in w.tasks)
    for task in res.tasks.to_dict("records"):
        finishes = [r["finish_s"] for (tid, _), r in rows.items() if tid == task["task_id"]]
        assert task["finish_s"] == max(finishes)
        assert task["jct_s"] == pytest.approx(task["finish_s"] - task["arrival_s"])
    # KV never over budget at any iteration (the invariant checker also checks every event)
    assert (res.timeline["kv_used_tokens"] <= budget).all()


def comparable(res: SimResult) -> dict[str, Any]:
    return {
        "requests": res.requests,
        "tasks": res.tasks,
        "timeline": res.timeline,
        "decisions": res.decisions.drop(columns=["wall_s"]),
        "scalars": (
            res.sim_time_s,
            res.iterations,
            res.preemptions,
            res.prefill_tokens,
            res.cached_tokens,
        ),
    }


def assert_same(a: SimResult, b: SimResult) -> None:
    x, y = comparable(a), comparable(b)
    for name in ("requests", "tasks", "timeline", "decisions"):
        pd.testing.assert_frame_equal(x[name], y[name], check_exact=True, obj=name)
    assert x["scalars"] == y["scalars"]


# -- the properties ------------------------------------------------------------------------------
SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("host", [False, True], ids=["gpu-only", "host-tier"])
@pytest.mark.parametrize("scheduler", SCHEDULERS.names())
@SETTINGS
@given(w=workloads(), slack=budget_slack, host_tokens=host_tier)
def test_every_stage_runs_once_after_its_deps_within_budget(
    scheduler: str, host: bool, w: Workload, slack: int, host_tokens: int
) -> None:
    budget = least_budget(w) + slack
    assert validate(w, kv_budget_tokens=budget) == []
    host_tokens = host_tokens if host else 0
    first = simulate(w, scheduler, budget, host_tokens)
    check_result(w, first, budget)
    again = simulate(w, scheduler, budget, host_tokens)
    assert_same(first, again)


@pytest.mark.parametrize("scheduler", BASELINES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(), slack=budget_slack, host_tokens=host_tier)
def test_exact_reservations_are_never_retracted(
    scheduler: str, w: Workload, slack: int, host_tokens: int
) -> None:
    """With ignore_eos everywhere (max_new == output) admission reserves exactly what each
    request will use, so decode never runs out of memory and nothing is retracted."""
    exact = Workload(
        w.name,
        w.agents,
        tuple(
            Task(t.id, t.workflow, t.arrival_s, tuple(_exact(s) for s in t.stages)) for t in w.tasks
        ),
    )
    budget = least_budget(exact) + slack
    res = simulate(exact, scheduler, budget, host_tokens)
    check_result(exact, res, budget)
    assert res.preemptions == 0


def _exact(s: Stage) -> Stage:
    return Stage(
        s.id, s.agent, s.prompt, s.output_tokens, s.deps, s.delay_s, s.kind, s.output_tokens
    )


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", SCHEDULERS.names())
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(w=workloads(max_tasks=8, max_stages=6), slack=budget_slack, host_tokens=host_tier)
def test_larger_workloads_under_tight_budgets(
    scheduler: str, w: Workload, slack: int, host_tokens: int
) -> None:
    budget = least_budget(w) + slack // 8
    res = simulate(w, scheduler, budget, host_tokens)
    check_result(w, res, budget)
