"""benchmarks/bench_decisions_history.py: each revision's own decision benchmark, from a
temporary worktree that is removed afterwards; a bad revision is a one-line error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_decisions_history.py"


def worktrees() -> int:
    out = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return len(out.splitlines())


def test_runs_a_revision_and_removes_its_worktree(tmp_path: Path) -> None:
    before = worktrees()
    out = tmp_path / "history.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "HEAD", "--rounds", "1", "--waiting", "16", "--agents",
         "2", "--repeats", "3", "--json", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    assert [r["revision"] for r in doc["revisions"]] == [head]
    (cell,) = doc["revisions"][0]["rounds"]
    assert 0 < cell["median_ms"] <= cell["p99_ms"]
    assert f"round 1 {head}" in proc.stdout
    assert worktrees() == before


def test_unknown_revision_is_one_line_error() -> None:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "no-such-revision-xyz"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "not a revision" in proc.stderr
    assert "Traceback" not in proc.stderr
