"""`run --engine sglang` end to end against a scripted OpenAI-compatible server on 127.0.0.1:
DAG order and delays, exact lengths, task metadata on the wire, retries, failed requests kept,
the launcher (health wait, logs, restart after a crash), resume after an interrupted run, and
clear errors for an unreachable endpoint, a wrong model path and a server that keeps dying.

The scripted server (FAKE below) answers `/health`, `/v1/models`, `/tokenize` (one token per
space-separated word, plus a BOS) and streaming `/v1/completions`. Put in a directory as
`sglang/launch_server.py`, it is what the launcher starts as `python -m sglang.launch_server`.
The real engines: tests/test_client_vllm.py (vLLM on CPU), tests/test_sglang_adapter.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from topas_bench.cli import app
from topas_bench.runners.sglang.launcher import free_port
from topas_bench.runners.sglang.metadata import decode
from topas_bench.workloads.registry import generate

FAKE = r"""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
model = args[args.index("--model-path") + 1] if "--model-path" in args else "fake-model"
if os.environ.get("TOPAS_SCHEDULER"):
    print(f"topas: scheduler {os.environ['TOPAS_SCHEDULER']!r} installed", file=sys.stderr,
          flush=True)
crash_after = int(os.environ.get("FAKE_CRASH_AFTER", "0"))
marker = os.environ.get("FAKE_MARKER", "") + "." + os.environ.get("TOPAS_SCHEDULER", "x")
if os.environ.get("FAKE_CRASH_ALWAYS") != "1" and os.path.exists(marker):
    crash_after = 0
fail_first = int(os.environ.get("FAKE_FAIL_FIRST", "0"))
fail_stage = os.environ.get("FAKE_FAIL_STAGE", "")
log = os.environ.get("FAKE_REQUEST_LOG")
state = {"completions": 0}


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def log_message(self, *a):
        pass

    def reply(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            return self.reply(200, {})
        if self.path == "/v1/models":
            return self.reply(200, {"data": [{"id": model}]})
        self.reply(404, {"error": "no"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            n = len(body["prompt"].split()) + (1 if body.get("add_special_tokens", True) else 0)
            return self.reply(200, {"count": n, "tokens": list(range(n)), "max_model_len": 4096})
        state["completions"] += 1
        k = state["completions"]
        if crash_after and k > crash_after:
            open(marker, "w").close()
            os._exit(1)
        if log:
            with open(log, "a") as f:
                f.write(json.dumps(body) + "\n")
        meta = json.loads(body.get("custom_params", {}).get("topas", "{}"))
        if k <= fail_first:
            return self.reply(503, {"error": "warming up"})
        if fail_stage and meta.get("stage") == fail_stage:
            return self.reply(400, {"error": "refused"})
        # the model's EOS comes 30 tokens after `min_tokens` unless `ignore_eos`; the cap stops it
        n = body["max_tokens"]
        if not body.get("ignore_eos"):
            n = min(n, body.get("min_tokens", 0) + 30)
        every = (body.get("stream_options") or {}).get("continuous_usage_stats")
        prompt = len(body["prompt"].split()) + 1
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(n):
            time.sleep(0.002)
            ev = {"choices": [{"index": 0, "text": " x"}]}
            if every:
                ev["usage"] = {"prompt_tokens": prompt, "completion_tokens": i + 1}
            try:
                self.wfile.write(b"data: " + json.dumps(ev).encode() + b"\n\n")
                self.wfile.flush()
            except OSError:  # the client left: SGLang aborts the request
                if log:
                    with open(log + ".aborted", "a") as f:
                        f.write(json.dumps({"sent": i}) + "\n")
                return
        usage = {"prompt_tokens": prompt, "completion_tokens": n,
                 "prompt_tokens_details": {"cached_tokens": 3}}
        self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")


print(f"serving {model} on {port}", flush=True)
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
"""

WPARAMS = ["prefix_tokens=24", "input_tokens=8", "output_tokens=6", "delay_s=0.2"]


def _run_args(out: Path, *extra: str, tasks: int = 3, scheduler: str = "fcfs") -> list[str]:
    wp = [x for p in WPARAMS for x in ("--workload-param", p)]
    return ["run", "-w", "dag4", "-s", scheduler, "-n", str(tasks), "--rate", "4",
            "--engine", "sglang", "--out", str(out), *wp, *extra]  # fmt: skip


def _workload(tasks: int = 3):  # type: ignore[no-untyped-def]
    params = {k: json.loads(v) for k, v in (p.split("=") for p in WPARAMS)}
    return generate("dag4", num_tasks=tasks, rate_per_s=4, seed=0, **params)


def _cell(out: Path, scheduler: str = "fcfs") -> Path:
    (cell,) = (out / "dag4" / scheduler).iterdir()
    return cell


@pytest.fixture
def fake_pkg(tmp_path: Path) -> Path:
    pkg = tmp_path / "fakepkg" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(FAKE)
    return pkg.parent


@pytest.fixture
def endpoint(fake_pkg: Path, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "FAKE_REQUEST_LOG": str(tmp_path / "requests.jsonl")}
    proc = subprocess.Popen(
        [sys.executable, str(fake_pkg / "sglang" / "launch_server.py"), "--port", str(port)],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("serving")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()  # by pid
        proc.wait(timeout=10)


def test_endpoint_run_dag_order_lengths_metadata(endpoint: str, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    res = CliRunner().invoke(app, _run_args(out, "--endpoint", endpoint))
    assert res.exit_code == 0, res.output
    assert "engine sglang, endpoint" in res.output
    cell = _cell(out)
    meta = json.loads((cell / "run.json").read_text())
    assert meta["identity"]["engine"] == "sglang"
    req = pd.read_parquet(cell / "requests.parquet")
    tasks = pd.read_parquet(cell / "tasks.parquet")
    w = _workload()
    assert len(req) == 12 and len(tasks) == 3
    assert (req["status"] == "ok").all()
    assert (req["output_tokens"] == 6).all()
    expect = {(t.id, s.id): s.prompt_tokens for t, s in w.stages()}
    assert {(r.task_id, r.stage_id): r.prompt_tokens for r in req.itertuples()} == expect
    assert (req["cached_tokens"] == 3).all()
    assert (req["first_token_s"] >= req["ready_s"]).all()
    assert (req["finish_s"] >= req["first_token_s"]).all()
    for task in w.tasks:
        rows = req[req["task_id"] == task.id].set_index("stage_id")
        arrival = float(tasks.set_index("task_id").loc[task.id, "arrival_s"])
        for st in task.stages:
            after = max((rows.loc[d, "finish_s"] for d in st.deps), default=arrival)
            assert rows.loc[st.id, "ready_s"] >= after + st.delay_s - 0.01, (task.id, st.id)
        assert tasks.set_index("task_id").loc[task.id, "finish_s"] == rows["finish_s"].max()
    # arrivals keep the workload's spacing
    gaps = tasks.sort_values("arrival_s")["arrival_s"].diff().dropna().to_numpy()
    want = pd.Series([t.arrival_s for t in w.tasks]).diff().dropna().to_numpy()
    assert abs(gaps - want).max() < 0.05
    # task metadata on the wire, parsed by the plugin's own decoder
    sent = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert all(b["ignore_eos"] and b["max_tokens"] == 6 and b["stream"] for b in sent)
    metas = [decode(b["custom_params"]) for b in sent]
    assert all(m is not None and why is None for m, why in metas)
    d = metas[0][0]
    assert d is not None and [s.id for s in d.stages] == ["s0", "s1", "s2", "s3"]
    assert d.prefix_tokens == 24 and d.segments[0].key == f"agent:{d.agent}"
    # prompts: identical prefix text per agent, task text differs
    by_agent: dict[str, set[str]] = {}
    for b, (m, _) in zip(sent, metas, strict=True):
        assert m is not None
        by_agent.setdefault(m.agent, set()).add(" ".join(b["prompt"].split()[:23]))
    assert all(len(v) == 1 for v in by_agent.values()), by_agent
    # a second run is the cached cell
    again = CliRunner().invoke(app, _run_args(out, "--endpoint", endpoint))
    assert again.exit_code == 0 and "(cached)" in again.output


def test_retries_transient_errors(fake_pkg: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {**os.environ, "FAKE_FAIL_FIRST": "3"}
    proc = subprocess.Popen(
        [sys.executable, str(fake_pkg / "sglang" / "launch_server.py"), "--port", str(port)],
        env=env, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().startswith("serving")
        out = tmp_path / "runs"
        res = CliRunner().invoke(
            app, _run_args(out, "--endpoint", f"http://127.0.0.1:{port}", tasks=2)
        )
        assert res.exit_code == 0, res.output
        req = pd.read_parquet(_cell(out) / "requests.parquet")
        assert (req["status"] == "ok").all() and len(req) == 8
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_failed_request_recorded_not_dropped(
    fake_pkg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_FAIL_STAGE", "s1")  # B refuses (HTTP 400: not retried)
    monkeypatch.setenv("PYTHONPATH", str(fake_pkg))
    model = tmp_path / "model"
    model.mkdir()
    out = tmp_path / "runs"
    res = CliRunner().invoke(app, _run_args(out, "--model", str(model), tasks=2))
    assert res.exit_code == 2
    assert "2 of 2 tasks failed under 'fcfs'" in res.output
    assert "HTTP 400" in res.output and "rerun the same command" in res.output
    cell = _cell(out)
    assert not (cell / "run.json").exists()
    req = pd.read_parquet(cell / "requests.parquet").set_index(["task_id", "stage_id"])
    assert len(req) == 8
    for t in ("t0000", "t0001"):
        assert req.loc[(t, "s0"), "status"] == "ok" and req.loc[(t, "s2"), "status"] == "ok"
        assert req.loc[(t, "s1"), "status"].startswith("error: ")
        assert req.loc[(t, "s3"), "status"] == "skipped: a dependency failed"
    assert "topas: scheduler 'fcfs' installed" in (cell / "server.log").read_text()


def test_launcher_restarts_a_crashed_server(
    fake_pkg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(fake_pkg))
    monkeypatch.setenv("FAKE_CRASH_AFTER", "5")  # dies once per scheduler, mid-run
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "crashed"))
    model = tmp_path / "model"
    model.mkdir()
    out = tmp_path / "runs"
    t0 = time.monotonic()
    res = CliRunner().invoke(app, _run_args(out, "--model", str(model), scheduler="fcfs,topas"))
    assert res.exit_code == 0, res.output
    for scheduler in ("fcfs", "topas"):
        cell = _cell(out, scheduler)
        meta = json.loads((cell / "run.json").read_text())
        assert meta["counters"]["server_restarts"] == 1
        log = (cell / "server.log").read_text()
        assert log.count("=== start") == 2 and "sglang.launch_server" in log
        assert f"topas: scheduler {scheduler!r} installed" in log
        req = pd.read_parquet(cell / "requests.parquet")
        assert (req["status"] == "ok").all() and len(req) == 12
    assert time.monotonic() - t0 < 120


def test_server_that_keeps_dying_then_resume(
    fake_pkg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(fake_pkg))
    monkeypatch.setenv("FAKE_CRASH_AFTER", "6")
    monkeypatch.setenv("FAKE_CRASH_ALWAYS", "1")
    monkeypatch.setenv("FAKE_MARKER", str(tmp_path / "crashed"))
    model = tmp_path / "model"
    model.mkdir()
    out = tmp_path / "runs"
    args = _run_args(out, "--model", str(model), tasks=6)
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "the server died 3 times; partial results are kept" in res.output
    journal = _cell(out) / "partial.jsonl"
    done_before = {json.loads(x)["task"][0] for x in journal.read_text().splitlines()}
    assert 0 < len(done_before) < 6
    # the server is fixed: the rerun resumes, running only what is left
    monkeypatch.delenv("FAKE_CRASH_ALWAYS")
    monkeypatch.setenv("FAKE_CRASH_AFTER", "0")
    monkeypatch.setenv("FAKE_REQUEST_LOG", str(tmp_path / "resume.jsonl"))
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    meta = json.loads((_cell(out) / "run.json").read_text())
    assert meta["resumed"] is True and meta["summary"]["tasks"] == 6
    sent = [json.loads(x) for x in (tmp_path / "resume.jsonl").read_text().splitlines()]
    resumed_tasks = {decode(b["custom_params"])[0].task_id for b in sent}  # type: ignore[union-attr]
    assert resumed_tasks.isdisjoint({t for t in done_before if _ok(journal, t)})
    assert len(pd.read_parquet(_cell(out) / "tasks.parquet")) == 6


def _ok(journal: Path, task_id: str) -> bool:
    recs = [json.loads(x) for x in journal.read_text().splitlines()]
    return any(r["task"][0] == task_id and r["task"][-1] for r in recs)


def test_unreachable_endpoint_is_a_clear_error(tmp_path: Path) -> None:
    port = free_port()
    res = CliRunner().invoke(app, _run_args(tmp_path, "--endpoint", f"http://127.0.0.1:{port}"))
    assert res.exit_code == 2
    assert f"cannot reach the server at http://127.0.0.1:{port}" in res.output
    assert "cannot connect" in res.output


def test_bad_inputs_are_clear_errors(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, _run_args(tmp_path, "--model", str(tmp_path / "nope")))
    assert r.exit_code == 2 and "no such model directory" in r.output
    r = CliRunner().invoke(app, _run_args(tmp_path))
    assert r.exit_code == 2 and "exactly one of --model PATH or --endpoint URL" in r.output
    r = CliRunner().invoke(
        app, _run_args(tmp_path, "--endpoint", "http://127.0.0.1:1", scheduler="fcfs,lpm")
    )
    assert r.exit_code == 2 and "give exactly one --scheduler" in r.output
    r = CliRunner().invoke(app, _run_args(tmp_path, "--model", str(tmp_path), "--length-hint",
                                          "oracle"))  # fmt: skip
    assert r.exit_code == 2 and "simulator settings" in r.output
    r = CliRunner().invoke(app, _run_args(tmp_path, "--model", str(tmp_path), "--server-python",
                                          str(tmp_path / "python9")))  # fmt: skip
    assert r.exit_code == 2 and "--server-python" in r.output and "does not exist" in r.output


def test_server_that_exits_at_start_names_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pkg = tmp_path / "broken" / "sglang"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(
        "import sys\nprint('OSError: model weights not found in the model path', "
        "file=sys.stderr)\nsys.exit(3)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(pkg.parent))
    res = CliRunner().invoke(app, _run_args(tmp_path / "runs", "--model", str(tmp_path)))
    assert res.exit_code == 2
    assert "server exited with code 3 before becoming healthy" in res.output
    assert "model weights not found" in res.output


def test_serve_passes_args_and_plugin_env(tmp_path: Path) -> None:
    seen = tmp_path / "seen.txt"
    script = tmp_path / "py"
    script.write_text(  # answers the module probe (`-c`: nothing missing), then "serves"
        '#!/bin/sh\n[ "$1" = "-c" ] && exit 0\n'
        f'echo "$* | $TOPAS_SCHEDULER $TOPAS_SCHEDULER_PARAMS" > {seen}\nexit 7\n'
    )
    script.chmod(0o755)
    res = CliRunner().invoke(
        app, ["serve", "-s", "topas", "--scheduler-param", "topas.beta=0.2", "--python",
              str(script), "--", "--model-path", "/m", "--port", "30000"],
    )  # fmt: skip
    assert res.exit_code == 7, res.output  # the server's own exit code
    assert seen.read_text().strip() == (
        '-m sglang.launch_server --model-path /m --port 30000 | topas {"beta": 0.2}'
    )
    # the radix eviction policy the scheduler needs (`ServerNeeds`), with its config
    res = CliRunner().invoke(
        app, ["serve", "-s", "lpm-slru", "--scheduler-param", "lpm-slru.slru_protected_threshold=3",
              "--python", str(script), "--", "--port", "30000"],
    )  # fmt: skip
    assert res.exit_code == 7, res.output
    assert seen.read_text().strip() == (
        "-m sglang.launch_server --port 30000 --radix-eviction-policy slru "
        '--radix-eviction-policy-config {"protected_threshold": 3} | lpm-slru '
        '{"slru_protected_threshold": 3}'
    )
    bad = CliRunner().invoke(app, ["serve", "-s", "nope", "--python", str(script)])
    assert bad.exit_code == 2 and "unknown scheduler" in bad.output
    # the same name.key=value form as `run`: a bare key or another scheduler's is refused
    for param, says in (("beta=0.2", "expects scheduler.key=value, got 'beta'"),
                        ("lpm.beta=0.2", "but this server runs 'topas'")):  # fmt: skip
        argv = ["serve", "--scheduler-param", param, "--python", str(script)]
        bad = CliRunner().invoke(app, argv)
        assert bad.exit_code == 2 and says in bad.output, bad.output


def test_an_interpreter_without_sglang_is_refused_before_launch(tmp_path: Path) -> None:
    """This test's interpreter has topas-bench but no SGLang: say so instead of starting it."""
    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("this interpreter has SGLang")
    res = CliRunner().invoke(app, ["serve", "--python", sys.executable, "--", "--port", "1"])
    assert res.exit_code == 2 and "lacks sglang" in res.output, res.output
    res = CliRunner().invoke(app, _run_args(tmp_path, "--model", str(tmp_path),
                                            "--server-python", sys.executable))  # fmt: skip
    assert res.exit_code == 2 and "--server-python" in res.output and "lacks sglang" in res.output


def test_cap_mode_sends_the_cap_and_ends_at_the_stage_length(endpoint: str, tmp_path: Path) -> None:
    """`max_tokens=cap`: each call sends the cap without `ignore_eos`, with `min_tokens` = its
    output length and per-chunk usage; the client closes the stream at that length, so the
    output is exact though the (fake) model would have gone on to its own EOS."""
    out = tmp_path / "runs"
    cap = ["--workload-param", "max_tokens=cap", "--workload-param", "max_tokens_cap=200"]
    res = CliRunner().invoke(app, _run_args(out, "--endpoint", endpoint, *cap))
    assert res.exit_code == 0, res.output
    assert "lengths: max_tokens=cap (every call sends max_tokens 200" in res.output
    req = pd.read_parquet(_cell(out) / "requests.parquet")
    assert len(req) == 12 and (req["status"] == "ok").all()
    assert (req["output_tokens"] == 6).all()
    sent = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert all(b["max_tokens"] == 200 and b["min_tokens"] == 6 for b in sent)
    assert not any(b.get("ignore_eos") for b in sent)
    assert all(b["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
               for b in sent)  # fmt: skip
    # the server saw each client leave before its EOS (6 + 30 tokens)
    time.sleep(0.5)
    aborted = (tmp_path / "requests.jsonl.aborted").read_text().splitlines()
    assert len(aborted) == 12 and all(6 <= json.loads(a)["sent"] < 36 for a in aborted)
