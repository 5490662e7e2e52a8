"""Sweeps: specs from TOML and flags, resumable cells, one workload sample per group, a sweep
killed midway and resumed, the Ray executor against a local Ray cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from topas_bench.analysis.collect import collect
from topas_bench.cell.stored import check_cell
from topas_bench.cli import app
from topas_bench.errors import TopasError
from topas_bench.results import is_hidden
from topas_bench.sweep import SweepSpec, load_specs, parse_list, read_toml, run_sweep
from topas_bench.sweep.run import CAPACITY_FILE

CLI = [sys.executable, "-c", "from topas_bench.cli import main; main()"]
TINY = ["-w", "chain3,dag4", "-s", "fcfs,lpm", "--rate", "0.05", "--seeds", "0,1", "-n", "6"]


def run_dirs(root: Path) -> list[Path]:
    """Finished cells (not a killed writer's hidden temporary directory)."""
    return sorted(p.parent for p in root.rglob("run.json") if not is_hidden(p, root))


def invoke(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


# -- specs ---------------------------------------------------------------------------------------
def test_toml_with_several_sweeps(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        'tasks = 10\nseeds = [0, 1]\n'
        '[[sweep]]\nworkloads = ["chain3", "dag4"]\nschedulers = "all"\nloads = [0.8]\n'
        '[[sweep]]\nworkloads = "chain3"\nschedulers = ["baselines", "topas", "fcfs"]\n'
        'kv_budgets = ["derived", 40000]\nrates = [0.1, 0.2]\n'
        '[scheduler_params.topas]\nbeta = 0.2\n'
    )  # fmt: skip
    (a, _), (b, _) = load_specs(read_toml(path), {}, str(path))
    assert a.workloads == ("chain3", "dag4") and a.loads == (0.8,) and a.num_tasks == 10
    assert len(a.runs(tmp_path)) == 2 * 2 and a.scheduler_params == {"topas": {"beta": 0.2}}
    assert b.schedulers == ("fcfs", "lpm", "spf", "parrot", "autellix", "topas")
    assert b.kv_budgets == (None, 40000) and len(b.runs(tmp_path)) == 2 * 2 * 2
    # flags override every entry; a --load flag replaces the file's rates
    (c, _), (d, _) = load_specs(read_toml(path), {"loads": [0.5], "tasks": 3}, str(path))
    assert c.loads == d.loads == (0.5,) and d.rates == () and d.num_tasks == 3


def test_a_workloads_flag_drops_the_files_params_of_workloads_it_leaves_out(
    tmp_path: Path,
) -> None:
    """results/reference.toml pins `max_tokens` for the MetaGPT workloads; `-w chain3` still
    runs (the nightly's small check), and `-w metagpt-tl` keeps metagpt-tl's pin."""
    path = tmp_path / "s.toml"
    path.write_text(
        '[[sweep]]\nworkloads = ["chain3", "metagpt-tl"]\nloads = [0.8]\n'
        '[sweep.workload_params.metagpt-tl]\nmax_tokens = "exact"\n'
    )  # fmt: skip
    ((a, _),) = load_specs(read_toml(path), {"workloads": ["chain3"]}, str(path))
    assert a.workloads == ("chain3",) and a.workload_params == {}
    ((b, _),) = load_specs(read_toml(path), {"workloads": ["metagpt-tl"]}, str(path))
    assert b.workload_params == {"metagpt-tl": {"max_tokens": "exact"}}
    with pytest.raises(TopasError, match="`workload_params` for 'metagpt-tl', which is not in"):
        path.write_text('workloads = ["chain3"]\n[workload_params.metagpt-tl]\nqa = "off"\n')
        load_specs(read_toml(path), {}, str(path))  # a typo in the file is still an error


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('workloads = ["chain3"]\nloadz = [1]\n', "unknown key 'loadz'"),
        ('workloads = ["chain3"\n', "invalid TOML"),
        ('workloads = ["chain3"]\nschedulers = ["fcfs", "nope"]\n', "unknown scheduler 'nope'"),
        ('workloads = ["chain3"]\nseeds = [0, "1"]\n', "`seeds` has a value of the wrong type"),
        ('workloads = ["chain3"]\nloads = [0.5]\nrates = [0.1]\n', "either loads or rates"),
        ('workloads = ["chain3"]\ntasks = 0\n', "`tasks` must be a positive integer"),
        ('workloads = ["chain3"]\nloads = [-1]\n', "must be positive"),
        ('schedulers = "all"\n', "`workloads` is missing"),
        (
            'workloads = "chain3"\nschedulers = "baselines"\n[scheduler_params.topas]\nbeta = 1\n',
            "not in this sweep",
        ),
        ('workloads = ["chain3"]\nsweep = 3\n', "array of tables"),
    ],
)
def test_bad_sweep_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(TopasError, match=message):
        load_specs(read_toml(path), {}, str(path))
    code, output = invoke("sweep", "--config", path, "--out", tmp_path / "o")
    assert code == 2 and message.split("'")[0].strip("`") in output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_parse_list() -> None:
    assert parse_list("0-2,5", "--seeds", int) == [0, 1, 2, 5]
    assert parse_list("0.6, 0.8", "--load", float) == [0.6, 0.8]
    with pytest.raises(TopasError, match="--load: not a list"):
        parse_list("0.6,x", "--load", float)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-w", "nope"], "unknown workload 'nope'"),
        (["-w", "chain3", "-s", "fcfs,zzz"], "unknown scheduler 'zzz'"),
        (["-w", "chain3", "--preset", "tpu"], "unknown preset 'tpu'"),
        (["-w", "chain3", "--seeds", "a"], "--seeds: not a list"),
        (["-w", "chain3", "--jobs", "0"], "--jobs must be >= 1"),
        (["-w", "chain3", "--address", "1.2.3.4:6379"], "--address needs --executor ray"),
        (["-w", "chain3", "--executor", "dask"], "unknown executor 'dask'"),
        (["-w", "chain3", "--scheduler-param", "topas.bogus=1", "-s", "topas"], "bogus"),
        (["-w", "chain3", "--kv-budget", "100", "--rate", "1"], "smaller than the largest call"),
    ],
)
def test_bad_sweep_flags(tmp_path: Path, args: list[str], message: str) -> None:
    code, output = invoke("sweep", *args, "--out", tmp_path / "o")
    assert code == 2, output
    assert message in output and "Traceback" not in output


# -- running -------------------------------------------------------------------------------------
def test_sweep_resumes_and_skips_finished_cells(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    code, output = invoke("sweep", *TINY, "--out", out, "-j", "1")
    assert code == 0, output
    assert "8 cells: 8 ran, 0 already finished, 0 failed" in output
    dirs = run_dirs(out)
    assert len(dirs) == 8
    stamps = {d: (d / "run.json").stat().st_mtime_ns for d in dirs}
    code, output = invoke("sweep", *TINY, "--out", out, "-j", "1")
    assert "8 cells: 0 ran, 8 already finished" in output
    assert {d: (d / "run.json").stat().st_mtime_ns for d in run_dirs(out)} == stamps
    # a cell stored for another workload sample is stale: rerun, not skipped
    stale = dirs[0] / "run.json"
    meta = json.loads(stale.read_text())
    stale.write_text(json.dumps({**meta, "workload_digest": "0" * 16}))
    code, output = invoke("sweep", *TINY, "--out", out, "-j", "1")
    assert "8 cells: 1 ran, 7 already finished" in output, output
    assert json.loads(stale.read_text())["workload_digest"] == meta["workload_digest"]
    code, output = invoke("sweep", *TINY, "--out", out, "-j", "1", "--force")
    assert "8 cells: 8 ran" in output and run_dirs(out) == dirs
    # every scheduler of a group ran on the same sample; report reads it all
    coll = collect(out)
    assert coll.problems == [] and len(coll.runs) == 8
    assert coll.runs.groupby(["group", "seed"])["workload_digest"].nunique().max() == 1
    assert coll.runs.groupby(["group", "seed"])["workload_digest"].ngroups == 4


def test_loads_use_the_capacity_cache(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    out.mkdir()
    cap = {"workload": "dag4", "workload_params": {}, "preset": "a100-qwen32b",
           "kv_budget_tokens": 18692, "capacity_tps": 0.125}  # fmt: skip
    (out / CAPACITY_FILE).write_text(json.dumps({"capacities": [cap]}))
    spec = SweepSpec(workloads=("dag4",), schedulers=("fcfs",), loads=(0.4, 0.8), num_tasks=5)
    started = time.monotonic()
    result = run_sweep([spec], out)
    assert time.monotonic() - started < 10  # nothing measured
    assert result.cells == 2 and not result.failed
    metas = [json.loads((d / "run.json").read_text()) for d in run_dirs(out)]
    assert sorted(m["identity"]["rate_per_s"] for m in metas) == [0.4 * 0.125, 0.8 * 0.125]
    assert {m["capacity_tps"] for m in metas} == {0.125}
    assert sorted(m["load"] for m in metas) == [0.4, 0.8]


def test_compact_tables_are_lossless(tmp_path: Path) -> None:
    import pandas as pd

    spec = SweepSpec(workloads=("chain3",), schedulers=("fcfs",), rates=(0.1,), num_tasks=8)
    run_sweep([spec], tmp_path / "a")
    run_sweep([spec], tmp_path / "b", compact=True)
    ((a,), (b,)) = run_dirs(tmp_path / "a"), run_dirs(tmp_path / "b")
    for name in ("requests", "tasks", "timeline", "decisions"):
        left, right = pd.read_parquet(a / f"{name}.parquet"), pd.read_parquet(b / f"{name}.parquet")
        if name == "decisions":  # wall-clock times differ between runs; the shape does not
            left, right = left.drop(columns="wall_s"), right.drop(columns="wall_s")
        pd.testing.assert_frame_equal(left, right)
    import pyarrow.parquet as pq

    codec = {d: pq.read_metadata(d / "tasks.parquet").row_group(0).column(0).compression
             for d in (a, b)}  # fmt: skip
    assert codec == {a: "SNAPPY", b: "ZSTD"}
    # compacted as written: run.json's digests are the compact files'
    assert check_cell(b, require_digests=True) is None
    assert collect(tmp_path / "b").problems == []


def test_failing_cell_is_reported_and_others_finish(tmp_path: Path) -> None:
    from topas_bench.sweep.run import CellJob, run_cell_job

    job = CellJob("fcfs", "not a trace", "x", {"seed": 0, "workload_name": "chain3"}, False)
    outcome = run_cell_job(job)
    assert outcome.error is not None and "TraceError" in outcome.error


@pytest.mark.slow
def test_killed_sweep_resumes_without_loss_or_duplicates(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    args = ["sweep", "-w", "dag4", "-s", "baselines,topas", "--rate", "0.07", "--seeds", "0-3",
            "-n", "40", "-j", "2", "--out", str(out)]  # fmt: skip
    total = 6 * 4
    proc = subprocess.Popen(
        CLI + args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 120
        while len(run_dirs(out)) < 4 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the sweep and its workers, mid-run
        proc.wait()
    before = {d: (d / "run.json").stat().st_mtime_ns for d in run_dirs(out)}
    assert 4 <= len(before) < total, "the sweep finished before it could be killed"
    code, output = invoke(*args[:-4], "-j", "1", "--out", out)
    assert code == 0, output
    assert f"{total} cells: {total - len(before)} ran, {len(before)} already finished" in output
    after = run_dirs(out)
    assert len(after) == total  # nothing lost
    assert len({d.parent.name for d in after}) == 6  # scheduler directories
    # a cell per seed, no duplicates (a killed writer's hidden temporary directory may stay
    # beside them until it is old enough to clear: it is not a cell)
    assert all(len([c for c in after if c.parent == d.parent]) == 4 for d in after)
    assert {d: (d / "run.json").stat().st_mtime_ns for d in before} == before  # not re-run
    coll = collect(out)
    assert coll.problems == [] and len(coll.runs) == total


@pytest.mark.slow
def test_ray_executor_on_a_local_cluster(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray", reason="the `ray` extra (make test installs it)")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        address = ray.get_runtime_context().gcs_address
        out = tmp_path / "runs"
        args = ["sweep", *TINY, "--executor", "ray", "--address", address, "--out", str(out)]
        done = subprocess.run(CLI + args, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "8 cells: 8 ran, 0 already finished, 0 failed" in done.stdout
    finally:
        ray.shutdown()
    local = tmp_path / "local"
    code, _ = invoke("sweep", *TINY, "-j", "1", "--out", local)
    assert code == 0
    ray_runs, local_runs = collect(out).runs, collect(local).runs
    cols = ["workload", "scheduler", "seed", "workload_digest", "mean_jct_s", "p99_jct_s"]
    assert ray_runs[cols].equals(local_runs[cols])  # same cells, same results
    assert [d.relative_to(out) for d in run_dirs(out)] == [
        d.relative_to(local) for d in run_dirs(local)
    ]
