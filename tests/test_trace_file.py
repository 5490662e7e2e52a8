"""A workload trace file runs wherever a workload name is accepted (docs/workload-format.md),
and `workloads validate` checks it against the format (all its JSON Schema says, and more)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from typer.testing import CliRunner

from fuzz_targets import workload_files
from topas_bench.cli import app
from topas_bench.errors import TopasError
from topas_bench.experiment import plan_run
from topas_bench.harness import run_cell
from topas_bench.results import read_table
from topas_bench.spec import RunSpec
from topas_bench.sweep import SweepSpec, run_sweep
from topas_bench.workloads.metagpt_import import for_task
from topas_bench.workloads.model import Task, Workload
from topas_bench.workloads.registry import WORKLOADS, generate, resolve, run_defaults
from topas_bench.workloads.trace import (
    TraceError,
    dump_workload,
    dumps_workload,
    load_workload,
    loads_workload,
    validate,
)
from topas_bench.workloads.trace.schema import schema_problems

EXAMPLE = Path(__file__).parents[1] / "docs" / "examples" / "writer-reviewer.jsonl"


def cli(*args: str | Path) -> tuple[int, str]:
    res = CliRunner().invoke(app, [str(a) for a in args])
    return res.exit_code, " ".join(res.output.split())


@pytest.fixture
def exported(tmp_path: Path) -> Path:
    path = tmp_path / "dag4.jsonl"
    dump_workload(generate("dag4", num_tasks=12, seed=4), path)
    return path


def test_a_file_replays_exactly_by_default(exported: Path) -> None:
    w = load_workload(exported)
    assert run_defaults(str(exported)) == (12, pytest.approx(12 / w.tasks[-1].arrival_s))
    replay = generate(str(exported), num_tasks=12)
    assert replay.tasks == w.tasks and replay.agents == w.agents
    assert replay.generator == "trace" and replay.params["file"] == str(exported)


def test_rate_rescales_recorded_arrivals_and_poisson_redraws(exported: Path) -> None:
    w = load_workload(exported)
    own = run_defaults(str(exported))[1]
    faster = generate(str(exported), num_tasks=12, rate_per_s=2 * own)
    assert [t.arrival_s for t in faster.tasks] == pytest.approx([t.arrival_s / 2 for t in w.tasks])
    assert [t.stages for t in faster.tasks] == [t.stages for t in w.tasks]
    a, b = (generate(str(exported), num_tasks=12, rate_per_s=0.1, seed=s, arrivals="poisson")
            for s in (1, 2))  # fmt: skip
    assert [t.arrival_s for t in a.tasks] != [t.arrival_s for t in b.tasks]
    assert [t.stages for t in a.tasks] == [t.stages for t in w.tasks]


def test_more_tasks_than_the_file_repeat_it_with_fresh_ids_and_keys(exported: Path) -> None:
    w = load_workload(exported)
    big = generate(str(exported), num_tasks=30)
    assert validate(big) == [] and len(big.tasks) == 30
    period = w.tasks[-1].arrival_s
    copy = big.tasks[12]
    first = w.tasks[0]
    assert copy.id == f"{first.id}~1"
    assert copy.arrival_s == pytest.approx(first.arrival_s + period)
    keys = [g.key for s in copy.stages for g in s.prompt]
    assert all(k.startswith(("agent:", f"{copy.id}/")) for k in keys)
    times = [t.arrival_s for t in big.tasks]
    assert times == sorted(times)


def test_one_job_at_t0_runs_as_is_and_needs_poisson_for_a_rate(tmp_path: Path) -> None:
    path = tmp_path / "one.jsonl"
    w = generate("chain3", num_tasks=1)
    job = Task("job", "x", 0.0, for_task(w.tasks[0].stages, "job"))
    dump_workload(Workload("one", w.agents, (job,)), path)
    assert run_defaults(str(path)) == (1, 0.0)
    assert generate(str(path), num_tasks=1).tasks[0].arrival_s == 0.0
    with pytest.raises(TopasError, match="no rate to scale"):
        generate(str(path), num_tasks=3, rate_per_s=0.5)
    many = generate(str(path), num_tasks=3, rate_per_s=0.5, arrivals="poisson")
    assert [t.id for t in many.tasks] == ["job", "job~1", "job~2"]


def test_resolve_names_files_and_errors(tmp_path: Path) -> None:
    assert resolve("dag4") == ("dag4", {})
    assert resolve(str(EXAMPLE), {"arrivals": "poisson"}) == (
        "trace", {"file": str(EXAMPLE), "arrivals": "poisson"},
    )  # fmt: skip
    with pytest.raises(TopasError, match="no such file"):
        resolve(str(tmp_path / "missing.jsonl"))
    with pytest.raises(TopasError, match=r"unknown workload 'nope'; known: .*or a trace file"):
        resolve("nope")
    assert "trace" in WORKLOADS


def test_run_cli_takes_a_file(tmp_path: Path) -> None:
    code, out = cli("run", "-w", EXAMPLE, "-s", "fcfs,topas", "--out", tmp_path)
    assert code == 0, out
    assert f"workload {EXAMPLE}: 3 tasks, seed 0, arrivals as recorded" in out
    (run_dir,) = (tmp_path / "trace" / "topas").iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["identity"]["workload_params"] == {"file": str(EXAMPLE)}
    assert len(read_table(run_dir, "tasks")) == 3
    code, out = cli("run", "-w", tmp_path / "nope.jsonl", "--out", tmp_path)
    assert code == 2 and "no such file" in out


def test_a_file_with_load_measures_its_capacity(tmp_path: Path) -> None:
    plan = plan_run(RunSpec(workload=str(EXAMPLE), schedulers=("fcfs",), num_tasks=6, load=0.8,
                            out=tmp_path))  # fmt: skip
    assert plan.capacity_tps is not None and plan.rate_per_s == pytest.approx(
        0.8 * plan.capacity_tps
    )
    assert run_cell(plan, "fcfs").summary["tasks"] == 6


def test_sweep_config_takes_a_file(tmp_path: Path) -> None:
    spec = SweepSpec(workloads=(str(EXAMPLE),), schedulers=("fcfs", "lpm"), seeds=(0, 1))
    result = run_sweep([spec], tmp_path / "out", jobs=1)
    assert result.cells == 4 and not result.failed
    # recorded arrivals: both seeds are the same sample, so one run directory each
    assert len(list((tmp_path / "out" / "trace" / "fcfs").iterdir())) == 2
    code, out = cli("report", tmp_path / "out", "--quiet")
    assert code == 0, out


def test_export_defaults_to_run_s_task_count(tmp_path: Path) -> None:
    code, out = cli("workloads", "export", "chain3", "-o", tmp_path / "c.jsonl")
    assert code == 0 and "200 tasks" in out
    code, out = cli("workloads", "export", EXAMPLE, "-o", tmp_path / "e.jsonl")
    assert code == 0 and "3 tasks" in out


# -- the JSON Schema ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", [n for n in WORKLOADS.names() if n != "trace"])
def test_every_workload_s_trace_matches_the_schema(name: str) -> None:
    assert schema_problems(dumps_workload(generate(name, num_tasks=3))) == []


def test_schema_and_loader_reject_the_same_shapes() -> None:
    text = EXAMPLE.read_text()
    assert schema_problems(text) == []
    header, *tasks = text.splitlines()
    task = json.loads(tasks[0])
    stage = task["stages"][0]
    bad = {
        "output 0": {**task, "stages": [{**stage, "output_tokens": 0}]},
        "unknown field": {**task, "colour": "red"},
        "negative arrival": {**task, "arrival_s": -1},
        "no stages": {**task, "stages": []},
        "bad segment": {**task, "stages": [{**stage, "prompt": [["agent:writer"]]}]},
        "missing agent": {**task, "stages": [{k: v for k, v in stage.items() if k != "agent"}]},
        "deps not a list": {**task, "stages": [{**stage, "deps": "x"}]},
        "bool tokens": {**task, "stages": [{**stage, "output_tokens": True}]},
    }
    for what, obj in bad.items():
        lines = f"{header}\n{json.dumps(obj)}\n"
        assert schema_problems(lines), what
        with pytest.raises(TopasError):
            loads_workload(lines)


def test_validate_reports_schema_problems_with_line_and_field(tmp_path: Path) -> None:
    header, first, *_ = EXAMPLE.read_text().splitlines()
    path = tmp_path / "bad.jsonl"
    task = json.loads(first)
    task["stages"][1]["delay_s"] = -0.5
    path.write_text(f"{header}\n{json.dumps(task)}\n")
    code, out = cli("workloads", "validate", path)
    assert code == 2
    assert f"{path}:2: stages[1].delay_s: expected a finite number of seconds >= 0" in out
    assert schema_problems(path.read_text())[0].format(str(path)) == (
        f"{path}:2: stages[1].delay_s: -0.5 is less than the minimum of 0"
    )
    code, out = cli("workloads", "validate", EXAMPLE, "--kv-budget", "18692")
    assert code == 0 and "valid: 3 tasks, 9 calls, 2 agents" in out


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(workload_files)
def test_the_checks_refuse_every_line_the_schema_refuses(text: str) -> None:
    """Why `workloads validate` need not run the (slow) JSON Schema: on mutated traces, every
    line the schema refuses, the checks refuse too (they are stricter: bounds, the DAG, keys)."""
    try:
        loads_workload(text)
        flagged: set[int | None] = set()
    except TraceError as e:
        flagged = {p.line for p in e.problems}
    first = next((n for n, line in enumerate(text.split("\n"), 1) if line.strip()), None)
    if first in flagged:
        return  # a header the checks stop at: the task lines are not looked at
    assert {p.line for p in schema_problems(text)} <= flagged
