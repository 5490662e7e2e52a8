"""Stored results are verified before they are reused or reported (issue 30): each table's
digest in run.json, bound to the cell's identity, and run.json's own; the result invariants
checked on read; cells of the format before digests read unverified, never reused.

The issue's silent wrong results, each caught: JCTs rewritten as NaN, 0 and -5; one cell's
tasks.parquet replaced by another's (dag4/fcfs by dag4/topas); one byte flipped in a table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from results_fixture import rewrite
from topas_bench.analysis.collect import collect
from topas_bench.cell.stored import check_cell, load_cell
from topas_bench.cli import app
from topas_bench.results import RESULTS_FORMAT, TABLES

SWEEP = ["-w", "dag4", "-s", "fcfs,topas", "-n", "6", "--rate", "0.1", "--seeds", "0,1", "-j", "1"]


def invoke(*args: str | Path) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "t"
    result = invoke("sweep", *SWEEP, "--out", out)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def root(tree: Path, tmp_path: Path) -> Path:
    shutil.copytree(tree, tmp_path / "t")
    return tmp_path / "t"


def cell(root: Path, scheduler: str, seed: int = 0) -> Path:
    (d,) = (root / "dag4" / scheduler).glob(f"*-s{seed}-*")
    return d


def report_means(root: Path) -> dict[str, float]:
    runs = collect(root).runs
    return runs.groupby("scheduler")["mean_jct_s"].mean().to_dict()


def refused_in_one_line(root: Path, tmp_path: Path, *names: str) -> str:
    """`report` refuses the tree: exit 2, one `bad run:` line per bad cell and an `error:`
    line, each naming the file; nothing written."""
    result = invoke("report", root, "--out", tmp_path / "rep", "--quiet")
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith(f"error: {root}: ") and "bad run" in lines[-1]
    assert all(x.startswith(("bad run: ", "error: ", "note: ")) for x in lines), lines
    for name in names:
        assert name in lines[-1], lines[-1]
    assert not (tmp_path / "rep" / "report.md").exists()
    return lines[-1]


# -- the silent wrong results ------------------------------------------------------------
def test_rewritten_jcts_are_refused_by_report_and_redone_by_sweep(
    root: Path, tmp_path: Path
) -> None:
    before = report_means(root)
    d = cell(root, "topas", 1)
    t = pd.read_parquet(d / "tasks.parquet")
    t.loc[:2, "jct_s"] = [np.nan, 0.0, -5.0]  # same row count
    t.to_parquet(d / "tasks.parquet", index=False)
    assert (check_cell(d) or "").startswith("tasks.parquet: does not match its digest")
    refused_in_one_line(root, tmp_path, "tasks.parquet: does not match its digest")
    result = invoke("sweep", *SWEEP, "--out", root)
    assert result.exit_code == 0, result.output
    assert "4 cells: 1 ran, 3 already finished, 0 failed" in result.stdout
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("redone: ")]
    assert line == (
        f"redone: {d.relative_to(root)}: tasks.parquet: does not match its digest in run.json "
        "(changed since the cell was written, or another cell's table)"
    )
    assert report_means(root) == before  # the redone cell is the true one again


def test_another_cells_table_is_refused_however_it_is_copied(root: Path) -> None:
    fcfs, topas = cell(root, "fcfs"), cell(root, "topas")
    # the table alone
    shutil.copy(topas / "tasks.parquet", fcfs / "tasks.parquet")
    assert (check_cell(fcfs) or "").startswith("tasks.parquet: does not match its digest")
    # with its digest, run.json's own digest made to fit (a digest is bound to its cell)
    topas_digest = json.loads((topas / "run.json").read_text())["digests"]["tasks"]
    m = json.loads((fcfs / "run.json").read_text())
    rewrite(fcfs, digests={**m["digests"], "tasks": topas_digest})
    assert (check_cell(fcfs) or "").startswith("tasks.parquet: does not match its digest")
    # with topas's whole run.json: another cell's identity
    shutil.copy(topas / "run.json", fcfs / "run.json")
    assert "directory does not match its identity" in (check_cell(fcfs) or "")


def test_what_digests_cannot_detect_a_consistent_rewrite_of_run_json(root: Path) -> None:
    """docs/reliability.md: nothing is secret, so a run.json whose digests are computed afresh
    for the tables it now holds passes the digests. The invariants on read still catch a
    tasks table that is not its calls' (here topas's tasks beside fcfs's calls); every table
    of one cell put in another's, with all digests forged, passes: out of scope."""
    fcfs, topas = cell(root, "fcfs"), cell(root, "topas")

    def forge(names: tuple[str, ...]) -> None:  # digests and row counts computed afresh
        rewrite(fcfs, {name: pd.read_parquet(topas / f"{name}.parquet") for name in names})

    forge(("tasks",))
    assert (check_cell(fcfs) or "").startswith("requests.parquet: broken result invariant: ")
    forge(TABLES)
    assert check_cell(fcfs) is None  # a hostile user with the tool's own code: not detected


@pytest.mark.parametrize("name", [*TABLES, "run.json"])
def test_a_flipped_byte_anywhere_is_caught(root: Path, name: str) -> None:
    d = cell(root, "fcfs", 1)
    path = d / (name if name == "run.json" else f"{name}.parquet")
    data = bytearray(path.read_bytes())
    for at in sorted({0, len(data) // 3, len(data) // 2, len(data) - 9}):
        flipped = bytearray(data)
        flipped[at] ^= 0x10
        path.write_bytes(bytes(flipped))
        problem = check_cell(d)
        assert problem is not None, (name, at)
        assert "\n" not in problem and len(problem) < 500
    path.write_bytes(bytes(data))
    assert check_cell(d) is None


def test_run_json_edits_are_caught(root: Path) -> None:
    """run.json's counters feed the report (prefix hits, preemptions): its own digest."""
    d = cell(root, "topas")
    m = json.loads((d / "run.json").read_text())
    m["counters"] = {k: v * 2 for k, v in m["counters"].items()}
    (d / "run.json").write_text(json.dumps(m, indent=1))
    assert check_cell(d) == (
        "run.json: does not match its own digest (edited since the cell was written)"
    )
    m["counters"] = {k: v / 2 for k, v in m["counters"].items()}  # back: layout does not count
    (d / "run.json").write_text(json.dumps(m))
    assert check_cell(d) is None


# -- cells of the format before digests -------------------------------------------------------
def as_format_2(d: Path) -> None:
    m = json.loads((d / "run.json").read_text())
    del m["digests"], m["meta_digest"]
    (d / "run.json").write_text(json.dumps({**m, "results_format": 2}))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda t: t.assign(jct_s=[np.nan, 0.0, -5.0, *t["jct_s"][3:]]), "a time is not finite"),
        (lambda t: t.assign(jct_s=t["jct_s"] * 0.9), "JCT is not finish - arrival"),
        (lambda t: t.assign(task_id=[t["task_id"][1], *t["task_id"][1:]]), "appears twice"),
        (lambda t: t.assign(attained_s=[4.4e78, *t["attained_s"][1:]]), "attained service"),
        (
            lambda t: t.assign(arrival_s=[t["arrival_s"][0] / 2, *t["arrival_s"][1:]]),
            "JCT is not finish - arrival",
        ),
        (lambda t: t.head(5), "5 tasks recorded for 6"),
    ],
)
def test_unverified_cells_are_held_to_the_invariants_on_read(
    root: Path, damage: Any, reason: str
) -> None:
    """The byte flips the issue found kept readable (an arrival halved, an attained service of
    4.4e78, a duplicate task id), on a cell without digests: the invariants catch them."""
    d = cell(root, "fcfs", 1)
    as_format_2(d)
    m = json.loads((d / "run.json").read_text())
    del m["rows"]  # nor row counts: format 1
    (d / "run.json").write_text(json.dumps({**m, "results_format": 1}))
    assert check_cell(d) is None and not load_cell(d).verified
    damage(pd.read_parquet(d / "tasks.parquet")).to_parquet(d / "tasks.parquet", index=False)
    problem = check_cell(d) or ""
    assert problem.startswith("tasks.parquet: broken result invariant: ") and reason in problem


def test_unverified_cells_are_reported_with_a_note_and_never_reused(
    root: Path, tmp_path: Path
) -> None:
    before = report_means(root)
    for s in ("fcfs", "topas"):
        for seed in (0, 1):
            as_format_2(cell(root, s, seed))
    result = invoke("report", root, "--out", tmp_path / "rep", "--quiet")
    assert result.exit_code == 0, result.output
    (note,) = result.stderr.strip().splitlines()
    assert note.startswith(f"note: {root}: 4 runs written before table digests (results format")
    assert report_means(root) == before
    d = cell(root, "topas")
    assert check_cell(d) is None
    assert "written before table digests" in (check_cell(d, require_digests=True) or "")
    result = invoke("sweep", *SWEEP, "--out", root)
    assert "4 cells: 4 ran, 0 already finished" in result.stdout
    assert result.stderr.count("redone: ") == 4
    assert load_cell(d).verified and load_cell(d).results_format == RESULTS_FORMAT
    assert report_means(root) == before


def test_the_committed_reference_reads_verified(tmp_path: Path) -> None:
    """The committed reference is in the current format: every cell's digests check out."""
    ref = Path(__file__).parent.parent / "results" / "reference"
    coll = collect(ref)
    assert coll.problems == [] and coll.unverified == [] and len(coll.runs) > 300


def test_run_redoes_a_changed_cell_and_lists_it(tmp_path: Path) -> None:
    args = ["run", "-w", "dag4", "-s", "fcfs,lpm", "-n", "6", "--out", tmp_path]
    assert invoke(*args).exit_code == 0
    (d,) = (tmp_path / "dag4" / "lpm").iterdir()
    first = pd.read_parquet(d / "tasks.parquet")
    first.assign(jct_s=-5.0).to_parquet(d / "tasks.parquet", index=False)
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert "fcfs (cached)" in result.stdout and "lpm (cached)" not in result.stdout
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("redone: ")]
    assert line.startswith(f"redone: {d}: tasks.parquet: does not match its digest")
    pd.testing.assert_frame_equal(pd.read_parquet(d / "tasks.parquet"), first)


@pytest.mark.parametrize("fmt", [2, RESULTS_FORMAT])
def test_a_huge_sparse_table_costs_neither_memory_nor_time(root: Path, fmt: int) -> None:
    """A table replaced by a 64 GiB file of zeros (sparse: no disk): refused at once, never read
    into memory (the size run.json records is checked first; without digests, the footer)."""
    d = cell(root, "fcfs")
    if fmt == 2:
        as_format_2(d)
    with (d / "timeline.parquet").open("r+b") as f:
        f.truncate(64 << 30)
    problem = check_cell(d) or ""
    if fmt == 2:
        assert problem.startswith("timeline.parquet: unreadable table (")
    else:
        assert problem.startswith("timeline.parquet: does not match its digest")
