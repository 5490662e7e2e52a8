"""The real sglang-router 0.3.2 (PyPI, `make router-env`) in front of N stub SGLang workers on
CPU, driven by `run --engine sglang --replicas N`: the launcher starts the workers and the
router, the workflow client talks to the router, and the cell has the cluster layout. Then the
same request stream is replayed through the simulated cache-aware router (`runners.cluster.
replay`): with the router's own registry order and its in-flight counts as the worker clocks
saw them, every decision outside the ambiguity window must be the real router's.

The stub workers (`runners.sglang.stub_worker`) stand in for `python -m sglang.launch_server`: the
launcher starts them as it would start SGLang. Every process is started by the launcher and
stopped by pid when the cell ends.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from topas_bench.cli import app
from topas_bench.runners.cluster.replay import Observed, agreement
from topas_bench.runners.cluster.tree import TOKENS
from topas_bench.runners.sglang.stub_worker import shim
from topas_bench.workloads.model import Workload
from topas_bench.workloads.pieces import pieces
from topas_bench.workloads.registry import generate
from topas_bench.workloads.trace import dump_workload

REPO = Path(__file__).resolve().parent.parent
WPARAMS = {"prefix_tokens": 300, "input_tokens": 30, "output_tokens": 100, "delay_s": 0.2}
#: Bursts of three tasks 450 ms apart, bursts 5 s apart. Each request takes 100 tokens x 10 ms
#: at its stub worker (about 1.05 s) and its successor comes 200 ms after it ends: within a
#: burst, a stage's three requests overlap (so a balance threshold of 1 spills the third), and
#: every event is meant to lie 100 ms or more from the others, clear of `replay.agreement`'s
#: windows (a busy machine shifts some into them: those decisions are left out).
BURSTS, PER_BURST, GAP_S, BURST_S = 6, 3, 0.45, 5.0

pytestmark = pytest.mark.slow


def _trace(path: Path) -> Workload:
    w = generate("chain3", num_tasks=BURSTS * PER_BURST, seed=0, **WPARAMS)
    tasks = tuple(
        replace(t, arrival_s=(i // PER_BURST) * BURST_S + (i % PER_BURST) * GAP_S)
        for i, t in enumerate(w.tasks)
    )
    w = replace(w, tasks=tasks)
    dump_workload(w, path)
    return w


@pytest.fixture(scope="module")
def router_env() -> Path:
    if shutil.which("make") is None:
        pytest.fail("`make` is needed to build the sglang-router venv (make router-env)")
    subprocess.run(["make", "-s", "router-env"], cwd=REPO, check=True, timeout=900)
    return REPO / ".venvs" / "sglang-router" / "bin" / "python"


@pytest.fixture
def stubs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory whose `sglang.launch_server` is the stub worker, first on PYTHONPATH; the
    workers log every completion into `<tmp>/stub-logs`."""
    shimmed = shim(tmp_path / "stubpkg")
    logs = tmp_path / "stub-logs"
    logs.mkdir()
    monkeypatch.setenv("PYTHONPATH", f"{shimmed}:{REPO / 'src'}")
    monkeypatch.setenv("STUB_LOG_DIR", str(logs))
    monkeypatch.setenv("STUB_TOKEN_S", "0.01")
    return logs


def _run(out: Path, router_python: Path, trace: Path, *extra: str) -> Any:
    args = ["run", "-w", str(trace), "-s", "fcfs", "--engine", "sglang", "--model",
            "org/stub-model", "--replicas", "3", "--router-python", str(router_python),
            "--out", str(out), *extra]  # fmt: skip
    return CliRunner().invoke(app, args)


def _stream(logs: Path, cell: Path, w: Workload, units: str) -> list[Observed]:
    """The requests in the order the client sent them, on the client's clock (`sent_s` to
    `finish_s`), each with the worker its stub log names and the text it logged."""
    meta = json.loads((cell / "run.json").read_text())
    urls = [r["url"] for r in meta["cluster"]["per_replica"]]
    logged = {
        (r["task"], r["stage"]): r
        for f in sorted(logs.glob("*.jsonl"))
        for r in map(json.loads, f.read_text().splitlines())
    }
    req = pd.read_parquet(cell / "requests.parquet").sort_values("sent_s")
    stage = {(t.id, s.id): s for t, s in w.stages()}
    out = []
    for r in req.itertuples():
        log = logged[(r.task_id, r.stage_id)]
        key = (
            log["prompt"]
            if units == "text"
            else tuple(pieces(stage[(r.task_id, r.stage_id)].prompt))
        )
        assert urls.index(log["worker"]) == r.replica  # the answer named the worker that logged it
        out.append(Observed(key, int(r.replica), float(r.sent_s), float(r.finish_s)))
    return out


def _chars(text: str, tokens: int) -> int:
    """Characters of `text` up to the end of its first `tokens` tokens (the stub's tokenizer:
    a word per token, after the BOS the server adds)."""
    ends = [m.end() for m in re.finditer(r"\S+", text)]
    return ends[tokens - 2] if tokens >= 2 else 0


@pytest.mark.parametrize("abs_threshold", [None, 1])
def test_real_router_matches_the_simulated_one(
    router_env: Path, stubs: Path, tmp_path: Path, abs_threshold: int | None
) -> None:
    extra = [] if abs_threshold is None else ["--router-param",
                                              f"balance_abs_threshold={abs_threshold}"]  # fmt: skip
    w = _trace(tmp_path / "bursts.jsonl")
    res = _run(tmp_path / "runs", router_env, tmp_path / "bursts.jsonl", "--router",
               "cache-aware", *extra)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "3 replicas behind router cache-aware" in res.output
    (cell,) = (tmp_path / "runs" / "trace" / "fcfs").iterdir()
    meta = json.loads((cell / "run.json").read_text())
    cluster = meta["cluster"]
    assert cluster["replicas"] == 3 and sorted(cluster["registry_order"]) == [0, 1, 2]
    for name in ("server-0.log", "server-1.log", "server-2.log", "router.log"):
        assert (cell / name).is_file()
    req = pd.read_parquet(cell / "requests.parquet")
    assert len(req) == BURSTS * PER_BURST * 3 and (req["status"] == "ok").all()
    assert (req["sent_s"] >= req["ready_s"]).all() and (req["sent_s"] < req["first_token_s"]).all()
    assert set(req["replica"]) <= {0, 1, 2} and (req["replica"] >= 0).all()  # stubs name it
    tasks = pd.read_parquet(cell / "tasks.parquet")
    assert tasks["replicas_used"].between(1, 3).all()
    served = {r["replica"]: r["requests"] for r in cluster["per_replica"]}
    assert sum(served.values()) == len(req)
    # the decision-by-decision replay: characters, as the real router matches
    params = {} if abs_threshold is None else {"balance_abs_threshold": abs_threshold}
    stream = _stream(stubs, cell, w, "text")
    assert len(stream) == len(req)
    order = cluster["registry_order"]
    got = agreement(stream, 3, order, params)
    assert got.decisions == len(req)
    assert got.clear >= 0.5 * got.decisions, got  # the bursts leave most decisions clear
    assert got.differ == [], got
    # below the balance threshold sglang-router never spills: every agent's calls stay on the
    # worker its first call went to (chain3: stage s<i> is agent i); a threshold of 1 spills
    # the third call of a burst to the least-loaded worker
    per_agent = req.groupby("stage_id")["replica"].nunique()
    assert (per_agent == 1).all() if abs_threshold is None else (per_agent > 1).any()
    # and in tokens, as the simulator matches: the workload's segments, no text. The one
    # difference (docs/cluster.md): the real router's match can run a few characters past the
    # shared segments (two different words may begin alike), into a node another request made,
    # whose worker it then returns; in tokens the match stops at the segment's end.
    tokens = agreement(_stream(stubs, cell, w, "tokens"), 3, order, params, units=TOKENS)
    assert tokens.rate >= 0.85, tokens
    for i, _, _ in tokens.differ:
        assert got.matched[i] > _chars(stream[i].key, tokens.matched[i]), (i, tokens)


def test_round_robin_and_simulator_only_routers(
    router_env: Path, stubs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # answers that do not name their worker, as SGLang's: each call's replica comes from the
    # server logs (the plugin's line per tagged request)
    monkeypatch.setenv("STUB_FINGERPRINT", "0")
    trace = tmp_path / "bursts.jsonl"
    _trace(trace)
    res = _run(tmp_path / "rr", router_env, trace, "--router", "round-robin")
    assert res.exit_code == 0, res.output
    (cell,) = (tmp_path / "rr" / "trace" / "fcfs").iterdir()
    req = pd.read_parquet(cell / "requests.parquet")
    counts = req["replica"].value_counts()
    assert counts.max() - counts.min() <= 1  # round-robin over the three workers
    urls = [r["url"] for r in json.loads((cell / "run.json").read_text())["cluster"]["per_replica"]]
    worker = {
        (r["task"], r["stage"]): urls.index(r["worker"])
        for f in sorted(stubs.glob("*.jsonl"))
        for r in map(json.loads, f.read_text().splitlines())
    }
    assert [worker[(r.task_id, r.stage_id)] for r in req.itertuples()] == list(req["replica"])
    bad = _run(tmp_path / "x", router_env, trace, "--router", "workflow-aware")
    assert bad.exit_code == 2 and "exists only in the simulator" in bad.output
    bad = _run(tmp_path / "x", router_env, trace, "--endpoint", "http://127.0.0.1:1")
    assert bad.exit_code == 2
