"""Result invariants (issue 24): every cell is checked before it is written, one check for
every engine (`cell.write.write_run` -> `invariants.check_cell`); a broken cell is a bug (exit
code 70, one line) and is not written. The JCT floor is the cost model's, not the unloaded JCT,
which tasks can beat (a cluster, a prefetching policy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from fuzz_targets import invoke
from topas_bench import unloaded
from topas_bench.experiment import plan_run
from topas_bench.harness import run_cell
from topas_bench.invariants import InvariantError, check_cell, cost_floor, jct_floors, no_floor
from topas_bench.results import read_table
from topas_bench.runners.cluster.config import ClusterConfig
from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.cost import CostModel, load_preset, preset_names
from topas_bench.spec import RunSpec
from topas_bench.workloads.model import Agent, Segment, Stage, Task, Workload


@pytest.mark.parametrize("preset", preset_names())
@pytest.mark.parametrize("compute_bound", [False, True])
def test_least_call_time_is_the_sum_of_batch_of_one_decode_steps(
    preset: str, compute_bound: bool
) -> None:
    cost = CostModel(load_preset(preset))
    if compute_bound:  # attention dearer than KV reads: the lines cross inside the range
        cost._attn_s = cost._kv_s * 3
        cost._lin_s = cost._weight_s - 2 * cost._kv_s * 2000
    for prompt in (1, 7, 1000, 1999, 2000, 2001, 30000):
        for out in (1, 2, 50, 4096):
            exact = float(cost.decode_steps_s(1, prompt, out).sum())
            assert cost.least_call_s(prompt, out) == pytest.approx(exact, rel=1e-12)
    assert cost.least_call_s(100, 0) == 0.0


def _diamond() -> Workload:
    a = Agent("A", 10)

    def stage(sid: str, deps: tuple[str, ...], delay: float, out: int) -> Stage:
        return Stage(sid, "A", (Segment("agent:A", 10),), out, deps, delay)

    stages = (
        stage("a", (), 1.0, 5), stage("b", ("a",), 0.0, 50), stage("c", ("a",), 7.0, 1),
        stage("d", ("b", "c"), 0.5, 2),
    )  # fmt: skip
    return Workload("w", (a,), (Task("t", "w", 3.0, stages),))


def test_jct_floor_is_the_longest_path_of_delays_and_least_call_times() -> None:
    w = _diamond()
    cost = CostModel(load_preset("a100-qwen32b"))
    call = {s.id: cost.least_call_s(10, s.output_tokens) for s in w.tasks[0].stages}
    via_b = 1.0 + call["a"] + call["b"] + 0.5 + call["d"]
    via_c = 1.0 + call["a"] + 7.0 + call["c"] + 0.5 + call["d"]
    assert jct_floors(w, cost_floor(cost)) == {"t": pytest.approx(max(via_b, via_c))}
    assert jct_floors(w, no_floor) == {"t": 8.5}


@pytest.fixture(scope="module")
def cell(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, pd.DataFrame], Any]:
    out = tmp_path_factory.mktemp("runs")
    plan = plan_run(RunSpec(workload="dag4", schedulers=("fcfs",), num_tasks=6, seed=1, out=out))
    run_dir = run_cell(plan, "fcfs").run_dir
    tables = {name: read_table(run_dir, name) for name in ("tasks", "requests")}
    floors = jct_floors(plan.workload, cost_floor(CostModel(plan.preset)))
    return tables, floors


def _broken(cell: Any, table: str, column: str, value: Any, row: int = 0) -> Any:
    tables, floors = cell
    t = {k: v.copy() for k, v in tables.items()}
    t[table].loc[row, column] = value
    return t, floors


@pytest.mark.parametrize(
    ("table", "column", "value", "message"),
    [
        ("tasks", "jct_s", 0.0, "JCT is not finish - arrival"),
        ("tasks", "jct_s", np.nan, "a time is not finite"),
        ("requests", "first_token_s", -1.0, "first_admitted_s > first_token_s"),
        ("requests", "finish_s", 1e12, "finished after its task"),
        ("requests", "ready_s", -5.0, "ready before its task arrived"),
        ("requests", "status", "error: boom", "with status 'error: boom'"),
        ("tasks", "unloaded_jct_s", np.inf, "unloaded JCT is not finite"),
    ],
)
def test_a_broken_cell_is_named(
    cell: Any, table: str, column: str, value: Any, message: str
) -> None:
    check_cell(*cell)  # the real cell holds
    with pytest.raises(InvariantError, match=message):
        check_cell(*_broken(cell, table, column, value))


def test_a_jct_below_its_floor_is_caught_as_the_issue_s_float_overflow(cell: Any) -> None:
    """At arrivals near 1e301 s a call's service time vanished in rounding: JCT 0."""
    tables, floors = cell
    t = {k: v.copy() for k, v in tables.items()}
    for name in ("arrival_s", "finish_s"):
        t["tasks"][name] += 1e301
    for name in ("ready_s", "first_admitted_s", "admitted_s", "first_token_s", "finish_s"):
        t["requests"][name] += 1e301
    t["tasks"]["jct_s"] = t["tasks"]["finish_s"] - t["tasks"]["arrival_s"]
    assert (t["tasks"]["jct_s"] == 0).all()
    with pytest.raises(InvariantError, match="JCT is below its floor"):
        check_cell(t, floors)


def test_every_task_once_and_its_calls(cell: Any) -> None:
    tables, floors = cell
    with pytest.raises(InvariantError, match="tasks recorded for"):
        check_cell({**tables, "tasks": tables["tasks"].iloc[1:]}, floors)
    with pytest.raises(InvariantError, match=r"calls != stages|finish is not its last call"):
        check_cell({**tables, "requests": tables["requests"].iloc[1:]}, floors)


def test_a_broken_cell_is_exit_70_in_one_line_and_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from topas_bench.runners.sim import engine

    real = engine.Simulator.run

    def run(self: Any) -> Any:
        res = real(self)
        if self.policy.name == "fcfs" and self.cfg.record_timeline:  # the cell, not its yardstick
            res.tasks["jct_s"] = 0.0
            res.tasks["finish_s"] = res.tasks["arrival_s"]
        return res

    monkeypatch.setattr(engine.Simulator, "run", run)
    result = invoke("run", "-w", "dag4", "-s", "fcfs", "-n", "3", "--out", tmp_path)
    assert result.exit_code == 70 and "Traceback" not in result.output
    (line,) = [x for x in result.stderr.splitlines() if x.strip()][-1:]
    assert line.startswith("internal error: broken result invariant: ")
    assert "the cell was not written" in line
    assert not list(tmp_path.rglob("run.json"))


def test_the_issue_s_inputs_are_refused_in_one_line(tmp_path: Path) -> None:
    result = invoke("run", "-w", "dag4", "--load", "1e-300", "-s", "fcfs", "--out", tmp_path)
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert "past the 1e+09 s (31.7 years) a run's clock resolves; give at least --load" in line


def test_a_cluster_and_a_prefetching_policy_may_beat_the_unloaded_jct(tmp_path: Path) -> None:
    """Why the unloaded JCT is not the floor: both cells are valid results."""
    plan = plan_run(RunSpec(
        workload="dag10-wide", schedulers=("fcfs",), num_tasks=8, seed=1, load=0.2, out=tmp_path,
        cluster=ClusterConfig(4, "round-robin"),
    ))  # fmt: skip
    tasks = read_table(run_cell(plan, "fcfs").run_dir, "tasks")
    assert (tasks["jct_s"] < tasks["unloaded_jct_s"]).any()


def test_the_unloaded_run_widens_its_gap_until_each_task_is_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from topas_bench.workloads.registry import generate

    w = generate("metagpt-tl", num_tasks=5, seed=0)
    preset = load_preset("a100-qwen32b")
    sim = SimConfig(kv_budget_tokens=preset.derived_kv_budget_tokens)
    reference = unloaded.unloaded_jct(w, preset, sim)
    assert all(v < unloaded.GAP_S for v in reference.values())
    monkeypatch.setattr(unloaded, "GAP_S", 1.0)  # every task longer than the first gap
    again = unloaded.unloaded_jct(w, preset, sim)
    assert again == pytest.approx(reference, rel=1e-12)
