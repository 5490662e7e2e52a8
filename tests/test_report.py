"""Reports and figures against hand-computed values on hand-built result directories."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from results_fixture import DECISION_WALL_S, identity, write_fixture, write_one
from topas_bench.analysis.bootstrap import mean_ci, reduction_ci
from topas_bench.analysis.collect import collect
from topas_bench.analysis.figures import write_figures
from topas_bench.analysis.render import to_markdown, write_report
from topas_bench.analysis.report import build_report
from topas_bench.cli import app
from topas_bench.errors import TopasError


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fixture(tmp_path_factory.mktemp("results"))


def row(rows: pd.DataFrame, scheduler: str, load: float = 0.8) -> pd.Series:
    (i,) = rows.index[(rows["scheduler"] == scheduler) & (rows["load"] == load)]
    return rows.loc[i]


def test_bootstrap_is_seeded_and_matches_two_seed_bounds() -> None:
    # With two seeds, resampled means are a, (a+b)/2 or b (1/4, 1/2, 1/4): the 95% interval
    # is [a, b].
    assert mean_ci(np.array([25.0, 35.0])) == (30.0, 25.0, 35.0)
    assert mean_ci(np.array([7.0])) == (7.0, 7.0, 7.0)
    v = np.array([3.0, 9.0, 4.0, 12.0, 5.0])
    assert mean_ci(v) == mean_ci(v)  # deterministic
    assert mean_ci(v, seed=1) != mean_ci(v)
    r, lo, hi = reduction_ci(np.array([20.0, 20.0]), np.array([30.0, 25.0]))
    assert r == pytest.approx(1 - 20 / 27.5)
    assert (lo, hi) == pytest.approx((1 - 20 / 25, 1 - 20 / 30))


def test_report_values_by_hand(tree: Path) -> None:
    rep = build_report(collect(tree))
    assert rep.problems == [] and rep.notes == []
    fcfs, lpm, topas = (row(rep.rows, s) for s in ("fcfs", "lpm", "topas"))
    assert (fcfs["mean_jct_s"], fcfs["mean_jct_s_lo"], fcfs["mean_jct_s_hi"]) == (30, 25, 35)
    assert fcfs["p50_jct_s"] == pytest.approx(30.0)  # medians 25 and 35
    # numpy's linear p99 of [10, 20, 30, 40] is 30 + 0.97 * 10
    assert fcfs["p99_jct_s"] == pytest.approx((39.7 + 49.7) / 2)
    assert lpm["mean_jct_s"] == 27.5 and topas["mean_jct_s"] == 20
    assert lpm["p99_jct_s"] == pytest.approx((59.1 + 39.7) / 2)
    assert topas["p99_jct_s"] == pytest.approx((39.4 + 29.7) / 2)
    # best baseline per metric: lpm on the mean (27.5 < 30), fcfs on p99 (44.7 < 49.4)
    assert topas["best_baseline_mean"] == "lpm" and topas["best_baseline_p99"] == "fcfs"
    assert topas["reduction_mean"] == pytest.approx(1 - 20 / 27.5)
    assert (topas["reduction_mean_lo"], topas["reduction_mean_hi"]) == pytest.approx((0.2, 1 / 3))
    assert topas["reduction_p99"] == pytest.approx(1 - 34.55 / 44.7)
    assert fcfs["reduction_mean"] == pytest.approx(1 - 30 / 27.5)  # a baseline vs the best
    best = (lpm["reduction_mean"], lpm["reduction_mean_lo"], lpm["reduction_mean_hi"])
    assert best == (0.0, 0.0, 0.0)
    assert (topas["paper_reduction_mean"], topas["paper_reduction_p99"]) == (0.275, 0.317)
    assert np.isnan(row(rep.rows, "topas-base")["paper_reduction_mean"])
    # the paper's figures stand only beside runs in its setting (load 0.8), not at load 0.6
    assert np.isnan(row(rep.rows, "topas", load=0.6)["paper_reduction_mean"])
    # throughput: 4 tasks from the first arrival (0) to the last finish (43 and 53)
    assert fcfs["throughput_tps"] == pytest.approx((4 / 43 + 4 / 53) / 2)
    assert fcfs["prefix_hit_rate"] == pytest.approx((0.5 + 0.3) / 2)
    assert fcfs["preemptions"] == 3.0
    wall = np.array(DECISION_WALL_S)
    assert fcfs["decision_p50_ms"] == pytest.approx(2.0)
    assert fcfs["decision_p99_ms"] == pytest.approx(np.quantile(wall, 0.99) * 1e3)


def test_markdown_and_csv(tree: Path, tmp_path: Path) -> None:
    rep = build_report(collect(tree))
    md = " ".join(to_markdown(rep).split())  # tables are padded: compare words
    assert "## TOPAS vs the best baseline" in md and "## chain3" in md
    assert "| topas | 20.0 [20.0, 20.0] |" in md
    assert "27.3% [20.0%, 33.3%]" in md and "27.5%" in md and "31.7%" in md
    assert "Best baseline: mean JCT `lpm`, p99 JCT `fcfs`." in md
    assert "| lpm | 27.5 [25.0, 30.0] |" in md and "| best | best |" not in md
    md_path, csv_path, stages_path, *rest = write_report(rep, tmp_path)
    assert stages_path.name == "report-stages.csv"
    assert [p.name for p in rest] == ["verdicts.csv", "levers.csv", "runs.csv.gz"]
    assert md_path.read_text().startswith("# topas-bench report")
    csv = pd.read_csv(csv_path)
    assert len(csv) == 7 and {"mean_jct_s_lo", "reduction_p99", "paper_reduction_mean"} <= set(
        csv.columns
    )


def test_figures_written(tree: Path, tmp_path: Path) -> None:
    coll = collect(tree)
    files = write_figures(coll, build_report(coll), tmp_path)
    names = {f.name for f in files}
    # (no `requests` figure: the fixture's runs record no calls)
    stems = ("jct_cdf_chain3", "jct_relative", "jct_vs_load", "timeline_chain3", "ablation")
    for stem in stems:
        assert {f"{stem}.png", f"{stem}.svg"} <= names
    svg = (tmp_path / "jct_relative.svg").read_text()
    assert "95% percentile-bootstrap interval over 2 seeds" in svg  # the intervals are labelled
    assert "best baseline" in svg
    timeline = (tmp_path / "timeline_chain3.svg").read_text()
    for text in ("tasks in the system", "preemptions", "resident", "KV budget 18,692 tokens"):
        assert text in timeline
    for f in files:
        assert f.stat().st_size > 1000
        if f.suffix == ".png":
            assert f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        else:
            assert "<svg" in f.read_text()[:2000]


def test_bad_directories_are_reported_and_left_out(tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "r"
    shutil.copytree(tree, root)
    fcfs0 = identity("fcfs", 0).run_dir(root)
    lpm1, topas1 = identity("lpm", 1).run_dir(root), identity("topas", 1).run_dir(root)
    (fcfs0 / "run.json").unlink()  # killed before it finished
    (lpm1 / "timeline.parquet").write_bytes(b"PAR1 truncated")
    (topas1 / "run.json").write_text("{not json")
    moved = identity("lpm", 0, load=0.6).run_dir(root)
    moved.rename(moved.parent / "renamed-cell")
    coll = collect(root)
    assert len(coll.problems) == 4
    text = "\n".join(coll.problems)
    assert "unfinished run (no run.json)" in text
    assert "timeline.parquet: does not match its digest" in text
    assert "unreadable run.json" in text and "does not match its identity" in text
    assert len(coll.runs) == 14 - 4
    rep = build_report(coll)
    # fcfs lost seed 0, lpm seed 1: the group falls back to its common seeds (none in common
    # for every scheduler here would be empty, so check the note instead of values)
    assert any("different seeds" in n for n in rep.notes)
    assert "## Left out" in to_markdown(rep)


def test_different_seeds_compare_on_common_seeds(tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "r"
    shutil.copytree(tree, root)
    write_one(root, "fcfs", 2, [100, 100, 100, 100], digest="chain3-0.8-2")
    rep = build_report(collect(root))
    assert row(rep.rows, "fcfs")["mean_jct_s"] == 30  # seed 2 left out: others lack it
    assert any("common seeds 0,1" in n for n in rep.notes)


def test_partial_task_table_is_left_out(tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "r"
    shutil.copytree(tree, root)
    d = identity("fcfs", 1).run_dir(root)
    pd.read_parquet(d / "tasks.parquet").head(2).to_parquet(d / "tasks.parquet")
    assert any("tasks.parquet: does not match its digest" in p for p in collect(root).problems)
    meta = json.loads((d / "run.json").read_text())
    meta["results_format"] = 2  # a cell written before run.json recorded digests
    del meta["digests"], meta["meta_digest"]
    (d / "run.json").write_text(json.dumps(meta))
    assert any("tasks.parquet has 2 rows, run.json records 4" in p for p in collect(root).problems)
    del meta["rows"]  # ... or row counts
    (d / "run.json").write_text(json.dumps(meta))
    assert any("2 tasks recorded for 4" in p for p in collect(root).problems)


def test_different_workload_samples_are_an_error(tree: Path, tmp_path: Path) -> None:
    root = tmp_path / "r"
    shutil.copytree(tree, root)
    write_one(root, "lpm", 0, [10, 20, 30, 60], digest="another-sample")
    with pytest.raises(TopasError, match="different workload samples"):
        collect(root)
    result = CliRunner().invoke(app, ["report", str(root)])
    assert result.exit_code == 2
    assert "different workload samples" in result.output and "Traceback" not in result.output


def test_empty_or_missing_tree(tmp_path: Path) -> None:
    with pytest.raises(TopasError, match="not a directory"):
        collect(tmp_path / "nope")
    with pytest.raises(TopasError, match="no finished runs"):
        collect(tmp_path)


def test_report_prints_the_markdown_unwrapped(tree: Path, tmp_path: Path) -> None:
    """Piped, the printed report is report.md as written: no table row broken at the console's
    width (rich wrapped every line at 160 columns when stdout was not a terminal)."""
    result = CliRunner().invoke(app, ["report", str(tree), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    md = (tmp_path / "report.md").read_text()
    assert max(len(x) for x in md.splitlines()) > 160  # long enough that a wrap would show
    assert md.strip() in result.stdout
    rows = [x for x in result.stdout.splitlines() if x.startswith("|")]
    assert rows and all(x.endswith("|") for x in rows)


def test_report_and_figures_cli(tree: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["report", str(tree), "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "27.3% [20.0%, 33.3%]" in result.stdout
    assert (tmp_path / "report.md").is_file() and (tmp_path / "report.csv").is_file()
    result = runner.invoke(app, ["figures", str(tree), "--out", str(tmp_path / "f")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "f" / "jct_relative.png").stat().st_size > 0
    result = runner.invoke(app, ["report", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "not a directory" in result.output
    meta = json.loads((identity("topas", 0).run_dir(tree) / "run.json").read_text())
    assert meta["identity"]["scheduler"] == "topas"
