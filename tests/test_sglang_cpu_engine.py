"""`--engine sglang-cpu` and `topas-bench fidelity` through the CLI: the reference engine writes
the same files as the simulator under its own identity, and on a small contended workload the
simulator and SGLang's scheduler agree exactly. Bad input fails before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from sglang_venv import build
from topas_bench.cli import app
from topas_bench.results import TABLES, read_meta
from topas_bench.runners.engines import engine_version
from topas_bench.runners.records import REQUEST_COLUMNS

runner = CliRunner()


@pytest.fixture(scope="module")
def sglang_venv() -> None:
    build()


def invoke(*args: object) -> object:
    return runner.invoke(app, [str(a) for a in args])


def test_missing_venv_names_the_make_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOPAS_SGLANG_PYTHON", str(tmp_path / "nope" / "python"))
    res = runner.invoke(app, ["run", "-w", "chain3", "-s", "fcfs", "-n", "2", "--engine",
                              "sglang-cpu", "--out", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 2
    assert "make sglang-env" in res.stderr and "Traceback" not in res.stderr
    assert not any(tmp_path.rglob("run.json"))  # nothing ran


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--host-tier-tokens", "1000"], "--host-tier-tokens is a simulator setting"),
        (["--length-hint", "oracle"], "--length-hint oracle is a simulator setting"),
        (["--model", "m"], "--model is for --engine sglang"),
    ],
)
def test_simulator_only_settings_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    monkeypatch.setenv("TOPAS_SGLANG_PYTHON", str(Path(__file__)))  # exists: the venv check passes
    res = runner.invoke(app, ["run", "-w", "chain3", "-s", "fcfs", "-n", "2", "--engine",
                              "sglang-cpu", "--out", str(tmp_path), *flags])  # fmt: skip
    assert res.exit_code == 2 and message in res.stderr


def test_unknown_engine_lists_the_known_ones(tmp_path: Path) -> None:
    res = runner.invoke(app, ["run", "-w", "chain3", "--engine", "gpu", "--out", str(tmp_path)])
    assert res.exit_code == 2
    assert "unknown engine 'gpu'; known: sim, sglang-cpu, sglang" in res.stderr


@pytest.mark.slow
def test_run_on_the_reference_engine_writes_the_simulators_files(
    sglang_venv: None, tmp_path: Path
) -> None:
    res = runner.invoke(app, ["run", "-w", "dag4", "-s", "fcfs,spf", "-n", "6", "--engine",
                              "sglang-cpu", "--out", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 0, res.stderr
    assert "engine sglang-cpu" in res.stdout
    for name in ("fcfs", "spf"):
        (cell,) = (tmp_path / "dag4" / name).iterdir()
        assert cell.name.startswith("sglang-cpu-")
        meta = read_meta(cell)
        ident = meta["identity"]
        assert (ident["engine"], ident["engine_version"]) == (
            "sglang-cpu",
            engine_version("sglang-cpu"),
        )
        for table in TABLES:
            assert (cell / f"{table}.parquet").is_file()
        tasks = pd.read_parquet(cell / "tasks.parquet")
        assert len(tasks) == 6 and meta["summary"]["tasks"] == 6
        assert list(pd.read_parquet(cell / "requests.parquet").columns) == REQUEST_COLUMNS
    again = runner.invoke(app, ["run", "-w", "dag4", "-s", "fcfs", "-n", "6", "--engine",
                                "sglang-cpu", "--out", str(tmp_path)])  # fmt: skip
    assert again.exit_code == 0 and "(cached)" in again.stdout


@pytest.mark.slow
def test_fidelity_on_a_contended_workload(sglang_venv: None, tmp_path: Path) -> None:
    res = runner.invoke(app, ["fidelity", "-w", "dag4", "-s", "fcfs,lpm,spf,topas", "-n", "30",
                              "--out", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 0, res.stderr
    report = json.loads((tmp_path / "fidelity.json").read_text())
    assert len(report["cells"]) == 4 and report["command"].startswith("topas-bench ")
    for cell in report["cells"]:
        assert cell["mean_jct_diff"] == pytest.approx(0.0, abs=1e-9)
        assert cell["p99_jct_diff"] == pytest.approx(0.0, abs=1e-9)
        assert cell["order_agreement"] == 1.0
    assert all(r["same"] for r in report["rankings"])
    md = (tmp_path / "fidelity.md").read_text()
    assert md.startswith("Command: `topas-bench ") and "| dag4 | topas |" in md
