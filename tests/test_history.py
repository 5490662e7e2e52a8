"""The nightly's history: JSON series per workload and scheduler, the margin check, trends."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from results_fixture import identity, stretch, write_fixture
from topas_bench.cli import app


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fixture(tmp_path_factory.mktemp("night"))


def slower_topas(tree: Path, dest: Path, factor: float) -> Path:
    shutil.copytree(tree, dest)
    for seed in (0, 1):
        stretch(identity("topas", seed).run_dir(dest), factor)
    return dest


def cli(*args: str | Path) -> tuple[int, str]:
    res = CliRunner().invoke(app, [str(a) for a in args])
    return res.exit_code, " ".join(res.output.split())


def test_series_check_and_trend(tree: Path, tmp_path: Path) -> None:
    hist = tmp_path / "series"
    assert cli("history", "append", tree, "--history", hist, "--date", "2026-12-01",
               "--revision", "a1")[0] == 0  # fmt: skip
    assert cli("history", "append", tree, "--history", hist, "--date", "2026-12-02",
               "--revision", "b2")[0] == 0  # fmt: skip
    doc = json.loads((hist / "chain3" / "topas.json").read_text())
    assert [p["date"] for p in doc["points"]] == ["2026-12-01"] * 2 + ["2026-12-02"] * 2
    point = doc["points"][-1]
    assert point["revision"] == "b2" and point["n_seeds"] == 2
    assert point["reduction_mean"][0] == pytest.approx(1 - 20 / 27.5)
    assert point["mean_jct_s"] == [20.0, 20.0, 20.0]
    # appending the same night again replaces its points
    cli("history", "append", tree, "--history", hist, "--date", "2026-12-02", "--revision", "b2")
    assert len(json.loads((hist / "chain3" / "topas.json").read_text())["points"]) == 4
    code, out = cli("history", "check", hist)
    assert code == 0 and "0 TOPAS margin(s) fell" in out
    # a night on which TOPAS got 20% slower: its mean margin 27.3% -> 12.7%, beyond the noise
    worse = slower_topas(tree, tmp_path / "worse", 1.2)
    cli("history", "append", worse, "--history", hist, "--date", "2026-12-03", "--revision", "c3")
    code, out = cli("history", "check", hist)
    assert code == 1 and "DROPPED chain3 (load 0.8" in out and "mean margin 27.3% -> 12.7%" in out
    code, out = cli("history", "plot", hist, "--out", tmp_path / "trend")
    assert code == 0 and (tmp_path / "trend" / "chain3.png").stat().st_size > 1000
    assert (tmp_path / "trend" / "chain3.svg").is_file()


def test_bad_history(tmp_path: Path) -> None:
    code, out = cli("history", "check", tmp_path / "none")
    assert code == 2 and "no history here" in out
    (tmp_path / "h" / "w").mkdir(parents=True)
    (tmp_path / "h" / "w" / "topas.json").write_text("{")
    code, out = cli("history", "check", tmp_path / "h")
    assert code == 2 and "unreadable history series" in out
