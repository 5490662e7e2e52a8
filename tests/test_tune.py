"""`topas-bench tune`: a tiny real search, seed separation, and bad input."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from typer.testing import CliRunner

from topas_bench.cli import app
from topas_bench.tune import EVAL_SEEDS, TUNING_SEEDS, TuneSpec, plots, tune

runner = CliRunner()


def test_tuning_and_evaluation_seeds_are_disjoint() -> None:
    assert not set(TUNING_SEEDS) & set(EVAL_SEEDS)


def test_a_tiny_search_reports_the_best_setting(tmp_path: Path) -> None:
    spec = TuneSpec(
        workload="chain3", num_tasks=8, seeds=(101,), grid={"preempt_margin_s": (20.0, 1e6)},
        trials=3, jobs=1, out=tmp_path,
    )  # fmt: skip
    result = tune(spec)
    # the defaults first (20.0 is the default: stripped from the run's identity), then TPE
    assert result.trials[0].params == {} and result.default.params == {}
    assert {repr(t.params) for t in result.trials} <= {"{}", "{'preempt_margin_s': 1000000.0}"}
    assert result.best.objective == min(t.objective for t in result.trials)
    assert result.best.objective == (result.best.mean_ratio + result.best.p99_ratio) / 2
    name, value, _, _ = result.baseline[101]
    assert value > 0 and name in ("fcfs", "lpm", "spf", "parrot", "autellix")
    # the study is in SQLite: the same spec resumes it and adds trials
    assert (tmp_path / "tune.db").is_file()
    again = tune(replace(spec, trials=2))
    assert again.study == result.study and len(again.trials) == 5
    assert tune(replace(spec, seeds=(102,), trials=1)).study != result.study


def test_parallel_workers_share_the_study_and_plots(tmp_path: Path) -> None:
    spec = TuneSpec(
        workload="chain3", num_tasks=6, seeds=(101,), trials=4, jobs=2, out=tmp_path,
        grid={"beta": (0.0, 0.5, 1.0), "rho": (0.0, 2.0)},
    )  # fmt: skip
    result = tune(spec)
    assert len(result.trials) == 4
    files = plots(result, tmp_path / "plots")
    assert {f.name for f in files} >= {"history.png", "history.svg"}


def test_cli_prints_the_best_setting(tmp_path: Path) -> None:
    res = runner.invoke(
        app,
        ["tune", "-w", "chain3", "-n", "6", "--seeds", "101", "--param", "beta=0,0.5",
         "--trials", "2", "--jobs", "1", "--out", str(tmp_path)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "best setting on chain3 (seeds 101):" in res.stdout
    assert "vs best baseline: mean x" in res.stdout
    assert "2 trials in" in " ".join(res.stdout.split())


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    cases = [
        (["--seeds", "0,101"], "overlap the evaluation seeds"),
        (["--seeds", "a,b"], "--seeds expects comma-separated integers"),
        (["--param", "beta=-1"], "beta must be >= 0"),
        (["--param", "gamma=1"], "topas"),
        (["--param", "beta"], "--param expects name=v1,v2"),
        (["--trials", "0"], "--trials and --jobs must be >= 1"),
    ]
    for extra, needle in cases:
        res = runner.invoke(
            app, ["tune", "-w", "chain3", "-n", "4", "--out", str(tmp_path), *extra]
        )
        assert res.exit_code == 2, (extra, res.output)
        assert needle in res.stderr, (extra, res.stderr)
        assert "Traceback" not in res.output
