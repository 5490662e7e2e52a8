"""Real MetaGPT 0.8.2, in its own venv, against the scripted responder on 127.0.0.1: the recorder
captures the SOP's call graph PRD -> design -> tasks -> per file code -> review (-> rewrite).

Slow: the first run builds .venvs/metagpt with `make metagpt-env` (about 4-5 min, then cached;
CI builds it here, no hand steps); a recording takes about 20 s.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scripted_server import running_responder
from topas_bench.cli import app
from topas_bench.workloads.trace import load_workload

REPO = Path(__file__).resolve().parents[1]
IDEA = "Write a 2048 sliding-tile game that runs in the terminal"


@pytest.fixture(scope="module")
def metagpt_venv() -> Path:
    if shutil.which("make") is None:
        pytest.fail("`make` is needed to build the MetaGPT venv (make metagpt-env)")
    subprocess.run(["make", "-s", "metagpt-env"], cwd=REPO, check=True, timeout=1800)
    return REPO / ".venvs" / "metagpt"


@pytest.fixture
def responder() -> Iterator[str]:
    """Two code files; reviews alternate LBTM, LGTM: each file is rewritten once."""
    with running_responder("--files", "2", "--reviews", "LBTM,LGTM") as url:
        yield url


@pytest.mark.slow
def test_record_real_metagpt_sop(
    metagpt_venv: Path, responder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    calls_path, workload_path = tmp_path / "calls.jsonl", tmp_path / "sop.workload.jsonl"
    res = CliRunner().invoke(
        app,
        ["trace", "record", "--workflow", "sop", "--idea", IDEA, "--base-url", responder,
         "--model", "scripted", "-o", str(calls_path), "--workload-output", str(workload_path),
         "--keep-text", "--metagpt-venv", str(metagpt_venv), "--timeout", "600"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    calls = [json.loads(x) for x in calls_path.read_text().splitlines()]
    steps = [(c["role"], c["action"]) for c in calls]
    code, review = ("Alex", "WriteCode"), ("Alex", "WriteCodeReview")
    per_file = [code, review, review, review]  # code, review LBTM, rewrite, review LGTM
    assert steps == [
        ("Alice", "WritePRD"), ("Bob", "WriteDesign"), ("Eve", "WriteTasks"),
        *per_file, *per_file,
    ]  # fmt: skip
    assert {c["tokenizer"] for c in calls} == {"cl100k_base"}
    # docs/metagpt-facts.md's system lines (cl100k_base)
    assert [c["system_tokens"] for c in calls[:4]] == [41, 47, 50, 49]
    deps = [c["depends_on"] for c in calls]
    assert deps[:4] == [[], [0], [1], [1, 2]]  # PRD -> design -> tasks -> code(design, tasks)
    assert set(deps[4]) >= {1, 2, 3}  # the review reads the code it reviews
    assert set(deps[5]) >= {3, 4}  # the rewrite reads the code and its review
    assert set(deps[7]) >= {1, 2, 5}  # file 2 reads the rewritten file 1 (legacy code)
    for c in calls:
        assert c["t_end"] >= c["t_start"] and c["completion_tokens"] > 0
        assert len(c["messages"]) == c["n_messages"] == 2  # --keep-text: system + user
        assert c["messages"][0]["role"] == "system"
    # a rewrite shares the review's context: most of its prompt
    rewrite = calls[5]
    assert rewrite["lcp_tokens_with_prev_call_of_same_role"] > 0.5 * rewrite["rest_tokens"]
    assert "LBTM" in calls[4]["completion"] and "LGTM" in calls[6]["completion"]
    # imported: a valid chain of 11 stages that fits the default KV budget
    w = load_workload(workload_path, kv_budget_tokens=18_692)
    (task,) = w.tasks
    assert [s.id for s in task.stages] == [f"c{i}" for i in range(11)]
    assert all(f"c{i - 1}" in s.deps for i, s in enumerate(task.stages) if i)
    assert f"recorded 11 calls into {calls_path}" in res.output.replace("\n", "")
