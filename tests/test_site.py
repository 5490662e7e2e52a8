"""`topas-bench site`: pages from run trees and report directories, every asset local, the
regime section only where a grid exists, bad input refused; and (slow) the site in a real
browser: headless Chromium loads every page from disk and sees no missing image, style sheet,
script or link, and the index's screenshot is not blank."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
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
    assert "site of evaluation, reference: 5 pages" in output
    return out


class Refs(HTMLParser):
    """Every href and src of a page, and its elements' ids."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.ids: set[str] = set()
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        for k, v in attrs:
            if k in ("href", "src") and v:
                self.refs.append(v)
            if k == "id" and v:
                self.ids.add(v)


def page(site: Path, name: str) -> tuple[str, Refs]:
    text = (site / name).read_text()
    refs = Refs()
    refs.feed(text)
    return " ".join(text.split()), refs


def test_pages_and_every_reference_is_a_local_file(site: Path) -> None:
    pages = sorted(p.name for p in site.glob("*.html"))
    assert pages == ["ablations.html", "fidelity.html", "history.html", "index.html",
                     "workload-chain3.html"]  # fmt: skip
    for name in pages:
        text, refs = page(site, name)
        assert "topas-bench site" in text and "rewrites it from the result files" in text
        assert "script" not in refs.tags
        for ref in refs.refs:
            assert not ref.startswith(("http:", "https:", "//", "/")), (name, ref)
            target, _, frag = ref.partition("#")
            if target:
                assert (site / target).is_file(), (name, ref)
            if frag:
                assert frag in (refs.ids if not target else page(site, target)[1].ids), ref
    assert len(list((site / "img").rglob("*.png"))) >= 10


def test_headline_is_the_first_source_against_the_best_of_all(site: Path) -> None:
    text, _ = page(site, "index.html")
    first, second = text.index("The evaluation"), text.index("The reference")
    assert first < second
    # chain3's main setting (most schedulers: load 0.8, KV 18,692): topas 20 vs lpm 27.5
    assert "+27.3% [+20.0, +33.3]" in text and "lpm 27.5 s" in text
    assert "27.5% / 31.7%" in text  # the paper's, beside
    for fact in ("a100-qwen32b", "engine sim", "abc123", "0,1", "fcfs, lpm",
                 "topas-bench sweep --config evaluation.toml --out runs/eval"):  # fmt: skip
        assert fact in text, fact
    # two seeds: below the protocol's minimum (verdict.MIN_SEEDS), so no win is marked even
    # though the interval is above zero (an uncorrected interval is no verdict)
    assert 'class="data row0 col3 win"' not in text


def test_headline_marks_the_protocols_verdict() -> None:
    import pandas as pd

    from topas_bench.analysis.site.tables import verdict

    row = pd.Series({"workload": "dag4", "group_label": "load 0.8", "best_any_mean": "lpm",
                     "best_any_p99": "spf"})  # fmt: skip
    table = pd.DataFrame([
        {"workload": "dag4", "group_label": "load 0.8", "other": "lpm", "metric": "mean",
         "verdict": "win"},
        {"workload": "dag4", "group_label": "load 0.8", "other": "spf", "metric": "p99",
         "verdict": "tie"},
        {"workload": "dag4", "group_label": "load 0.8", "other": "spf", "metric": "mean",
         "verdict": "loss"},
    ])  # fmt: skip
    assert verdict(table, row, "mean") == "win"
    assert verdict(table, row, "p99") == ""  # a tie is not marked
    assert verdict(pd.DataFrame(), row, "mean") == ""  # no protocol table: no verdict


def test_workload_page_draws_what_each_source_holds(site: Path) -> None:
    text, refs = page(site, "workload-chain3.html")
    assert 'id="regime"' in text and "img/evaluation/regime_chain3.png" in refs.refs
    # the report-only source names what needs its runs; the run tree draws them
    assert text.count("Not drawn:") == 2 and "--runs evaluation=DIR" in text
    for fig in ("jct_cdf_chain3", "timeline_chain3", "load_chain3"):
        assert f"img/reference/{fig}.png" in refs.refs
    assert "img/evaluation/load_chain3.png" in refs.refs  # load curves from the rows
    # every setting's table: 4 settings in the evaluation, 2 in the reference
    assert text.count("<details") - text.count("Calls (request level)") == 6
    assert "rate 0.2/s, KV 28,000" in text


def test_ablations_fidelity_and_history(site: Path) -> None:
    text, refs = page(site, "ablations.html")
    assert "topas-base" in text and "img/reference/ablation.png" in refs.refs
    text, _ = page(site, "fidelity.html")
    assert "topas-bench fidelity -w chain3 -s fcfs,topas -n 4" in text
    assert "fidelity/fidelity.json" in text and "topas &lt; fcfs" in text
    text, refs = page(site, "history.html")
    assert "2 night(s)" in text and "img/history/chain3.png" in refs.refs
    assert "No TOPAS margin fell" in text


def test_a_run_tree_alone_without_grid_has_no_regime_section(results: Path, tmp_path: Path) -> None:
    code, output = cli(results / "reference", "--out", tmp_path / "s")
    assert code == 0, output
    text, _ = page(tmp_path / "s", "workload-chain3.html")
    assert 'id="regime"' not in text and "Not drawn" not in text
    assert not (tmp_path / "s" / "fidelity.html").exists()  # nothing about fidelity here


@pytest.mark.slow
def test_rebuild_is_identical_and_replaces_the_old_site(results: Path, tmp_path: Path) -> None:
    out = tmp_path / "s"
    assert cli(results, "--out", out)[0] == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (out / "stale.html").write_text("old")
    assert cli(results, "--out", out)[0] == 0
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.slow
def test_runs_behind_a_report_draw_its_cdfs(results: Path, tmp_path: Path) -> None:
    grid = results.parent / "runs-eval"
    code, output = cli(results, "--out", tmp_path / "s", "--runs", f"evaluation={grid}")
    assert code == 0, output
    text, refs = page(tmp_path / "s", "workload-chain3.html")
    assert "Not drawn" not in text and "img/evaluation/jct_cdf_chain3.png" in refs.refs
    assert "img/evaluation/timeline_chain3.png" in refs.refs
    assert "which reproduce the report" in text
    # runs that do not give the report's numbers (other code, other settings) are refused
    other = tmp_path / "other"
    shutil.copytree(grid, other)
    stretch(next((other / "chain3" / "topas").glob("*-s0-*")), 1.5)
    code, output = cli(results, "--out", tmp_path / "s2", "--runs", f"evaluation={other}")
    assert code == 2 and "its runs do not reproduce the report" in output, output
    assert "topas: mean_jct_s" in output


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
    cases = [
        ((tmp_path / "missing", "--out", tmp_path / "o1"), "not a directory of results"),
        ((tmp_path / "empty", "--out", tmp_path / "o2"), "nothing to show"),
        ((results, "--out", foreign), "not a site written by `topas-bench site`"),
        ((bad_toml, "--out", tmp_path / "o3"), "names nope, not in"),
        ((results, "--out", tmp_path / "o4", "--runs", f"nope={tmp_path}"), "no source 'nope'"),
        ((results, "--out", tmp_path / "o5", "--runs", "evaluation=/no/such"), "not a directory"),
        ((bad_csv, "--out", tmp_path / "o6"), "not a report.csv"),
        ((results, "--out", tmp_path / "o7", "--runs", f"reference={tmp_path}"), "own runs"),
    ]
    for args, message in cases:
        code, output = cli(*args)
        assert code == 2 and message in output and "Traceback" not in output, (args, output)
    assert (foreign / "keep.txt").read_text() == "not a site"  # never deleted


def test_jinja2_is_imported_only_by_the_site() -> None:
    pkg = ROOT / "src" / "topas_bench"
    importers = set()
    for f in pkg.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])  # fmt: skip
            if any(n.split(".")[0] == "jinja2" for n in names):
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


@pytest.mark.slow
def test_every_page_loads_in_chromium(site: Path, tmp_path: Path) -> None:
    shots = Path(os.environ.get("TOPAS_SITE_SHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    with Browser(chromium()) as b:
        pages = crawl(b, site / "index.html", shots)
    assert {u.rsplit("/", 1)[-1] for u in pages} == {p.name for p in site.glob("*.html")}
    for url, p in pages.items():
        assert p.problems() == [], url
        assert [s.rsplit("/", 1)[-1] for s in p.probe["styles"]] == ["style.css"], url
        assert p.probe["styled"] == "sticky", url  # the style sheet applied
    assert pages[(site / "index.html").resolve().as_uri()].probe["images"] >= 1
    not_blank(shots / "index.png")


@pytest.mark.slow
def test_the_browser_check_sees_a_missing_image_and_a_broken_link(
    site: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(site, broken)
    (broken / "img" / "reference" / "jct_relative.png").unlink()
    index = broken / "index.html"
    index.write_text(index.read_text().replace("</main>", '<a href="gone.html">x</a></main>'))
    with Browser(chromium()) as b:
        pages = crawl(b, index)
    problems = [x for p in pages.values() for x in p.problems()]
    assert any("jct_relative.png" in x and "ERR_FILE_NOT_FOUND" in x for x in problems), problems
    assert any("gone.html" in x and "ERR_FILE_NOT_FOUND" in x for x in problems), problems
    assert any("image did not load: img/reference/jct_relative.png" in x for x in problems)


@pytest.mark.slow
def test_the_committed_site_loads_in_chromium(tmp_path: Path) -> None:
    committed = ROOT / "results" / "site"
    if not (committed / "index.html").is_file():
        pytest.skip("no committed site (make figures writes results/site)")
    with Browser(chromium()) as b:
        pages = crawl(b, committed / "index.html", tmp_path)
    assert len(pages) == len(list(committed.glob("*.html")))
    for url, p in pages.items():
        assert p.problems() == [], url
    not_blank(tmp_path / "index.png")
