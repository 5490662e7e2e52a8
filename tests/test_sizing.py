"""Size estimates before large runs (issue 13): a run or sweep too large for this machine is
refused with the estimate before its workload is built; the estimate tracks what a run
really allocates."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from topas_bench import sizing
from topas_bench.cli import app
from topas_bench.errors import TopasError
from topas_bench.experiment import plan_run
from topas_bench.harness import run_cell
from topas_bench.sizing import Estimate, Probe, estimate_run, estimate_sweep, probe
from topas_bench.spec import RunSpec


def invoke(*args: str | Path) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def assert_refused(result: Any, out: Path, what: str) -> None:
    assert result.exit_code == 2 and "Traceback" not in result.output
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: this {what} would need at least ")
    assert "half of this machine's RAM" in last and "--allow-large" in last
    assert not list(out.rglob("*.parquet"))  # nothing was run


def test_an_oversized_run_is_refused_before_its_workload_is_built(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    result = invoke("run", "-w", "chain3", "-s", "fcfs", "-n", "100000000", "--out", out)
    assert_refused(result, out, "run")
    assert "100,000,000 tasks: estimating the run's size" in result.stderr


def test_an_oversized_sweep_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    args = ["sweep", "-w", "chain3,dag4", "-s", "fcfs", "--rate", "0.1", "--seeds", "0-3",
            "-n", "50000000", "--out", out]  # fmt: skip
    assert_refused(invoke(*args), out, "sweep")


def test_allow_large_runs_past_the_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizing, "memory_limit_bytes", lambda: 1_000_000)  # a 1 MB machine
    out = tmp_path / "runs"
    args = ["run", "-w", "chain3", "-s", "fcfs", "-n", "5001", "--out", out]
    refused = invoke(*args)
    assert refused.exit_code == 2 and "this run would need" in refused.stderr
    ran = invoke(*args, "--allow-large")
    assert ran.exit_code == 0, ran.output
    assert "estimated size: 5,001 tasks, 15,003 calls, about" in ran.stderr
    assert len(list(out.rglob("run.json"))) == 1


def test_small_runs_are_not_probed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_: Any, **__: Any) -> Any:
        raise AssertionError("probed a small run")

    monkeypatch.setattr(sizing, "probe", boom)
    assert invoke("run", "-w", "chain3", "-s", "fcfs", "-n", "5", "--out", tmp_path).exit_code == 0


@pytest.mark.slow
@pytest.mark.parametrize(("workload", "tasks"), [("chain3", 800), ("metagpt-tl", 400)])
def test_the_estimate_tracks_what_a_run_allocates(
    workload: str, tasks: int, tmp_path: Path
) -> None:
    est = estimate_run(probe(workload, {}, None, 0, ("fcfs",), "a100-qwen32b", None), tasks)
    tracemalloc.start()
    try:
        spec = RunSpec(workload=workload, schedulers=("fcfs",), num_tasks=tasks, out=tmp_path)
        plan = plan_run(spec)
        run_cell(plan, "fcfs")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert est.calls == sum(len(t.stages) for t in plan.workload.tasks)
    assert 0.5 < est.peak_bytes / peak < 2.0, (est.peak_bytes, peak)


def _probe(**over: Any) -> Probe:
    base = dict(
        calls_per_task=3.0, workload_bytes_per_task=1000.0, trace_bytes_per_task=500.0,
        sim_bytes_per_task=4000.0, generate_s_per_task=0.001,
        simulate_s_per_task={"fcfs": 0.01, "topas": 0.1},
    )  # fmt: skip
    return Probe(**(base | over))


def test_estimate_arithmetic() -> None:
    run = estimate_run(_probe(), 1000)
    assert (run.held_bytes, run.peak_bytes, run.calls) == (1_000_000, 5_000_000, 3000)
    assert run.total_s == pytest.approx(1.0 + 10.0 + 100.0)
    sweep = estimate_sweep([(_probe(), 1000), (_probe(sim_bytes_per_task=8000.0), 1000)], jobs=2)
    # both groups' workloads and traces held; two cells at once, each with trace + workload
    assert sweep.held_bytes == 3_000_000
    assert sweep.peak_bytes == 3_000_000 + 9_500_000 + 5_500_000
    assert dict(sweep.simulate_s) == pytest.approx({"fcfs": 10.0, "topas": 100.0})


def test_check_refuses_only_past_the_limit() -> None:
    est = Estimate(10, 30, 100, 2_000_000, 1.0, (("fcfs", 2.0),))
    sizing.check(est, limit_bytes=2_000_000, forced=False)
    sizing.check(est, limit_bytes=1_999_999, forced=True)
    with pytest.raises(TopasError, match="would need about 2 MB"):
        sizing.check(est, limit_bytes=1_999_999, forced=False)
