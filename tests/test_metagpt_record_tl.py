"""Real MetaGPT main (the TeamLeader/MGX workflow) against the scripted responder (`--workflow tl`)
on 127.0.0.1: the recorder captures TeamLeader -> ProductManager -> TeamLeader -> Architect ->
TeamLeader -> ProjectManager -> TeamLeader -> Engineer2 (one code call per file) -> TeamLeader.

Needs a checkout of MetaGPT's main branch: $TOPAS_METAGPT_SRC, else .venvs/metagpt-main-src. It is
only on GitHub (in no PyPI release), so CI, which reaches PyPI only, skips this test. With a
checkout, the first run builds .venvs/metagpt-main with `make metagpt-main-env` (PyPI only, about
1-2 min, then cached); a recording takes about 30 s.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from scripted_server import running_responder
from topas_bench.cli import app
from topas_bench.workloads.trace import load_workload

REPO = Path(__file__).resolve().parents[1]
IDEA = "Write a 2048 sliding-tile game that runs in the terminal"
SRC_ENV = "TOPAS_METAGPT_SRC"
MEMBERS = {"Alice": "ProductManager", "Bob": "Architect", "Eve": "ProjectManager",
           "Alex": "Engineer2"}  # fmt: skip


@pytest.fixture(scope="module")
def metagpt_src() -> Path:
    src = Path(os.environ.get(SRC_ENV) or REPO / ".venvs" / "metagpt-main-src")
    if not (src / "metagpt" / "roles" / "di" / "team_leader.py").is_file():
        pytest.skip(
            f"no MetaGPT main checkout at {src} (set {SRC_ENV}=DIR): the TeamLeader workflow is "
            "only on GitHub's main branch, in no PyPI release, and CI has no GitHub access"
        )
    return src.resolve()


@pytest.fixture(scope="module")
def main_venv(metagpt_src: Path) -> Path:
    if shutil.which("make") is None:
        pytest.fail("`make` is needed to build the MetaGPT main venv (make metagpt-main-env)")
    subprocess.run(["make", "-s", "metagpt-main-env", f"METAGPT_SRC={metagpt_src}"], cwd=REPO,
                   check=True, timeout=1800)  # fmt: skip
    return REPO / ".venvs" / "metagpt-main"


@pytest.fixture
def tl_responder() -> Iterator[str]:
    with running_responder("--workflow", "tl", "--files", "2") as url:
        yield url


@pytest.mark.slow
def test_record_real_metagpt_main_tl(
    metagpt_src: Path, main_venv: Path, tl_responder: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    calls_path, workload_path = tmp_path / "tl.jsonl", tmp_path / "tl.workload.jsonl"
    res = CliRunner().invoke(
        app,
        ["trace", "record", "--workflow", "tl", "--metagpt-src", str(metagpt_src), "--idea", IDEA,
         "--base-url", tl_responder, "--model", "scripted", "-o", str(calls_path),
         "--workload-output", str(workload_path), "--keep-text", "--metagpt-venv",
         str(main_venv), "--timeout", "600"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    calls = [json.loads(x) for x in calls_path.read_text().splitlines()]
    assert [c["id"] for c in calls] == list(range(len(calls)))
    # every role of the MGX team speaks, each through its own class
    assert {c["role"] for c in calls} == {"Mike", *MEMBERS}
    for c in calls:
        cls = "TeamLeader" if c["role"] == "Mike" else MEMBERS[c["role"]]
        assert c["action"].startswith(cls + ".") or c["action"] == "WriteTasks", c
    # the leader hands over between members: blocks of consecutive calls by role
    blocks = [role for role, _ in itertools.groupby(c["role"] for c in calls)]
    assert blocks == ["Mike", "Alice", "Mike", "Bob", "Mike", "Eve", "Mike", "Alex", "Mike"]
    actions = Counter(c["action"] for c in calls)
    assert actions["TeamLeader._think"] >= 5 and actions["TeamLeader._quick_think"] == 1
    assert actions["Engineer2.write_new_code"] == 2  # one code call per file
    assert actions["WriteTasks"] == 1  # the project manager's tool asks the LLM itself
    for role in ("Alice", "Bob", "Alex"):
        assert any(c["action"].endswith("._think") for c in calls if c["role"] == role)
        assert any(c["action"].endswith("._end") for c in calls if c["role"] == role)
    # depends_on: earlier calls only; the edges of the hand-overs are seen in the prompts
    by_id = {c["id"]: c for c in calls}
    assert all(d < c["id"] for c in calls for d in c["depends_on"])
    code = [c for c in calls if c["action"] == "Engineer2.write_new_code"]
    for c in code:  # the engineer's memory (minus its last think) and the documents it read
        assert any(by_id[d]["action"] == "Engineer2._think" for d in c["depends_on"])
        assert {by_id[d]["role"] for d in c["depends_on"]} >= {"Alice", "Bob", "Mike"}
    assert code[0]["id"] in code[1]["depends_on"]  # the second file sees the first
    for prev, c in itertools.pairwise(calls):
        if prev["role"] == "Mike" and c["role"] in ("Bob", "Eve", "Alex"):  # hand-over: the
            member = [x for x in calls if x["role"] == c["role"]]  # member's first calls read
            assert any(prev["id"] in x["depends_on"] for x in member[:2])  # the instruction
            # (Alice's comes in the leader's first reply, with the whole plan: mostly not hers)
        if c["role"] == "Mike" and prev["role"] in ("Alice", "Bob", "Alex"):
            assert prev["id"] in c["depends_on"]  # the leader reads the member's summary
    write_tasks = next(c for c in calls if c["action"] == "WriteTasks")
    design = [c["id"] for c in calls if c["role"] == "Bob" and "system_design" in c["completion"]]
    assert set(write_tasks["depends_on"]) & set(design)  # the schedule reads the design
    assert {c["tokenizer"] for c in calls} == {"cl100k_base"}
    # imported: a valid workload of one task, every call a stage, within the default KV budget
    w = load_workload(workload_path, kv_budget_tokens=18_692)
    (task,) = w.tasks
    assert [s.id for s in task.stages] == [f"c{i}" for i in range(len(calls))]
    assert {a.name.split("/")[0] for a in w.agents} == {"Mike", *MEMBERS}
    assert f"recorded {len(calls)} calls into {calls_path}" in res.output.replace("\n", "")
