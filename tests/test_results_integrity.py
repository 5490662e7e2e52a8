"""Corrupt, partial and stale results (issue 13): cells are written whole or not at all,
verified before reuse, and a report never mixes in a bad cell or another code revision's
without being told to."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from results_fixture import identity, write_fixture, write_one
from topas_bench import results
from topas_bench.analysis.collect import collect
from topas_bench.cell import write
from topas_bench.cell.stored import check_cell
from topas_bench.cell.write import LEFTOVER_AGE_S
from topas_bench.cli import app
from topas_bench.results import RESULTS_FORMAT, read_meta

TINY = ["-w", "chain3", "-s", "fcfs,lpm", "--rate", "0.05", "--seeds", "0,1", "-n", "5"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_fixture(tmp_path_factory.mktemp("results"))


def copy(tree: Path, tmp_path: Path) -> Path:
    root = tmp_path / "r"
    shutil.copytree(tree, root)
    return root


def invoke(*args: str | Path) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


# -- writing -------------------------------------------------------------------------------------
def test_run_json_records_format_and_row_counts(tree: Path) -> None:
    meta = read_meta(identity("fcfs", 0).run_dir(tree))
    assert meta["results_format"] == RESULTS_FORMAT
    assert meta["rows"] == {"requests": 12, "tasks": 4, "timeline": 4, "decisions": 3}


def test_a_failed_write_leaves_no_cell_and_no_leftovers(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = pd.DataFrame.to_parquet
    written: list[str] = []

    def fail_on_third(self: pd.DataFrame, path: Any, *a: Any, **k: Any) -> Any:
        if len(written) == 2:
            raise OSError(28, "No space left on device")
        written.append(str(path))
        return real(self, path, *a, **k)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", fail_on_third)
    with pytest.raises(OSError, match="No space"):
        write_one(tmp_path, "fcfs", 0, [1, 2, 3, 4])
    assert written and all("/." in w for w in written)  # into a hidden temporary directory
    assert list(tmp_path.rglob("*.parquet")) == [] and list(tmp_path.rglob("run.json")) == []
    cell_parent = identity("fcfs", 0).run_dir(tmp_path).parent
    assert list(cell_parent.iterdir()) == []


def test_rewriting_a_cell_replaces_it_and_keeps_other_files(tmp_path: Path) -> None:
    d = write_one(tmp_path, "fcfs", 0, [1, 2, 3, 4])
    (d / "partial.jsonl").write_text('{"journal": 1}\n')  # e.g. the SGLang runner's journal
    truncate(d / "timeline.parquet")
    assert check_cell(d) is not None
    write_one(tmp_path, "fcfs", 0, [5, 6, 7, 8])
    assert check_cell(d) is None
    assert (d / "partial.jsonl").read_text() == '{"journal": 1}\n'
    assert pd.read_parquet(d / "tasks.parquet")["jct_s"].tolist() == [5, 6, 7, 8]
    assert sorted(p.name for p in d.parent.iterdir()) == [d.name]  # nothing set aside remains


SLOW_WRITER = """
import sys, time
import pandas as pd
sys.path.insert(0, {tests!r})
real = pd.DataFrame.to_parquet
def slow(self, path, *a, **k):
    real(self, path, *a, **k)
    print("wrote", path, flush=True)
    time.sleep(60)
pd.DataFrame.to_parquet = slow
from results_fixture import write_one
write_one(__import__("pathlib").Path({root!r}), "fcfs", 0, [1, 2, 3, 4])
"""


def test_a_killed_writer_never_leaves_a_cell_that_looks_complete(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    code = SLOW_WRITER.format(tests=str(Path(__file__).parent), root=str(root))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("wrote")
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # mid-cell: one table written, three to go
        proc.wait()
    cell = identity("fcfs", 0).run_dir(root)
    assert not cell.exists()
    (left,) = cell.parent.iterdir()  # the killed writer's temporary directory
    assert left.name.startswith(f".{cell.name}.tmp-")
    with pytest.raises(Exception, match="no finished runs"):
        collect(root)  # not taken for a run, not even a partial one
    write_one(root, "fcfs", 0, [1, 2, 3, 4])  # its writer is gone: the next writer clears it
    assert [p.name for p in cell.parent.iterdir()] == [cell.name] and check_cell(cell) is None
    # a writer at work on this machine keeps its own; one of unknown writer (another machine's,
    # or named before writers were) is cleared only once older than LEFTOVER_AGE_S
    live = cell.with_name(f".{cell.name}.tmp-{os.getpid()}x{write._machine()}-abc")
    unknown = cell.with_name(f".{cell.name}.tmp-k1d2")
    live.mkdir()
    unknown.mkdir()
    write_one(root, "fcfs", 0, [1, 2, 3, 4])
    assert sorted(p.name for p in cell.parent.iterdir()) == sorted(
        [cell.name, live.name, unknown.name]
    )
    aged = time.time() - LEFTOVER_AGE_S - 1
    os.utime(unknown, (aged, aged))
    write_one(root, "fcfs", 0, [1, 2, 3, 4])
    assert sorted(p.name for p in cell.parent.iterdir()) == sorted([cell.name, live.name])
    assert check_cell(cell) is None


def test_two_writers_of_one_cell_both_succeed(tmp_path: Path, monkeypatch: Any) -> None:
    """Parallel tuning workers can run one identity at once: the second to finish keeps the
    first's cell (the same results: a cell is a function of its identity) and fails nothing."""
    root = tmp_path / "runs"
    write_one(root, "fcfs", 0, [1, 2, 3, 4])
    cell = identity("fcfs", 0).run_dir(root)
    first = cell.with_name("first-copy")
    os.rename(cell, first)
    real_rename = os.rename

    def other_writer_first(src: Any, dst: Any) -> None:  # the other writer wins the race
        if Path(dst) == cell and not cell.exists():
            real_rename(first, cell)
        real_rename(src, dst)

    monkeypatch.setattr(write.os, "rename", other_writer_first)
    write_one(root, "fcfs", 0, [1, 2, 3, 4])
    assert [p.name for p in cell.parent.iterdir()] == [cell.name] and check_cell(cell) is None


# -- verifying -----------------------------------------------------------------------------------
def as_format_2(d: Path) -> None:
    """Make `d` a cell as results format 2 wrote it: no digests."""
    meta = json.loads((d / "run.json").read_text())
    del meta["digests"]
    (d / "run.json").write_text(json.dumps({**meta, "results_format": 2}))


DAMAGE = [
    (lambda d: truncate(d / "requests.parquet"), "requests.parquet: unreadable table"),
    (lambda d: (d / "decisions.parquet").unlink(), "decisions.parquet is missing"),
    (lambda d: (d / "run.json").write_text("{"), "unreadable run.json"),
    (lambda d: (d / "run.json").unlink(), "unfinished"),
    (
        lambda d: (
            pd.read_parquet(d / "timeline.parquet").head(1).to_parquet(d / "timeline.parquet")
        ),
        "timeline.parquet has 1 rows, run.json records 4",
    ),
]


@pytest.mark.parametrize(("damage", "reason"), DAMAGE)
@pytest.mark.parametrize("fmt", [2, RESULTS_FORMAT])
def test_check_cell_names_what_is_wrong(
    tree: Path, tmp_path: Path, damage: Any, reason: str, fmt: int
) -> None:
    root = copy(tree, tmp_path)
    d = identity("lpm", 1).run_dir(root)
    if fmt == 2:
        as_format_2(d)
    elif "parquet" in reason and "missing" not in reason:  # a changed table: its digest fails
        reason = reason.split(".parquet")[0] + ".parquet: does not match its digest"
    assert check_cell(d) is None
    damage(d)
    problem = check_cell(d)
    assert problem is not None and reason in problem and str(root) not in problem
    assert "\n" not in problem


def test_sweep_redoes_a_corrupt_cell_and_only_it(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    assert invoke("sweep", *TINY, "--out", out, "-j", "1").exit_code == 0
    cells = sorted(p.parent for p in out.rglob("run.json"))
    stamps = {d: (d / "run.json").stat().st_mtime_ns for d in cells}
    truncate(cells[1] / "tasks.parquet")
    result = invoke("sweep", *TINY, "--out", out, "-j", "1")
    assert result.exit_code == 0, result.output
    assert "4 cells: 1 ran, 3 already finished, 0 failed" in result.stdout
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("redone: ")]
    assert line.startswith(f"redone: {cells[1].relative_to(out)}: tasks.parquet: does not match")
    assert check_cell(cells[1]) is None and collect(out).problems == []
    after = {d: (d / "run.json").stat().st_mtime_ns for d in cells}
    assert [d for d in cells if after[d] != stamps[d]] == [cells[1]]


# -- reporting -----------------------------------------------------------------------------------
def test_report_refuses_a_bad_cell_unless_told_to_skip_it(tree: Path, tmp_path: Path) -> None:
    root = copy(tree, tmp_path)
    bad = identity("lpm", 1).run_dir(root)
    truncate(bad / "tasks.parquet")
    result = invoke("report", root, "--out", tmp_path / "rep")
    assert result.exit_code == 2 and "Traceback" not in result.output
    rel = bad.relative_to(root)
    assert f"bad run: {rel}: tasks.parquet: does not match its digest" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {root}: 1 bad run")
    assert not (tmp_path / "rep" / "report.md").exists()  # nothing written
    result = invoke("report", root, "--out", tmp_path / "rep", "--skip-bad")
    assert result.exit_code == 0, result.output
    assert f"left out: {rel}" in result.stderr
    assert "different seeds" in (tmp_path / "rep" / "report.md").read_text()  # said, not silent
    for cmd in (("figures", root), ("compare", root, tree)):
        assert invoke(*cmd).exit_code == 2


def test_report_refuses_to_mix_code_revisions(tree: Path, tmp_path: Path) -> None:
    root = copy(tree, tmp_path)
    assert invoke("report", root, "--quiet").exit_code == 0
    for field, value in (("git_revision", "0123456789ab"), ("results_format", 1)):
        d = identity("topas", 0).run_dir(root)
        meta = json.loads((d / "run.json").read_text())
        other = {**meta, field: value}  # as other code wrote it: run.json's digest its own
        other["meta_digest"] = results.meta_digest(other)
        (d / "run.json").write_text(json.dumps(other))
        result = invoke("report", root, "--quiet")
        assert result.exit_code == 2 and "Traceback" not in result.output
        *notes, line = result.stderr.strip().splitlines()  # format 1: read unverified, noted
        assert [n[:6] for n in notes] == ["note: "] * (field == "results_format")
        assert "runs from 2 code versions" in line
        assert f"{value}" in line and "--allow-mixed-revisions" in line
        result = invoke("report", root, "--quiet", "--allow-mixed-revisions")
        assert result.exit_code == 0, result.output
        (d / "run.json").write_text(json.dumps(meta))


def test_the_committed_reference_still_reports(tmp_path: Path) -> None:
    # results/reference was written before run.json recorded formats and row counts
    ref = Path(__file__).parent.parent / "results" / "reference"
    result = invoke("report", ref, "--out", tmp_path, "--quiet")
    assert result.exit_code == 0, result.output
