"""`topas-bench site`: leaderboards whose verdicts are the protocol's, pages from run trees and
report directories (their compact CDF and timeline tables standing in for the runs), every
asset local (plotly.js vendored with its license), the committed site rebuilt byte for byte,
bad input refused; and (slow) the site in a real browser: headless Chromium loads every page
from disk with no console error, every image decodes, no page is wider than the window, the
leaderboard is in the first 1400x900 screen, and the scheduler chooser and the metric switch
change what the charts draw."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from browser import Browser, crawl, find_chromium
from results_fixture import JCTS, stretch, write_fixture, write_one
from topas_bench.analysis.collect import collect
from topas_bench.analysis.history import append
from topas_bench.analysis.render import write_report
from topas_bench.analysis.report import build_report
from topas_bench.cli import app

ROOT = Path(__file__).resolve().parents[1]
SITE_TOML = """
[[source]]
dir = "evaluation"
title = "The evaluation"
about = "A load x KV grid, committed as its report only."
commands = ["topas-bench sweep --config evaluation.toml --out runs/eval"]
engine = "sim"
code = "abc123"

[[source]]
dir = "reference"
title = "The reference"
"""
FIDELITY = {
    "command": "topas-bench fidelity -w chain3 -s fcfs,topas -n 4",
    "cells": [
        {"workload": "chain3", "scheduler": s, "seeds": 1, "mean_jct_sim_s": 20.0,
         "mean_jct_ref_s": 20.0, "mean_jct_diff": 0.0, "p99_jct_sim_s": 40.0,
         "p99_jct_ref_s": 40.0, "p99_jct_diff": 0.0, "hit_rate_diff_pts": 0.0,
         "order_agreement": 1.0}
        for s in ("fcfs", "topas")
    ],
    "rankings": [{"workload": "chain3", "ranking_sim": "topas < fcfs",
                  "ranking_ref": "topas < fcfs", "same": True}],
}  # fmt: skip


def grid_tree(root: Path) -> Path:
    """The fixture tree with a second KV budget at both loads: a load x KV grid."""
    write_fixture(root)
    for load in (0.8, 0.6):
        for name in ("fcfs", "lpm", "topas"):
            for seed, jcts in enumerate(JCTS[name]):
                write_one(root, name, seed, [0.9 * j for j in jcts], load=load, kv=28_000)
    return root


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RESULTS: a report-only source with a grid (its runs elsewhere), a run tree, fidelity and
    benchmark files, a site.toml; plus a two-night history beside it."""
    base = tmp_path_factory.mktemp("site")
    res = base / "results"
    write_fixture(res / "reference")
    grid = grid_tree(base / "runs-eval")
    write_report(build_report(collect(grid)), res / "evaluation")
    (res / "site.toml").write_text(SITE_TOML)
    (res / "fidelity").mkdir()
    (res / "fidelity" / "fidelity.json").write_text(json.dumps(FIDELITY))
    rep = build_report(collect(res / "reference"))
    for night, rev in (("2026-12-01", "a1"), ("2026-12-02", "b2")):
        append(rep, base / "history", night, rev)
    return res


def cli(*args: object) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["site", *(str(a) for a in args)])
    return res.exit_code, " ".join(res.output.split())


@pytest.fixture(scope="module")
def site(results: Path) -> Path:
    out = results.parent / "site"
    code, output = cli(results, "--out", out, "--history", results.parent / "history")
    assert code == 0, output
    assert "site of evaluation, reference: 8 pages" in output
    return out


class Refs(HTMLParser):
    """Every href and src of a page, and its elements' ids."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.ids: set[str] = set()
        self.tags: list[str] = []
        self.scripts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for k, v in attrs:
            if k in ("href", "src") and v:
                self.refs.append(v)
                if tag == "script":
                    self.scripts.append(v)
            if k == "id" and v:
                self.ids.add(v)


def page(site: Path, name: str) -> tuple[str, Refs]:
    text = (site / name).read_text()
    refs = Refs()
    refs.feed(text)
    return " ".join(text.split()), refs


def page_data(site: Path, name: str) -> dict[str, Any]:
    text = (site / name).read_text()
    found = re.search(r'<script type="application/json" id="page-data">(.*?)</script>', text, re.S)
    assert found, name
    out: dict[str, Any] = json.loads(found.group(1))
    return out


def test_pages_and_every_reference_is_a_local_file(site: Path) -> None:
    pages = sorted(p.name for p in site.glob("*.html"))
    assert pages == ["fidelity.html", "history.html", "index.html", "levers.html",
                     "source-evaluation.html", "source-reference.html", "sources.html",
                     "workload-chain3.html"]  # fmt: skip
    for name in pages:
        text, refs = page(site, name)
        assert "topas-bench site" in text and "rewrites this page" in text
        assert refs.scripts == ["vendor/plotly.min.js", "site.js"], name
        for ref in refs.refs:
            assert not ref.startswith(("http:", "https:", "//", "/")), (name, ref)
            target, _, frag = ref.partition("#")
            if target:
                assert (site / target).is_file(), (name, ref)
            if frag:
                assert frag in (refs.ids if not target else page(site, target)[1].ids), ref
    # the chart library is the pinned package's own file, its license beside it
    from importlib import metadata

    dist = metadata.distribution("plotly")
    js = Path(str(dist.locate_file("plotly/package_data/plotly.min.js")))
    assert (site / "vendor" / "plotly.min.js").read_bytes() == js.read_bytes()
    assert "MIT" in (site / "vendor" / "plotly-LICENSE.txt").read_text()


def test_the_leaderboard_ranks_every_scheduler_with_the_protocols_verdict(site: Path) -> None:
    text, refs = page(site, "index.html")
    # chain3's main setting (load 0.8, KV 18,692) in the first source: topas 20, lpm 27.5, fcfs 30
    assert "TOPAS leads on mean JCT (20.0 s)" in text
    board = page_data(site, "index.html")["boards"]["evaluation-chain3"]["mean"]
    assert board["s"] == ["topas", "lpm", "fcfs"] and board["v"] == [20.0, 27.5, 30.0]
    # two seeds: below the protocol's minimum (verdict.MIN_SEEDS), so ties although lpm is
    # slower on both seeds: an uncorrected interval is no verdict
    assert board["verdict"] == ["leader", "tie", "tie"]
    assert board["margin"][1] == "+27.3% [+20.0, +33.3]"
    # the paper's reduction beside TOPAS's (against the best of its five baselines, lpm)
    assert "the paper: <strong>+27.5%</strong>" in text
    assert "(lpm): <strong>+27.3% [+20.0, +33.3]</strong>" in text
    # the table links its data; the CSV holds every metric's ranking
    csv = "data/evaluation/leaderboard-chain3.csv"
    assert csv in refs.refs
    table = pd.read_csv(site / csv)
    assert set(table["metric"]) == {"mean", "p99", "goodput"}
    assert (table[table["metric"] == "mean"].sort_values("rank")["scheduler"]).tolist() == [
        "topas", "lpm", "fcfs"]  # fmt: skip
    # the other source is named on its own page, not mixed into the leaderboard
    assert "source-reference.html" in refs.refs and "The reference" in text


def test_workload_page_draws_from_compact_tables_and_names_other_settings(site: Path) -> None:
    text, _ = page(site, "workload-chain3.html")
    data = page_data(site, "workload-chain3.html")
    # the report-only source has no runs: no distribution or timeline from it (its report
    # was written without compact tables); its levers are drawn from levers.csv
    assert "cdf" not in data and "timeline" not in data
    assert "In another setting: reference" in text and "A different setting" in text
    ref = page_data(site, "source-reference.html")
    assert set(ref["boards"]) == {"reference-chain3"}


def runs_tree(results: Path) -> Path:
    return results.parent / "runs-eval"


def test_a_report_with_compact_tables_draws_what_its_runs_draw(
    results: Path, tmp_path: Path
) -> None:
    """`report` writes cdf.csv.gz and timeline.csv.gz; a site of that report directory alone
    draws the same distribution and timeline as a site of the runs."""
    grid = runs_tree(results)
    rep_dir = tmp_path / "res" / "evaluation"
    res = CliRunner().invoke(app, ["report", str(grid), "--out", str(rep_dir), "--quiet"])
    assert res.exit_code == 0, res.output
    assert (rep_dir / "cdf.csv.gz").is_file() and (rep_dir / "timeline.csv.gz").is_file()
    assert cli(tmp_path / "res", "--out", tmp_path / "from-report")[0] == 0
    from_runs = tmp_path / "runs-only"
    shutil.copytree(grid, from_runs / "evaluation")
    assert cli(from_runs, "--out", tmp_path / "from-runs")[0] == 0
    a = page_data(tmp_path / "from-report", "workload-chain3.html")
    b = page_data(tmp_path / "from-runs", "workload-chain3.html")
    assert a["cdf"] == b["cdf"] and a["timeline"] == b["timeline"]
    topas = next(s for s in a["cdf"]["series"] if s["s"] == "topas")
    # chain3 at load 0.8 (the main setting), both seeds pooled: 10 10 20 40 10 20 20 30
    assert topas["x"][0] == 10.0 and topas["x"][-1] == 40.0
    series = {r["s"]: set(r["series"]) for r in a["timeline"]["runs"]}
    assert set(series) == {"topas", "lpm"}
    assert {"in_system", "waiting", "kv_used_tokens", "preemptions"} <= series["topas"]


def test_levers_fidelity_and_history(site: Path) -> None:
    text, _ = page(site, "levers.html")
    assert "topas-base" in text
    assert "levers" in page_data(site, "levers.html")
    text, _ = page(site, "fidelity.html")
    assert "topas-bench fidelity -w chain3 -s fcfs,topas -n 4" in text
    assert "fidelity/fidelity.json" in text and "topas &lt; fcfs" in text
    text, refs = page(site, "history.html")
    assert "2 night(s)" in text and "img/history/chain3.png" in refs.refs
    assert "No TOPAS margin fell" in text


def test_rebuild_is_identical_and_replaces_the_old_site(results: Path, tmp_path: Path) -> None:
    out = tmp_path / "s"
    assert cli(results, "--out", out)[0] == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (out / "stale.html").write_text("old")
    assert cli(results, "--out", out)[0] == 0
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.slow
def test_the_committed_site_is_what_the_committed_results_build(tmp_path: Path) -> None:
    """`make figures` on a clean clone: the site of results/ equals results/site, file for
    file and byte for byte (the command at each page's foot names its own --out, which is
    the one difference, and is made the same here)."""
    committed = ROOT / "results" / "site"
    out = tmp_path / "site"
    shutil.copytree(ROOT / "results", tmp_path / "results",
                    ignore=shutil.ignore_patterns("site", "reference"))  # fmt: skip
    (tmp_path / "results" / "reference").symlink_to(ROOT / "results" / "reference")
    res = subprocess.run(
        [str(Path(sys.executable).parent / "topas-bench"), "site", "results", "--out",
         "results/site"],
        cwd=tmp_path, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    out = tmp_path / "results" / "site"
    built = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    kept = {p.relative_to(committed).as_posix() for p in committed.rglob("*") if p.is_file()}
    assert built == kept
    differ = [n for n in sorted(built) if (out / n).read_bytes() != (committed / n).read_bytes()]
    assert differ == [], f"rebuilt files differ from results/site: {differ[:5]} (make figures)"


#: The size budget of what results/ commits (README, "Site").
SIZE_BUDGET_MB = {"site": 15.0, "site data per report": 1.0, "results": 60.0}


def test_the_committed_results_stay_within_their_size_budget() -> None:
    def mb(paths: list[Path]) -> float:
        return sum(p.stat().st_size for p in paths if p.is_file()) / 1e6

    results = ROOT / "results"
    assert mb(list((results / "site").rglob("*"))) <= SIZE_BUDGET_MB["site"]
    for d in results.iterdir():
        data = [d / "cdf.csv.gz", d / "timeline.csv.gz"]
        assert mb(data) <= SIZE_BUDGET_MB["site data per report"], d
    assert mb(list(results.rglob("*"))) <= SIZE_BUDGET_MB["results"]


def test_bad_input_is_one_line_and_exit_2(results: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("not a site")
    bad_toml = tmp_path / "bad"
    shutil.copytree(results / "reference", bad_toml / "reference")
    (bad_toml / "site.toml").write_text('[[source]]\ndir = "nope"\n')
    bad_csv = tmp_path / "badcsv"
    (bad_csv / "r").mkdir(parents=True)
    (bad_csv / "r" / "report.csv").write_text("a,b\n1,2\n")
    bad_cdf = tmp_path / "badcdf"
    shutil.copytree(results / "evaluation", bad_cdf / "evaluation")
    (bad_cdf / "evaluation" / "cdf.csv.gz").write_bytes(b"\x1f\x8bnot gzip")
    cases = [
        ((tmp_path / "missing", "--out", tmp_path / "o1"), "not a directory of results"),
        ((tmp_path / "empty", "--out", tmp_path / "o2"), "nothing to show"),
        ((results, "--out", foreign), "not a site written by `topas-bench site`"),
        ((bad_toml, "--out", tmp_path / "o3"), "names nope, not in"),
        ((results, "--out", tmp_path / "o4", "--runs", f"nope={tmp_path}"), "no source 'nope'"),
        ((results, "--out", tmp_path / "o5", "--runs", "evaluation=/no/such"), "not a directory"),
        ((bad_csv, "--out", tmp_path / "o6"), "not a report.csv"),
        ((results, "--out", tmp_path / "o7", "--runs", f"reference={tmp_path}"), "own runs"),
        ((bad_cdf, "--out", tmp_path / "o8"), "cdf.csv.gz: unreadable"),
    ]
    for args, message in cases:
        code, output = cli(*args)
        assert code == 2 and message in output and "Traceback" not in output, (args, output)
    assert (foreign / "keep.txt").read_text() == "not a site"  # never deleted


@pytest.mark.slow
def test_runs_behind_a_report_must_reproduce_it(results: Path, tmp_path: Path) -> None:
    grid = runs_tree(results)
    code, output = cli(results, "--out", tmp_path / "s", "--runs", f"evaluation={grid}")
    assert code == 0, output
    assert "cdf" in page_data(tmp_path / "s", "workload-chain3.html")
    other = tmp_path / "other"
    shutil.copytree(grid, other)
    stretch(next((other / "chain3" / "topas").glob("*-s0-*")), 1.5)
    code, output = cli(results, "--out", tmp_path / "s2", "--runs", f"evaluation={other}")
    assert code == 2 and "its runs do not reproduce the report" in output, output
    assert "topas: mean_jct_s" in output


def test_jinja2_and_plotly_are_used_only_by_the_site() -> None:
    pkg = ROOT / "src" / "topas_bench"
    importers = set()
    for f in pkg.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])  # fmt: skip
            if any(n.split(".")[0] in ("jinja2", "plotly") for n in names):
                importers.add(f.relative_to(pkg).as_posix())
    assert importers == {"analysis/site/__init__.py"}
    code = ("import sys, topas_bench.cli, topas_bench.analysis.figures, "
            "topas_bench.analysis.report; sys.exit('jinja2' in sys.modules)")  # fmt: skip
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- in a real browser ------------------------------------------------------------------------


def chromium() -> str:
    binary = find_chromium()
    if binary is None:
        message = ("no Chromium (chromium-headless-shell or chromium) on PATH: `make browser` "
                   "installs Debian's chromium-headless-shell (as root or with sudo)")  # fmt: skip
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return binary


def not_blank(png: Path) -> None:
    from PIL import Image

    pixels = np.asarray(Image.open(png).convert("L"), dtype=float)
    assert pixels.std() > 10 and len(np.unique(pixels)) > 50, f"{png} looks blank"


#: What the index's first screen must show, and how the controls change the charts.
FIRST_SCREEN = """(() => {
  const board = document.querySelector('table.leaderboard');
  const r = board.getBoundingClientRect();
  return {top: r.top, left: r.left, rows: board.tBodies[0].rows.length};
})()"""
#: Points drawn in the first leaderboard chart (one marker per chosen scheduler).
DRAWN = """(() => {
  const el = document.querySelector('[data-chart="board"]');
  return el && el.data ? el.data[0].y.length : -1;
})()"""
VISIBLE_ROWS = """[...document.querySelector('table.leaderboard').closest('.board')
  .querySelectorAll('table.leaderboard tbody tr')].filter(r => r.offsetParent !== null).length"""


def check_controls(b: Browser, url: str) -> None:
    """The leaderboard in the first 1400x900 screen; choosing schedulers redraws the chart
    and hides rows; the metric switch shows another table."""
    _, session = b.load(url)
    first = b.evaluate(session, FIRST_SCREEN)
    assert 0 <= first["top"] < 900 and first["left"] < 1400, first
    everyone = b.evaluate(session, DRAWN)
    assert everyone >= 3
    b.evaluate(session, "[...document.querySelectorAll('.chooser input')].slice(2)"
                        ".forEach(b => b.click())")  # fmt: skip
    assert b.evaluate(session, DRAWN) == 2
    assert b.evaluate(session, VISIBLE_ROWS) == 2
    b.evaluate(session, "window.topasSite.preset('all')")
    assert b.evaluate(session, DRAWN) == everyone
    b.evaluate(session, "window.topasSite.setMetric('p99')")
    shown = b.evaluate(session, "[...document.querySelectorAll('table.leaderboard')]"
                                ".filter(t => t.offsetParent !== null).map(t => t.id)")  # fmt: skip
    assert shown and all(i.endswith("-p99") for i in shown), shown
    b.close_tab()


@pytest.mark.slow
def test_every_page_loads_in_chromium(site: Path, tmp_path: Path) -> None:
    with Browser(chromium(), width=1400, height=900) as b:
        pages = crawl(b, site / "index.html", tmp_path)
        check_controls(b, (site / "index.html").resolve().as_uri())
    assert {u.rsplit("/", 1)[-1] for u in pages} == {p.name for p in site.glob("*.html")}
    for url, p in pages.items():
        assert p.problems() == [], url
        assert [s.rsplit("/", 1)[-1] for s in p.probe["styles"]] == ["style.css"], url
        assert p.probe["styled"] == "sticky", url  # the style sheet applied
        assert p.probe["charts"] or url.endswith(("fidelity.html", "history.html",
                                                  "sources.html")), url  # fmt: skip
    not_blank(tmp_path / "index.png")


@pytest.mark.slow
def test_the_browser_check_sees_what_breaks(site: Path, tmp_path: Path) -> None:
    """A missing image, a broken link, a missing plotly.js (no chart drawn, a script error)
    and a page wider than the window are each reported."""
    broken = tmp_path / "broken"
    shutil.copytree(site, broken)
    (broken / "img" / "history" / "chain3.png").unlink()
    (broken / "vendor" / "plotly.min.js").unlink()
    index = broken / "index.html"
    index.write_text(
        index.read_text().replace(
            "</main>", '<a href="gone.html">x</a><div style="width:3000px">wide</div></main>'
        )
    )
    with Browser(chromium(), width=1400, height=900) as b:
        pages = crawl(b, index)
    problems = [x for p in pages.values() for x in p.problems()]
    assert any("gone.html" in x and "ERR_FILE_NOT_FOUND" in x for x in problems), problems
    assert any("image did not load: img/history/chain3.png" in x for x in problems), problems
    assert any("plotly.min.js" in x and "ERR_FILE_NOT_FOUND" in x for x in problems), problems
    assert any("a visible chart was not drawn" in x for x in problems), problems
    assert any("wider than the window" in x for x in problems), problems


@pytest.mark.slow
def test_the_committed_site_in_chromium() -> None:
    """Every committed page loads cleanly at 1400x900; the screenshots of the front page and
    a workload page are kept where TOPAS_SITE_SHOTS says (CI uploads them as artifacts)."""
    committed = ROOT / "results" / "site"
    assert (committed / "index.html").is_file(), "no committed site: make figures"
    shots = Path(os.environ.get("TOPAS_SITE_SHOTS", "") or tempfile.mkdtemp())
    shots.mkdir(parents=True, exist_ok=True)
    with Browser(chromium(), width=1400, height=900) as b:
        pages = crawl(b, committed / "index.html", shots)
        check_controls(b, (committed / "index.html").resolve().as_uri())
    assert len(pages) == len(list(committed.glob("*.html")))
    for url, p in pages.items():
        assert p.problems() == [], url
    not_blank(shots / "index.png")
    not_blank(shots / "workload-dag4.png")


# --- the leaderboard's verdicts against the protocol's ------------------------------------------


def synthetic_runs() -> pd.DataFrame:
    """One setting, ten seeds: `a` fastest, TOPAS second, `b` far behind; goodput inverse."""
    rng = np.random.default_rng(7)
    base = 100 + 10 * rng.standard_normal(10)
    rows = []
    for name, scale in (("a", 0.80), ("topas", 0.90), ("b", 1.30)):
        for seed in range(10):
            v = base[seed] * scale * (1 + 0.01 * rng.standard_normal())
            rows.append({
                "workload": "chain3", "engine": "sim", "group_label": "load 0.8",
                "scheduler": name, "scheduler_name": name, "scheduler_params": "{}",
                "seed": seed, "mean_jct_s": v, "p99_jct_s": 2 * v, "goodput_tps": 1 / v,
                "variant": "default",
            })  # fmt: skip
    return pd.DataFrame(rows)


def test_leaderboard_cells_with_topas_are_the_protocols_cells() -> None:
    from topas_bench.analysis.protocol import versus
    from topas_bench.analysis.site.leaderboard import leaderboards, sentence

    runs = synthetic_runs()
    rows = runs.groupby(["workload", "group_label", "scheduler"], as_index=False)[
        ["mean_jct_s", "p99_jct_s", "goodput_tps"]].mean()  # fmt: skip
    table = versus(runs)
    board = leaderboards(runs, rows, table)
    mean = board[board["metric"] == "mean"].set_index("scheduler")
    assert list(mean.sort_values("rank").index) == ["a", "topas", "b"]
    assert mean.loc["a", "verdict"] == "leader"
    # TOPAS trails `a`: the protocol's own cell (TOPAS vs a), its margin and its verdict
    cell = table[(table["other_name"] == "a") & (table["metric"] == "mean")].iloc[0]
    assert mean.loc["topas", "focus_margin"] == pytest.approx(cell["margin"])
    assert mean.loc["topas", "verdict"] == ("loss" if cell["verdict"] == "loss" else "tie")
    assert mean.loc["topas", "margin"] > 0  # the leader's margin over TOPAS
    # `b` against the leader `a`: no TOPAS in the cell, judged in the leaderboard's family
    assert mean.loc["b", "verdict"] == "loss" and mean.loc["b", "margin"] > 0.3
    # goodput: higher is better, the same order
    good = board[board["metric"] == "goodput"].sort_values("rank")
    assert list(good["scheduler"]) == ["a", "topas", "b"]
    assert good.iloc[2]["margin"] > 0
    text = sentence(board, "mean")
    assert text.startswith("a leads on mean JCT") and "TOPAS ranks 2 of 3" in text
