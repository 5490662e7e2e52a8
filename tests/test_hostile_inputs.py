"""Issue 30's hostile inputs, each with the exit code and the one line it must get: what made
`run` and `sweep` fail with exit 70 (surrogates, binary files, a huge seed range), what lost
data (an import written over its input), what was unclear or left files behind, and the runs
whose clock went past what a double times exactly. Stored-result corruption is in
`test_stored_results.py`."""

from __future__ import annotations

import builtins
import json
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from topas_bench.cli import app
from topas_bench.runners.sglang.metadata import KEY, decode
from topas_bench.runners.sim.preset import _PRESETS
from topas_bench.schedulers.autellix import critical_path_attained
from topas_bench.workloads.registry import generate
from topas_bench.workloads.trace import dumps_workload

DATA = Path(__file__).parent / "data" / "metagpt"
TRACE = dumps_workload(generate("dag4", num_tasks=3, seed=0, prefix_tokens=64))
HEADER, *TASKS = TRACE.splitlines()


def invoke(*args: str | Path) -> Any:
    return CliRunner().invoke(app, [str(a) for a in args])


def one_line(result: Any, code: int = 2) -> str:
    """The single line a refusal prints (`error: ...`), after checking the exit code."""
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output and "Usage:" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) >= 1 and lines[-1].startswith("error: "), lines
    bars = [x for x in lines[:-1] if "━" in x or " eta " in x]  # progress, as CliRunner sees it
    other = [x for x in lines[:-1] if not x.startswith(("note:", "warning:")) and x not in bars]
    assert other == [], other
    return lines[-1]


def trace_file(tmp_path: Path, *lines: str, name: str = "w.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# -- exit 70 that was due exit 2 -------------------------------------------------------------------
@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"id":"s0"', '"id":"\\ud800"'),  # a stage id
        ('"kind":"A"', '"kind":"\\ud800"'),  # a stage kind
        ('"id":"t0000"', '"id":"t\\udc00"'),  # a task id
    ],
)
def test_a_lone_surrogate_is_refused_by_validate_run_and_sweep(
    tmp_path: Path, old: str, new: str
) -> None:
    path = trace_file(tmp_path, HEADER, TASKS[0].replace(old, new, 1), *TASKS[1:])
    result = invoke("workloads", "validate", path)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[1].startswith(f"{path}:2: task: not Unicode text: ")
    assert "surrogate" in result.stderr
    line = one_line(invoke("run", "-w", path, "-s", "fcfs", "--out", tmp_path / "r"))
    assert line.startswith(f"error: {path}: 1 problem; first: line 2, task: not Unicode text")
    line = one_line(invoke("sweep", "-w", path, "-s", "fcfs", "-j", "1", "--out", tmp_path / "s"))
    assert "not Unicode text" in line
    assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()


def test_a_surrogate_pair_is_text(tmp_path: Path) -> None:
    smile = TASKS[0].replace('"kind":"A"', '"kind":"\\ud83d\\ude00"', 1)
    path = trace_file(tmp_path, HEADER, smile, *TASKS[1:])
    assert invoke("workloads", "validate", path).exit_code == 0
    assert invoke("run", "-w", path, "-s", "fcfs", "--out", tmp_path / "r").exit_code == 0


@pytest.mark.parametrize("content", [b"\xff\xfe" + "workloads = ['dag4']".encode("utf-16-le"),
                                     bytes(range(256))])  # fmt: skip
def test_a_binary_sweep_file_or_preset_is_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.toml"
    path.write_bytes(content)
    line = one_line(invoke("sweep", "-c", path, "--out", tmp_path / "s"))
    assert line.startswith(f"error: {path}: not a sweep file: not UTF-8 text (byte ")
    line = one_line(invoke("run", "-w", "dag4", "-n", "2", "--preset", path))
    assert line.startswith(f"error: preset file '{path}': not UTF-8 text (byte ")


def test_a_huge_seed_range_is_one_line(tmp_path: Path) -> None:
    line = one_line(invoke("sweep", "-w", "dag4", "--seeds", "0-99999999999", "--out", tmp_path))
    assert line == "error: --seeds: 100,000,000,000 values; a list takes at most 100,000"
    line = one_line(invoke("sweep", "-w", "dag4", "--seeds", "0-" + "9" * 40, "--out", tmp_path))
    assert "a list takes at most 100,000" in line


def _metadata(dag: list[list[Any]]) -> dict[str, str]:
    rec = {"v": 1, "task": "t", "stage": "a", "agent": "A", "arrival": 0, "prefix": 1,
           "segments": [["agent:A", 1]], "dag": dag}  # fmt: skip
    return {KEY: json.dumps(rec)}


@pytest.mark.parametrize(
    "dag",
    [
        [["a", "A", "", ["a"], 1, 0]],  # a self-dependency
        [["a", "A", "", ["b"], 1, 0], ["b", "A", "", ["a"], 1, 0]],  # a cycle
        [["a", "A", "", [], 1, 0], ["b", "A", "", ["c"], 1, 0], ["c", "A", "", ["b"], 1, 0]],
    ],
)
def test_metadata_with_a_cycle_falls_back_and_autellix_decides(dag: list[list[Any]]) -> None:
    from fuzz_targets import PluginState, _Params, _Req

    assert decode(_metadata(dag)) == (None, "malformed: the DAG has a cycle")
    state = PluginState()
    state.tracker.sync([_Req("r1", list(range(64)), _Params(_metadata(dag)))], [])
    assert state.tracker.untagged == {"malformed: the DAG has a cycle": 1}
    (task,) = state.tracker.tasks.values()  # served as an independent one-stage task
    assert critical_path_attained(task) == {"s0": 0.0}


# -- data lost -----------------------------------------------------------------------------------
def test_trace_import_never_writes_over_its_input(tmp_path: Path) -> None:
    calls = tmp_path / "calls.jsonl"
    calls.write_bytes((DATA / "sop-2048-offline.jsonl").read_bytes())
    before = calls.read_bytes()
    (tmp_path / "link.jsonl").symlink_to(calls)
    for target in (calls, tmp_path / "link.jsonl", tmp_path / "." / "calls.jsonl"):
        line = one_line(invoke("trace", "import", calls, "-o", target))
        assert line.startswith(f"error: -o {target}: that is the call trace being imported")
    assert calls.read_bytes() == before
    trace = trace_file(tmp_path, *TRACE.splitlines(), name="t.jsonl")
    line = one_line(invoke("workloads", "export", trace, "-o", trace))
    assert line.startswith(f"error: -o {trace}: that is the trace being sampled")
    assert trace.read_text() == TRACE
    assert invoke("workloads", "export", "dag4", "-n", "2", "-o", tmp_path / "dag4").exit_code == 0


# -- unclear or untidy ---------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "binary"])
def test_run_names_a_utf16_or_binary_file_as_validate_does(tmp_path: Path, encoding: str) -> None:
    path = tmp_path / "w.jsonl"
    path.write_bytes(bytes(range(256)) * 4 if encoding == "binary" else TRACE.encode(encoding))
    result = invoke("workloads", "validate", path)
    assert result.exit_code == 2
    first = result.stderr.splitlines()[1]
    assert first.startswith(f"{path}:1: header: ")
    line = one_line(invoke("run", "-w", path, "-s", "fcfs", "--out", tmp_path / "r"))
    assert line.startswith(f"error: {path}: 1 problem; first: line 1, header: ")
    assert first.split(": header: ")[1] in line


def test_an_unreadable_file_is_one_line_everywhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a user other than root sees a file of mode 000: `os.access` says no, open fails."""
    path = trace_file(tmp_path, *TRACE.splitlines())
    real_access, real_open = os.access, builtins.open

    def no_access(p: Any, *a: Any, **k: Any) -> bool:
        return str(p) != str(path) and real_access(p, *a, **k)

    def no_read(file: Any, *a: Any, **k: Any) -> Any:
        if str(file) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(file, *a, **k)

    real_path_open = Path.open

    def no_path_open(self: Path, *a: Any, **k: Any) -> Any:
        return no_read(self) if str(self) == str(path) else real_path_open(self, *a, **k)

    monkeypatch.setattr(os, "access", no_access)
    monkeypatch.setattr(builtins, "open", no_read)
    monkeypatch.setattr(Path, "open", no_path_open)
    expected = f"error: {path}: cannot read trace: Permission denied"
    assert one_line(invoke("workloads", "validate", path)) == expected
    assert one_line(invoke("run", "-w", path, "-s", "fcfs", "--out", tmp_path / "r")) == expected
    line = one_line(invoke("sweep", "-c", path, "--out", tmp_path / "s"))
    assert line.startswith(f"error: {path}: cannot read sweep file")


def test_a_replica_named_as_a_task_of_the_file_says_so(tmp_path: Path) -> None:
    row = json.loads(TASKS[0])
    rows = []
    for tid, arrival in (("job1", 1.0), ("job1~1", 2.0)):
        text = json.dumps({**row, "id": tid, "arrival_s": arrival}).replace("t0000/", f"{tid}/")
        rows.append(text)
    path = trace_file(tmp_path, HEADER, *rows)
    assert invoke("run", "-w", path, "-s", "fcfs", "--out", tmp_path / "ok").exit_code == 0
    line = one_line(invoke("run", "-w", path, "-s", "fcfs", "-n", "4", "--out", tmp_path / "r"))
    assert line == (
        f"error: workload {path}: -n 4 repeats the file's 2 tasks, and copy 1 of task 'job1' "
        "would be named 'job1~1', which the file already uses; run at most 2 tasks, or rename "
        "the file's 'job1~1' (copies are named ID~N)"
    )


@pytest.mark.parametrize("value", [-1, "NaN", 0])
def test_a_bad_capacity_cache_is_named(tmp_path: Path, value: Any) -> None:
    args = ["sweep", "-w", "chain3", "-s", "fcfs", "-n", "3", "--load", "0.5", "-j", "1"]
    out = tmp_path / "runs"
    assert invoke(*args, "--out", out).exit_code == 0
    path = out / "capacity.json"
    doc = json.loads(path.read_text())
    doc["capacities"][0]["capacity_tps"] = value
    path.write_text(json.dumps(doc).replace('"NaN"', "NaN"))
    line = one_line(invoke(*args, "--out", out))
    assert line.startswith(f"error: {path}: the capacity of chain3 under fcfs is ")
    assert line.endswith("not a positive number of tasks/s; delete it or use --force")


def test_a_capacity_cache_that_is_a_directory_leaves_nothing_behind(tmp_path: Path) -> None:
    args = ["sweep", "-w", "chain3", "-s", "fcfs", "-n", "3", "--load", "0.5", "-j", "1"]
    out = tmp_path / "runs"
    (out / "capacity.json").mkdir(parents=True)
    line = one_line(invoke(*args, "--out", out))
    assert line == (
        f"error: {out}/capacity.json: not a file, so no capacity cache; delete it or use --force"
    )
    line = one_line(invoke(*args, "--out", out, "--force"))
    assert line.startswith(f"error: {out}/capacity.json: cannot write the capacity cache (")
    assert sorted(p.name for p in out.iterdir()) == ["capacity.json"]


def test_export_onto_a_full_disk_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Path.write_text

    def full(self: Path, *a: Any, **k: Any) -> Any:
        if self.parent == tmp_path:
            real(self, "half a tra")
            raise OSError(28, "No space left on device", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "write_text", full)
    line = one_line(invoke("workloads", "export", "dag4", "-n", "3", "-o", tmp_path / "x.jsonl"))
    assert line.endswith("No space left on device")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["run", "-w", "dag4", "-n", "2", "-s", ""], "error: --scheduler is empty; give `all` or "
         "a comma-separated list"),
        (["run", "-w", "dag4", "-n", "2", "--out", ""], "error: --out is empty; give a directory "
         "(`.` for the current one)"),
        (["sweep", "-w", "dag4", "-n", "2", "--out", ""], "error: --out is empty; give a "
         "directory (`.` for the current one)"),
        (["run", "-w", "dag4", "--replicas", "100000"], "error: --replicas 100,000: at most "
         "1,024 (each is a whole simulated server; 10,000 took 51 s and 467 MB for 200 tasks)"),
        (["run", "-w", "dag4", "-s", "topas", "--scheduler-param", "topas.rho=1e308"],
         "error: topas: rho must be at most 1e+12, got 1e+308"),
        (["run", "-w", "dag4", "-s", "topas", "--scheduler-param", "topas.srpt_exponent=1000"],
         "error: topas: srpt_exponent must be at most 16, got 1,000"),
        (["run", "-w", "dag4", "-s", "autellix", "--scheduler-param", "autellix.levels=2000"],
         "error: autellix: levels must be at most 64, got 2,000"),
    ],
)  # fmt: skip
def test_flags_that_ran_on_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], expected: str
) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke(*args)
    assert one_line(result) == expected
    assert list(tmp_path.iterdir()) == []  # nothing written, the current directory neither


def test_a_pipe_in_a_stage_kind_stays_in_its_cell(tmp_path: Path) -> None:
    piped = [t.replace('"kind":"A"', '"kind":"A|B"') for t in TASKS]
    path = trace_file(tmp_path, HEADER, *piped)
    assert invoke("run", "-w", path, "-s", "fcfs,lpm", "--out", tmp_path / "r").exit_code == 0
    assert invoke("report", tmp_path / "r", "--quiet").exit_code == 0
    md = (tmp_path / "r" / "report.md").read_text().splitlines()
    header = md.index("Mean latency per stage kind (s, send to finish):") + 2
    table = md[header : md.index("", header)]
    assert any(row.startswith("| A\\|B ") for row in table)
    assert {row.replace("\\|", "").count("|") for row in table} == {4}  # 3 columns each


# -- precision: the clock's horizon --------------------------------------------------------------
def test_a_preset_too_slow_for_the_clock_is_refused_before_the_run(tmp_path: Path) -> None:
    text = (_PRESETS / "a100-qwen32b.toml").read_text()
    slow = tmp_path / "slow.toml"
    slow.write_text(
        "\n".join("hbm_tbps = 1e-300" if x.startswith("hbm_tbps") else x for x in text.splitlines())
    )
    line = one_line(invoke("run", "-w", "dag4", "-n", "3", "--preset", slow, "--out", tmp_path))
    assert line.startswith(f"error: preset {slow}: task ") and "cannot finish before" in line
    assert "past the clock limit of 1e+09 s (31.7 years)" in line and "hbm_tbps" in line
    assert list(tmp_path.iterdir()) == [slow]


def test_delays_past_the_clock_limit_are_refused_before_the_run(tmp_path: Path) -> None:
    stages = [
        {"id": f"s{i}", "agent": "A", "kind": "A", "prompt": [["agent:A", 16], [f"c/in{i}", 8]],
         "output_tokens": 4, "max_new_tokens": 4, "deps": [f"s{i - 1}"] if i else [],
         "delay_s": 1e9}
        for i in range(1000)
    ]  # fmt: skip
    head = {**json.loads(HEADER), "agents": [{"name": "A", "prefix_tokens": 16}]}
    task = {"id": "c", "workflow": "w", "arrival_s": 0.0, "stages": stages}
    path = trace_file(tmp_path, json.dumps(head), json.dumps(task))
    assert invoke("workloads", "validate", path).exit_code == 0  # the format allows it
    line = one_line(invoke("run", "-w", path, "-s", "fcfs", "--out", tmp_path / "r"))
    assert line == (
        f"error: workload {path}: task 'c' cannot finish before 1e+12 s: the delay_s along its "
        "longest path add up to 1e+12 s, past the clock limit of 1e+09 s (31.7 years)"
    )
    assert not (tmp_path / "r").exists()


def test_a_run_that_queues_past_the_clock_limit_is_not_written(tmp_path: Path) -> None:
    rows = [json.loads(t) for t in dumps_workload(generate("dag4", num_tasks=30)).splitlines()]
    for r in rows[1:]:
        r["arrival_s"] = 1e9 - 100 + r["arrival_s"] * 1e-6  # all at once, just inside the limit
    path = trace_file(tmp_path, *(json.dumps(r) for r in rows))
    line = one_line(invoke("run", "-w", path, "-s", "fcfs", "--out", tmp_path / "r"))
    assert line.startswith("error: the run's clock reached 10000000")
    assert "past the clock limit of 1e+09 s (31.7 years)" in line and "not written" in line
    assert not list((tmp_path / "r").rglob("run.json")) if (tmp_path / "r").exists() else True


def test_a_load_on_a_preset_too_slow_for_the_clock_is_refused(tmp_path: Path) -> None:
    """Measuring the capacity for --load ran forever on such a preset."""
    text = (_PRESETS / "a100-qwen32b.toml").read_text()
    slow = tmp_path / "slow.toml"
    slow.write_text(text.replace("hbm_tbps = ", "hbm_tbps = 1e-300 #"))
    args = ["-w", "dag4", "-s", "fcfs", "-n", "3", "--load", "0.8", "--preset", slow]
    line = one_line(invoke("run", *args, "--out", tmp_path / "r"))
    assert line == (
        f"error: preset {slow}: a dag4 task alone takes 1.18e+303 s on it; past the clock limit "
        "of 1e+09 s (31.7 years); check the preset's speeds and overheads (peak_tflops, "
        "hbm_tbps, eta_*, c_*_us)"
    )
    line = one_line(invoke("sweep", *args, "-j", "1", "--out", tmp_path / "s"))
    assert line.startswith("error: measuring the capacity of dag4 under fcfs failed: TopasError")


def test_a_preset_too_fast_for_the_clock_is_refused(tmp_path: Path) -> None:
    """Zero overheads and 1e300 TFLOP/s: every call vanished in rounding, every JCT 0 (now the
    invariant JCT > 0 would call it a bug: exit 70); refused before the run, exit 2."""
    text = (_PRESETS / "a100-qwen32b.toml").read_text()
    for key in ("peak_tflops = ", "hbm_tbps = "):
        text = text.replace(key, key + "1e300 #")
    for key in ("c_step_us = ", "c_layer_us = ", "c_req_us = "):
        text = text.replace(key, key + "0.0 #")
    fast = tmp_path / "fast.toml"
    fast.write_text(text)
    args = ["-w", "dag4", "-s", "fcfs", "-n", "3", "--preset", fast, "--out", tmp_path / "r"]
    line = one_line(invoke("run", *args))
    assert line.startswith(f"error: preset {fast}: its fastest decode step takes 0 s, which a ")
    assert "cannot time" in line
    line = one_line(invoke("run", *args, "--load", "0.8"))
    assert "its calls vanish in rounding" in line
    assert not (tmp_path / "r").exists()


def test_an_output_that_is_a_device_or_pipe_is_refused(tmp_path: Path) -> None:
    """Found while closing the issue: the atomic rename would have replaced /dev/null (as
    root) with a regular file. A named pipe stands in for the device here."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    line = one_line(invoke("workloads", "export", "dag4", "-n", "2", "-o", fifo))
    assert line == f"error: cannot write {fifo}: not a regular file (a device, pipe or socket)"
    calls = DATA / "sop-2048-offline.jsonl"
    assert one_line(invoke("trace", "import", calls, "-o", fifo)) == line
    assert fifo.is_fifo()
