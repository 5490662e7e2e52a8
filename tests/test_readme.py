"""The README's commands, run as written, so that they cannot drift from the code.

Every `topas-bench ...` line in a fenced code block of README.md and docs/workload-format.md is
either run here (in order, in a scratch directory that sees the repository's `results/` and
`docs/` read-only) and must exit 0, or listed in `NOT_RUN` with the reason. A new command in
the docs is run automatically; an entry of `NOT_RUN` that no longer appears fails the test.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = (ROOT / "README.md", ROOT / "docs" / "workload-format.md")
CLI = [sys.executable, "-c", "from topas_bench.cli import main; main()"]

#: Commands the docs show that need what CI does not have.
NOT_RUN = {
    "topas-bench sweep -c docs/examples/sweep.toml --executor ray --address 10.0.0.5:6379":
        "a Ray cluster (tests/test_ray_address.py)",
    "topas-bench trace record --workflow sop --idea \"a 2048 game\" --base-url "
    "http://HOST:PORT/v1 --model MODEL -o calls.jsonl [--keep-text] [--run-tests]":
        "MetaGPT's venv and a model server (tests/test_metagpt_record.py covers it)",
    "topas-bench trace record --workflow tl --metagpt-src ../MetaGPT --idea \"a 2048 game\" "
    "--base-url http://HOST:PORT/v1 --model MODEL -o tl-calls.jsonl [--keep-text]":
        "a MetaGPT main checkout and a model server (tests/test_metagpt_record_tl.py)",
    "topas-bench run -w metagpt-tl -s all --engine sglang --model "
    "/models/Qwen2.5-32B-Instruct --kv-budget 18692": "a GPU and SGLang",
    "topas-bench run -w dag4 -s topas --engine sglang --endpoint http://127.0.0.1:30000":
        "an SGLang server (tests/test_client_*.py cover the client)",
    "topas-bench serve --scheduler topas -- --model-path /models/Qwen2.5-32B-Instruct "
    "--port 30000": "a GPU and SGLang",
    "topas-bench sweep --config results/paper-regime.toml --out runs/paper-regime --compact -j 2":
        "the paper's regime under the protocol: every scheduler and its tuned form, 10 seeds "
        "(benchmarks/bench_protocol.py times it; tests/test_sweep.py covers sweeps)",
    "topas-bench report runs/paper-regime --tuned results/tuning/tuned.toml --out "
    "results/paper-regime":
        "the paper-regime sweep's output (tests/test_report.py covers reports)",
    "topas-bench fidelity -w chain3,dag4,dag10-wide,metagpt-sop,metagpt-tl -s "
    "fcfs,lpm,spf,parrot,autellix,topas -n 200":
        "60 cells on SGLang's own scheduler, about an hour (tests/test_sglang_cpu_engine.py "
        "runs a small fidelity comparison)",
}  # fmt: skip


def commands(path: Path) -> list[tuple[str, ...]]:
    """`topas-bench` lines of the fenced code blocks as argument lists, continuations joined,
    comments dropped."""
    found, block, pending = [], False, ""
    for line in path.read_text().splitlines():
        if line.lstrip().startswith("```"):
            block = not block
            continue
        if not block:
            continue
        text = pending + line.strip()
        if text.endswith("\\"):
            pending = text[:-1].rstrip() + " "
            continue
        pending = ""
        if text.startswith("topas-bench "):
            found.append(normal(text))
    return found


def normal(cmd: str) -> tuple[str, ...]:
    return tuple(shlex.split(cmd, comments=True))


def documented() -> list[tuple[str, ...]]:
    return [c for path in DOCS for c in commands(path)]


def test_every_not_run_entry_is_still_documented() -> None:
    cmds = documented()
    stale = [c for c in NOT_RUN if normal(c) not in cmds]
    assert not stale, f"listed in NOT_RUN but gone from the docs: {stale}"


@pytest.mark.slow
def test_documented_commands_run(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / "reference").symlink_to(ROOT / "results" / "reference")
    (results / "gpu").symlink_to(ROOT / "results" / "gpu")  # the measured H200 profile
    for toml in (ROOT / "results").glob("*.toml"):
        shutil.copy(toml, results)
    (tmp_path / "docs").symlink_to(ROOT / "docs")
    skip = {normal(c) for c in NOT_RUN}
    ran = 0
    for cmd in documented():
        if cmd in skip:
            continue
        res = subprocess.run([*CLI, *cmd[1:]], cwd=tmp_path, capture_output=True, text=True,
                             timeout=900, check=False)  # fmt: skip
        shown = shlex.join(cmd)
        assert res.returncode == 0, f"`{shown}` exited {res.returncode}:\n{res.stdout}{res.stderr}"
        ran += 1
    assert ran >= 20
