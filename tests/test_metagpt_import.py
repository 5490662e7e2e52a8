"""`trace import`: recorded MetaGPT call traces (tests/data/metagpt: docs/metagpt-facts.md)
become validated workloads with the recorded DAG and shared prefixes."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from topas_bench.cli import app
from topas_bench.errors import TopasError
from topas_bench.workloads.metagpt_import import (
    Call,
    _last_finished_before,
    import_trace,
    load_calls,
    parse_calls,
    sop_templates,
)
from topas_bench.workloads.model import Stage, Workload
from topas_bench.workloads.registry import generate
from topas_bench.workloads.trace import TraceError, load_workload, validate

DATA = Path(__file__).parent / "data" / "metagpt"
FILES = sorted(DATA.glob("*.jsonl"))


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _shared(a: Stage, b: Stage) -> int:
    """Tokens two prompts share from the start (whole equal segments, as the radix cache)."""
    n = 0
    for x, y in zip(a.prompt, b.prompt, strict=False):
        if x != y:
            break
        n += x.tokens
    return n


def test_fixtures_are_the_shared_recordings() -> None:
    assert [p.name for p in FILES] == [
        "sop-2048-offline.jsonl", "sop-qa-2048-offline.jsonl", "tl-2048-offline.jsonl",
    ]  # fmt: skip


REWRITES = {"sop-2048-offline": {5, 9, 11}, "sop-qa-2048-offline": {5, 9, 11}}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
@pytest.mark.parametrize("mode", ["faithful", "cache-friendly"])
def test_import_every_recording(path: Path, mode: str) -> None:
    rows = _rows(path)
    w = import_trace(path, prefix_mode=mode)
    assert validate(w) == []
    assert (w.name, w.generator, w.params["calls"], w.params["prefix_mode"]) == (
        path.stem, "trace-import", len(rows), mode,
    )  # fmt: skip
    (task,) = w.tasks
    assert task.arrival_s == 0.0
    agents = w.agent_map
    templates = sop_templates() if mode == "cache-friendly" else {}
    prev_of_role: dict[str, Stage] = {}
    for row, stage in zip(rows, task.stages, strict=True):
        before, after = templates.get(row["action"], (0, 0))
        rewrite = row["id"] in REWRITES.get(path.stem, set()) and mode == "cache-friendly"
        assert stage.id == f"c{row['id']}" and stage.kind == row["action"]
        # cache-friendly: a rewrite carries its review agent's template too
        extra = after if rewrite else 0
        assert stage.prompt_tokens == row["system_tokens"] + row["rest_tokens"] + extra
        assert stage.output_tokens == max(1, row["completion_tokens"])
        assert stage.max_new_tokens == 4096  # MetaGPT's cap (max_tokens=cap, the default)
        assert stage.agent.split("/")[0] == row["role"]
        # DAG: the recorded data dependencies plus call order (these runs are sequential)
        order = {f"c{row['id'] - 1}"} if row["id"] else set()
        assert set(stage.deps) == {f"c{d}" for d in row["depends_on"]} | order
        ready = max((r["t_end"] for r in rows if f"c{r['id']}" in stage.deps), default=None)
        if ready is not None:
            assert stage.delay_s == pytest.approx(max(0.0, row["t_start"] - ready), abs=1e-6)
        # prefixes: the recorded shared length with the role's previous call, when same agent
        prefix = agents[stage.agent].prefix_tokens
        if mode == "cache-friendly":  # the whole system prompt, and an SOP action's template
            assert prefix == row["system_tokens"] + before + after
        else:
            assert prefix <= row["system_tokens"]
        if (pstage := prev_of_role.get(row["role"])) is not None:
            if pstage.agent != stage.agent:
                assert _shared(pstage, stage) == 0
            else:
                lcp = row["lcp_tokens_with_prev_call_of_same_role"]
                if mode == "cache-friendly":  # what is shared past the header follows the prefix
                    lcp = prefix + max(0, lcp - row["system_tokens"] - before)
                least = min(lcp, pstage.prompt_tokens, stage.prompt_tokens)
                assert _shared(pstage, stage) == max(prefix, least)
        prev_of_role[row["role"]] = stage


def test_cache_friendly_sop_recording_matches_the_generator() -> None:
    """Cache-friendly SOP agents are the `metagpt-sop` generator's (system line + template)."""
    w = import_trace(DATA / "sop-qa-2048-offline.jsonl")  # cache-friendly is the default
    sop = generate("metagpt-sop", num_tasks=1)
    names = ("Alice", "Bob", "Eve", "Alex/WriteCode", "Edward/WriteTest")
    assert [a.prefix_tokens for a in sop.agents] == [w.agent_map[n].prefix_tokens for n in names]
    friendly = import_trace(DATA / "sop-2048-offline.jsonl", prefix_mode="cache-friendly")
    faithful = import_trace(DATA / "sop-2048-offline.jsonl", prefix_mode="faithful")
    hit = {m: sum(_shared(a, b) for a, b in itertools.pairwise(x.tasks[0].stages))
           for m, x in (("cache-friendly", friendly), ("faithful", faithful))}  # fmt: skip
    assert hit["cache-friendly"] > hit["faithful"]


def test_tl_recording_prefixes() -> None:
    faithful = import_trace(DATA / "tl-2048-offline.jsonl", prefix_mode="faithful")
    friendly = import_trace(DATA / "tl-2048-offline.jsonl")
    # the TeamLeader's think prompt carries the time: calls a second apart shared 41 tokens
    assert faithful.agent_map["Mike/3628"].prefix_tokens == 41
    assert friendly.agent_map["Mike/3628"].prefix_tokens == 3628
    assert faithful.agent_map["Alex/9000"].prefix_tokens == 9000
    eng = [s for s in faithful.tasks[0].stages if s.agent == "Alex/9000"]
    assert _shared(eng[1], eng[2]) == 11_193  # append-only memory: prefix extension
    sop = import_trace(DATA / "sop-2048-offline.jsonl", prefix_mode="faithful")
    assert [(a.name, a.prefix_tokens) for a in sop.agents] == [
        ("Alice", 41), ("Bob", 47), ("Eve", 50), ("Alex", 49),
    ]  # fmt: skip
    review, rewrite = sop.tasks[0].stage("c4"), sop.tasks[0].stage("c5")
    assert _shared(review, rewrite) == 1354


def test_replicated_as_poisson_tasks() -> None:
    one = import_trace(DATA / "sop-2048-offline.jsonl")
    w = import_trace(DATA / "sop-2048-offline.jsonl", num_tasks=40, rate_per_s=0.5, seed=3)
    assert len(w.tasks) == 40 and validate(w) == []
    times = [t.arrival_s for t in w.tasks]
    assert times == sorted(times) and times[0] > 0
    assert times[-1] / 40 == pytest.approx(2.0, rel=0.35)
    assert w == import_trace(DATA / "sop-2048-offline.jsonl", num_tasks=40, rate_per_s=0.5, seed=3)
    for task in w.tasks:
        for a, b in zip(one.tasks[0].stages, task.stages, strict=True):
            assert (a.agent, a.deps, a.output_tokens, a.prompt_tokens) == (
                b.agent, b.deps, b.output_tokens, b.prompt_tokens,
            )  # fmt: skip
            assert b.prompt[0] == a.prompt[0]  # agent prefixes shared across tasks
            assert all(g.key.startswith(f"{task.id}/") for g in b.prompt[1:])  # the rest is not


def test_kv_budget_check_and_options() -> None:
    with pytest.raises(TraceError, match="exceeds the KV budget"):
        import_trace(DATA / "tl-2048-offline.jsonl", kv_budget_tokens=18_692)  # 19.6k prompt
    with pytest.raises(TopasError, match="needs a positive --rate"):
        import_trace(DATA / "sop-2048-offline.jsonl", num_tasks=3)
    with pytest.raises(TopasError, match="prefix_mode must be one of"):
        import_trace(DATA / "sop-2048-offline.jsonl", prefix_mode="eager")


def test_malformed_lines_all_reported_with_line_numbers() -> None:
    good = _rows(DATA / "sop-2048-offline.jsonl")
    lines = [
        json.dumps(good[0]),
        "{not json",
        json.dumps({k: v for k, v in good[1].items() if k != "rest_tokens"} | {"t_end": -1}),
        "",
        json.dumps(good[1] | {"id": 0, "depends_on": [7, "x"]}),
        json.dumps(good[2] | {"system_tokens": 0, "role": ""}),
        json.dumps(good[3] | {"t_end": 1.0, "lcp_tokens_with_prev_call_of_same_role": 10**6}),
        "[1, 2]",
    ]
    with pytest.raises(TraceError) as e:
        parse_calls("\n".join(lines), source="bad.jsonl")
    report = e.value.report().splitlines()
    assert report == [
        "bad.jsonl:2: call: invalid JSON: Expecting property name enclosed in double quotes "
        "(column 2)",
        "bad.jsonl:3: rest_tokens: missing",
        "bad.jsonl:3: t_end: expected a finite number of seconds >= 0, got -1",
        "bad.jsonl:5: id: duplicate call id 0 (first on line 1)",
        "bad.jsonl:5: depends_on[0]: 7 is not an earlier call",
        "bad.jsonl:5: depends_on[1]: expected a call id, got 'x'",
        "bad.jsonl:6: system_tokens: expected an integer >= 1, got 0",
        "bad.jsonl:6: role: expected a non-empty string, got ''",
        f"bad.jsonl:7: t_end: 1.0 is before t_start {good[3]['t_start']}",
        "bad.jsonl:7: lcp_tokens_with_prev_call_of_same_role: 1000000 exceeds the prompt's 900",
        "bad.jsonl:8: call: expected a JSON object, got list",
    ]
    with pytest.raises(TraceError, match="no calls"):
        parse_calls("\n\n")


def test_load_calls_keeps_fields() -> None:
    calls = load_calls(DATA / "tl-2048-offline.jsonl")
    assert calls[5] == Call(
        5, "Alice", "ProductManager._think", 9.5666, 9.5886, 4858, 1323, 77, 4910, (4,)
    )


def _brute_last_finished(calls: list[Call]) -> list[int | None]:
    """The call-order dependency as the module docstring defines it, by brute force."""
    out: list[int | None] = []
    for c in calls:
        before = [d for d in calls if d.id < c.id and d.t_end <= c.t_start]
        out.append(max(before, key=lambda d: (d.t_end, d.id)).id if before else None)
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 6)), min_size=1, max_size=40))
def test_call_order_dependency_matches_brute_force(spans: list[tuple[int, int]]) -> None:
    # coarse integer times: many ties in t_end and starts exactly at an earlier end
    calls = [Call(i, "R", "a", float(s), float(s + d), 1, 1, 1, 0, ()) for i, (s, d) in
             enumerate(spans)]  # fmt: skip
    assert _last_finished_before(calls) == _brute_last_finished(calls)


def test_import_reports_progress_by_phase() -> None:
    seen: dict[str, list[tuple[int, int]]] = {}
    w = import_trace(
        DATA / "sop-qa-2048-offline.jsonl", num_tasks=3, rate_per_s=0.01,
        progress=lambda phase, done, total: seen.setdefault(phase, []).append((done, total)),
    )  # fmt: skip
    assert list(seen) == ["read", "convert", "replicate", "check"]
    calls = w.params["calls"]
    assert seen["convert"][-1] == (calls, calls) and seen["replicate"][-1] == (3, 3)
    assert seen["check"] == [(0, 3), (3, 3)]
    for ticks in seen.values():  # monotone, ending complete
        assert ticks == sorted(ticks) and ticks[-1][0] == ticks[-1][1]


# -- CLI ---------------------------------------------------------------------------------------
def test_cli_trace_import(tmp_path: Path) -> None:
    out = tmp_path / "sop.jsonl"
    args = ["trace", "import", str(DATA / "sop-qa-2048-offline.jsonl"), "-o", str(out)]
    res = CliRunner().invoke(app, [*args, "-n", "3", "--rate", "0.01", "--kv-budget", "18692"])
    assert res.exit_code == 0, res.output
    assert f"wrote {out}: 3 task(s), 48 calls" in res.output.replace("\n", "")
    w: Workload = load_workload(out, kv_budget_tokens=18_692)
    assert len(w.tasks) == 3 and w.generator == "trace-import"
    res = CliRunner().invoke(app, ["workloads", "validate", str(out)])
    assert res.exit_code == 0 and "valid: 3 tasks, 48 calls" in res.output


@pytest.mark.parametrize(
    ("name", "written"),
    [("calls.jsonl", "calls.workload.jsonl"), ("calls.txt", "calls.txt.workload.jsonl")],
)
def test_cli_trace_import_names_its_output_as_the_docs_say(
    tmp_path: Path, name: str, written: str
) -> None:
    """README and --help: `.jsonl` replaced by `.workload.jsonl`, else that appended."""
    src = tmp_path / name
    src.write_text((DATA / "sop-2048-offline.jsonl").read_text())
    res = CliRunner().invoke(app, ["trace", "import", str(src)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([name, written])
    helptext = " ".join(CliRunner().invoke(app, ["trace", "import", "--help"]).output.split())
    assert "calls.jsonl -> calls.workload.jsonl" in helptext.replace("│ ", "")


def test_cli_trace_import_writes_beside_its_input_and_says_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "rec" / "sop.jsonl"
    src.parent.mkdir()
    src.write_text((DATA / "sop-2048-offline.jsonl").read_text())
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["trace", "import", str(src)])
    assert res.exit_code == 0, res.output
    out = tmp_path / "rec" / "sop.workload.jsonl"
    assert out.is_file() and not (tmp_path / "sop.workload.jsonl").exists()
    text = res.output.replace("\n", "")
    assert f"wrote {out}" in text and "prefix mode cache-friendly" in text
    assert f"topas-bench run -w {out}" in text
    # one task never queues: say how to get more, with a command that works
    words = " ".join(res.output.split())  # rich wraps long lines at spaces
    assert "one task: nothing ever queues" in words and f"run -w {out} -n 50 --rate R" in words
    more = CliRunner().invoke(app, ["run", "-w", str(out), "-n", "4", "--rate", "0.05",
                                    "--workload-param", "arrivals=poisson", "-s", "fcfs",
                                    "--out", str(tmp_path / "runs")])  # fmt: skip
    assert more.exit_code == 0, more.output
    res = CliRunner().invoke(app, ["trace", "import", str(src), "-n", "2", "--rate", "0.01"])
    assert res.exit_code == 0 and "one task" not in res.output


def test_cli_trace_import_reports_every_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 0}\nnope\n')
    res = CliRunner().invoke(app, ["trace", "import", str(bad), "-o", str(tmp_path / "o.jsonl")])
    assert res.exit_code == 2
    assert f"{bad}:1: role: missing" in res.output and f"{bad}:2: call: invalid JSON" in res.output
    assert not (tmp_path / "o.jsonl").exists()


def test_cli_trace_import_checks_the_output_before_reading(tmp_path: Path) -> None:
    src = str(DATA / "sop-2048-offline.jsonl")
    for target, message in (
        (tmp_path / "missing" / "o.jsonl", "is not a directory"),
        (tmp_path, "it is a directory"),
        (unwritable_dir(tmp_path) / "o.jsonl", "takes no new files"),
    ):
        res = CliRunner().invoke(app, ["trace", "import", src, "-o", str(target)])
        assert res.exit_code == 2 and message in res.stderr, res.output
        assert len(res.stderr.splitlines()) == 1 and "Traceback" not in res.output


def unwritable_dir(tmp_path: Path) -> Path:
    """A directory no new file can be made in, also for root (who ignores permission bits)."""
    if os.geteuid() == 0:
        return Path("/sys")  # sysfs takes no new files, not even from root
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    return ro


# -- metagpt-replay: a recording as a registered workload -------------------------------------
def test_replay_workload_serves_recorded_jobs(tmp_path: Path) -> None:
    from topas_bench.workloads.registry import generate

    w = generate("metagpt-replay", num_tasks=4, rate_per_s=0.2, seed=1)
    assert w.params["file"] == "sop-2048-offline" and validate(w) == []
    imported = import_trace(DATA / "sop-2048-offline.jsonl", num_tasks=4, rate_per_s=0.2)
    for a, b in zip(w.tasks, imported.tasks, strict=True):
        assert a.stages == b.stages  # the same job, as `trace import` converts it
    by_path = generate(
        "metagpt-replay", num_tasks=2, file=str(DATA / "tl-2048-offline.jsonl"),
        prefix_mode="cache-friendly",
    )  # fmt: skip
    assert by_path.agent_map["Mike/3628"].prefix_tokens == 3628
    with pytest.raises(TopasError, match="no such recorded call trace"):
        generate("metagpt-replay", num_tasks=1, file=str(tmp_path / "none.jsonl"))
    res = CliRunner().invoke(app, [
        "run", "-w", "metagpt-replay", "-s", "fcfs", "-n", "3", "--out", str(tmp_path / "runs"),
        "--workload-param", f"file={DATA / 'sop-qa-2048-offline.jsonl'}",
    ])  # fmt: skip
    assert res.exit_code == 0, res.output
