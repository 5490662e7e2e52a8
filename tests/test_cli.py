"""The `topas-bench` command line, driven through typer's CliRunner, as a user calls it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner, Result

from results_fixture import rewrite
from test_metagpt_import import unwritable_dir
from topas_bench.cell.identity import RunIdentity
from topas_bench.cli import app
from topas_bench.experiment import measure_capacity
from topas_bench.results import TABLES
from topas_bench.runners.engines import engine_version
from topas_bench.runners.sim.cost import load_preset, preset_names
from topas_bench.schedulers.registry import (
    ABLATIONS,
    BASELINES,
    PEERS,
    PEERS_2026,
    SCHEDULERS,
    SGLANG_STOCK,
    UNGROUPED,
    capabilities,
)
from topas_bench.spec import GROUPS
from topas_bench.workloads.registry import WORKLOADS, generate
from topas_bench.workloads.trace import load_workload

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
A100_BUDGET = 18_692  # a100-qwen32b: 80 GB x 0.88 - 65.5 GB of weights, at 256 KiB per token
TL_RATE = WORKLOADS.get("metagpt-tl").default_rate_per_s
COLUMNS = ("tasks", "mean", "p50", "p90", "p99", "tasks/s", "hit", "preempt", "sim s", "wall s")


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def ok(*args: str | Path) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert result.exception is None
    return result


def text(result: Result) -> str:
    """Stdout with ANSI codes removed and whitespace (incl. rich's line wrapping) collapsed."""
    return " ".join(ANSI.sub("", result.stdout).split())


def rows(result: Result) -> dict[str, dict[str, str]]:
    """The JCT table: scheduler cell -> column -> printed text."""
    table = {}
    for line in ANSI.sub("", result.stdout).splitlines():
        line = line.strip()
        if line.startswith("│"):
            cells = [c.strip() for c in line.strip("│").split("│")]
            assert len(cells) == 1 + len(COLUMNS), line
            table[cells[0]] = dict(zip(COLUMNS, cells[1:], strict=True))
    return table


def cell_dir(out: Path, workload: str, scheduler: str) -> Path:
    (only,) = (out / workload / scheduler).iterdir()
    return only


def meta(out: Path, workload: str, scheduler: str) -> dict[str, Any]:
    return json.loads((cell_dir(out, workload, scheduler) / "run.json").read_text())


def printed(summary: dict[str, float]) -> dict[str, str]:
    """The table cells a summary should print as."""
    return {
        "tasks": f"{summary['tasks']:.0f}",
        "mean": f"{summary['mean_jct_s']:.2f}",
        "p50": f"{summary['p50_jct_s']:.2f}",
        "p90": f"{summary['p90_jct_s']:.2f}",
        "p99": f"{summary['p99_jct_s']:.2f}",
        "tasks/s": f"{summary['throughput_tps']:.4f}",
        "hit": f"{summary['prefix_hit_rate']:.1%}",
        "preempt": f"{summary['preemptions']:.0f}",
    }


# -- run -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def default_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Result, Path]:
    out = tmp_path_factory.mktemp("runs")
    return ok("run", "-n", "6", "--out", out), out


def test_run_prints_the_plan(default_run: tuple[Result, Path]) -> None:
    result, _ = default_run
    assert load_preset("a100-qwen32b").derived_kv_budget_tokens == A100_BUDGET
    assert TL_RATE == 0.0033
    out = text(result)
    assert "workload metagpt-tl: 6 tasks, seed 0, Poisson rate 0.0033 tasks/s" in out
    assert (
        "lengths: max_tokens=cap (every call sends max_tokens 4,096 and ends at EOS: policies "
        "see the cap, not the lengths)"
    ) in out
    assert (
        "engine sim, preset a100-qwen32b (A100-SXM4-80GB, Qwen2.5-32B-Instruct), "
        "KV budget 18,692 tokens (derived: 80 GB x 0.88 - 65.5 GB weights, 256 KiB/token; "
        "override with --kv-budget)"
    ) in out
    assert f"schedulers: {', '.join(GROUPS['all'])}" in out
    assert "length hint" not in out and "host tier" not in out


def test_run_prints_one_numeric_row_per_scheduler(default_run: tuple[Result, Path]) -> None:
    result, out = default_run
    table = rows(result)
    assert list(table) == list(GROUPS["all"])
    for name in GROUPS["all"]:
        row = table[name]
        assert row["tasks"] == "6"
        jct = [float(row[k]) for k in ("mean", "p50", "p90", "p99")]
        assert all(x > 0 for x in jct)
        assert jct[1] <= jct[2] <= jct[3]
        assert float(row["tasks/s"]) > 0
        assert 0 <= float(row["hit"].rstrip("%")) <= 100
        assert int(row["preempt"]) >= 0
        assert float(row["sim s"].replace(",", "")) > 0
        assert float(row["wall s"]) >= 0
    assert text(result).endswith(f"results: {out}/")


def test_run_writes_tables_and_run_json_matching_the_output(
    default_run: tuple[Result, Path],
) -> None:
    result, out = default_run
    table = rows(result)
    assert sorted(p.name for p in (out / "metagpt-tl").iterdir()) == sorted(GROUPS["all"])
    workload = generate("metagpt-tl", num_tasks=6, seed=0)
    for name in GROUPS["all"]:
        run_dir = cell_dir(out, "metagpt-tl", name)
        files = sorted(p.name for p in run_dir.iterdir())
        assert files == sorted([*(f"{t}.parquet" for t in TABLES), "run.json"])
        m = meta(out, "metagpt-tl", name)
        assert m["identity"] == {
            "workload": "metagpt-tl",
            "num_tasks": 6,
            "rate_per_s": TL_RATE,
            "seed": 0,
            "scheduler": name,
            "preset": "a100-qwen32b",
            "kv_budget_tokens": A100_BUDGET,
            "engine": "sim",
            "engine_version": engine_version("sim"),
            "workload_params": {"max_tokens": "cap", "max_tokens_cap": 4096},
            "scheduler_params": {},
            "engine_params": {},
        }
        digest = RunIdentity(**m["identity"]).digest
        assert run_dir.name == f"sim-a100-qwen32b-kv18692-r{TL_RATE:g}-n6-s0-{digest}"
        row = table[name]
        assert {k: row[k] for k in printed(m["summary"])} == printed(m["summary"])
        assert row["sim s"] == f"{m['sim_time_s']:,.0f}"
        tasks = pd.read_parquet(run_dir / "tasks.parquet")
        assert sorted(tasks["task_id"]) == [t.id for t in workload.tasks]
        assert tasks["jct_s"].mean() == pytest.approx(m["summary"]["mean_jct_s"])
        requests = pd.read_parquet(run_dir / "requests.parquet")
        assert len(requests) == 6 * 9  # metagpt-tl: 9 calls per task
        assert len(pd.read_parquet(run_dir / "timeline.parquet")) > 0
        assert len(pd.read_parquet(run_dir / "decisions.parquet")) > 0
        assert m["load"] is None and m["capacity_tps"] is None


def test_a_changed_replay_file_is_rerun_not_reused(tmp_path: Path) -> None:
    data = Path(__file__).parent / "data" / "metagpt"
    calls = tmp_path / "calls.jsonl"
    calls.write_bytes((data / "sop-2048-offline.jsonl").read_bytes())
    args = ("run", "-w", "metagpt-replay", "--workload-param", f"file={calls}", "-n", "3",
            "--out", tmp_path / "runs")  # fmt: skip
    first = rows(ok(*args, "-s", "fcfs"))
    calls.write_bytes((data / "sop-qa-2048-offline.jsonl").read_bytes())  # same path, new run
    second = rows(ok(*args, "-s", "fcfs,lpm"))
    assert list(second) == ["fcfs", "lpm"]  # fcfs is not "(cached)": its sample changed
    assert second["fcfs"]["mean"] != first["fcfs"]["mean"]
    assert list(rows(ok(*args, "-s", "fcfs,lpm"))) == ["fcfs (cached)", "lpm (cached)"]
    ok("report", tmp_path / "runs", "--out", tmp_path / "report")  # one sample: comparable


def test_run_only_the_listed_schedulers(tmp_path: Path) -> None:
    result = ok("run", "-s", "fcfs,lpm", "-n", "6", "--out", tmp_path)
    assert list(rows(result)) == ["fcfs", "lpm"]
    assert "schedulers: fcfs, lpm " in text(result)
    assert sorted(p.name for p in (tmp_path / "metagpt-tl").iterdir()) == ["fcfs", "lpm"]


def test_second_run_reuses_cells_and_force_reruns(tmp_path: Path) -> None:
    args = ("run", "-w", "dag4", "-s", "fcfs,parrot", "-n", "6", "--out", tmp_path)
    first = rows(ok(*args))
    assert {"fcfs", "parrot"} <= set(first)

    assert "was reused" not in text(ok(*args, "-s", "lpm"))
    again = ok(*args)
    second = rows(again)
    assert list(second) == ["fcfs (cached)", "parrot (cached)"]
    assert "pass --force after changing a policy" in text(again)
    for name in ("fcfs", "parrot"):
        assert second[f"{name} (cached)"] == first[name]

    # A cached cell is read back from its run.json, not recomputed.
    run_json = cell_dir(tmp_path, "dag4", "fcfs") / "run.json"
    m = json.loads(run_json.read_text())
    rewrite(run_json.parent, summary={**m["summary"], "mean_jct_s": 12345.678})
    assert rows(ok(*args))["fcfs (cached)"]["mean"] == "12345.68"

    forced = rows(ok(*args, "--force"))
    assert list(forced) == ["fcfs", "parrot"]
    assert forced["fcfs"]["mean"] == first["fcfs"]["mean"]
    assert (
        f"{json.loads(run_json.read_text())['summary']['mean_jct_s']:.2f}" == first["fcfs"]["mean"]
    )

    # Another seed is another cell.
    assert list(rows(ok(*args, "--seed", "1"))) == ["fcfs", "parrot"]
    assert len(list((tmp_path / "dag4" / "fcfs").iterdir())) == 2


def test_run_with_an_explicit_budget_and_rate(tmp_path: Path) -> None:
    result = ok("run", "-w", "chain3", "-s", "fcfs", "-n", "3", "--rate", "0.05",
                "--kv-budget", "40000", "--seed", "2", "--out", tmp_path)  # fmt: skip
    out = text(result)
    assert "workload chain3: 3 tasks, seed 2, Poisson rate 0.05 tasks/s" in out
    assert "KV budget 40,000 tokens (from --kv-budget)" in out
    ident = meta(tmp_path, "chain3", "fcfs")["identity"]
    assert (ident["rate_per_s"], ident["kv_budget_tokens"], ident["seed"]) == (0.05, 40000, 2)


def test_run_load_prints_the_measured_capacity(tmp_path: Path) -> None:
    # About 4 s (the capacity probe: ~10 FCFS runs of 200 tasks), so not marked slow.
    result = ok("run", "-w", "chain3", "-s", "fcfs", "-n", "4", "--load", "0.5",
                "--out", tmp_path)  # fmt: skip
    preset = load_preset("a100-qwen32b")
    capacity = measure_capacity("chain3", (), preset, A100_BUDGET)  # cached by the run
    assert capacity == pytest.approx(0.283, rel=0.02)  # the value workloads/registry.py uses
    assert (
        f"Poisson rate {0.5 * capacity:.4g} tasks/s "
        f"(load 0.5 x measured capacity {capacity:.4g} tasks/s)"
    ) in text(result)
    m = meta(tmp_path, "chain3", "fcfs")
    assert m["load"] == 0.5
    assert m["capacity_tps"] == capacity
    assert m["identity"]["rate_per_s"] == 0.5 * capacity


def test_suggested_minimum_budget_is_enough(tmp_path: Path) -> None:
    base = ("run", "-w", "chain3", "-s", "fcfs", "-n", "2", "--out", tmp_path)
    result = invoke(*base, "--kv-budget", "4000")
    assert result.exit_code == 2
    # chain3's largest call: 4,096 prefix + 256 input or output, + 256 output; SGLang clips
    # max_new_tokens to budget - prompt - 2, which must leave the whole output
    assert "(prompt 4,352 + output 256 + 2 spare tokens = 4,610)" in result.stderr
    found = re.search(r"raise --kv-budget to at least ([\d,]+)", result.stderr)
    assert found is not None
    least = int(found.group(1).replace(",", ""))
    assert least == 4_610
    assert invoke(*base, "--kv-budget", least - 1).exit_code == 2
    assert list(rows(ok(*base, "--kv-budget", least))) == ["fcfs"]


# -- bad input: one line on stderr, exit code 2, no traceback ------------------------------------
KNOWN_WORKLOADS = ", ".join(WORKLOADS.names())
KNOWN_SCHEDULERS = ", ".join(SCHEDULERS.names())
RUN = ("run", "-w", "chain3", "-s", "fcfs", "-n", "2")
BAD_RUNS = [
    (("-w", "nope"), f"unknown workload 'nope'; known: {KNOWN_WORKLOADS}"),
    (("-s", "fcfs,nope"), f"unknown scheduler 'nope'; known: {KNOWN_SCHEDULERS}"),
    (
        ("--preset", "nope"),
        "unknown preset 'nope'; known: a100-qwen32b, h100-llama8b, h200-llama8b",
    ),
    (("--rate", "0"), "--rate must be a positive number, got 0.0"),
    (("--rate", "-1"), "--rate must be a positive number, got -1.0"),
    (("--rate", "nan"), "--rate must be a positive number, got nan"),
    (("--load", "0"), "--load must be a positive number, got 0.0"),
    (("--rate", "0.1", "--load", "0.5"), "give either --rate or --load, not both"),
    (("--tasks", "0"), "--tasks must be a positive integer, got 0"),
    (("--seed", "-1"), "--seed must be >= 0, got -1"),
    (("--kv-budget", "0"), "--kv-budget must be a positive number of tokens, got 0"),
    (
        ("--kv-budget", "100"),
        "KV budget of 100 tokens is smaller than the largest call in 'chain3' (prompt 4,352 + "
        "output 256 + 2 spare tokens = 4,610); raise --kv-budget to at least 4,610",
    ),
    (("--length-hint", "foo"), "--length-hint must be `none` or `oracle`, got 'foo'"),
    (("--engine", "foo"), "unknown engine 'foo'; known: sim"),
    (("-s", "fcfs,fcfs"), "--scheduler lists a name twice: fcfs,fcfs"),
    (("--workload-param", "foo"), "--workload-param expects key=value, got 'foo'"),
    (("--workload-param", "=3"), "--workload-param expects key=value, got '=3'"),
    (("--scheduler-param", "fcfs"), "--scheduler-param expects key=value, got 'fcfs'"),
    (("--scheduler-param", "x=1"), "--scheduler-param expects scheduler.key=value, got 'x'"),
    (("--scheduler-param", "lpm.=1"), "--scheduler-param expects scheduler.key=value, got 'lpm.'"),
    (
        ("--workload-param", "nope=1"),
        "workload 'chain3': unknown parameter 'nope'; valid: prefix_tokens, input_tokens, "
        "output_tokens, delay_s",
    ),
    (
        ("--workload-param", "prefix_tokens=-5"),
        "workload 'chain3': prefix_tokens must be a positive integer, got -5",
    ),
    (("--workload-param", "delay_s=soon"), "delay_s must be a number >= 0.0, got 'soon'"),
    (("--scheduler-param", "fcfs.x=1"), "scheduler 'fcfs' takes no parameters (got x)"),
    (("-s", "lpm", "--scheduler-param", "lpm.nope=1"), "scheduler 'lpm': "),
    (("-s", "lpm", "--scheduler-param", "lpm.in_batch_check_tokens=foo"), "lpm: in_batch_check"),
    (("-s", "topas", "--scheduler-param", "topas.use_reuse=False"), "must be true or false"),
    (
        ("-s", "autellix", "--scheduler-param", "autellix.levels=0"),
        "levels must be an integer >= 1, got 0",
    ),
    (
        ("--scheduler-param", "lpm.fallback_above=3"),
        "--scheduler-param for 'lpm', which is not in this run (schedulers: fcfs)",
    ),
    (("--endpoint", "http://127.0.0.1:1"), "--endpoint is for --engine sglang"),
    (("--model", "m"), "--model is for --engine sglang; --engine sim does not use it"),
    (("--sglang-arg", "--x"), "--sglang-arg is for --engine sglang"),
    (("-s", "all,nope"), f"unknown scheduler 'nope'; known: {KNOWN_SCHEDULERS}"),
    (
        ("--scheduler-param", "lmp.fallback_above=3"),
        f"unknown scheduler 'lmp'; known: {KNOWN_SCHEDULERS}",
    ),
]


def assert_one_line_error(result: Result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert message in lines[0]


@pytest.mark.parametrize(("args", "message"), BAD_RUNS, ids=[" ".join(a) for a, _ in BAD_RUNS])
def test_run_rejects_bad_input(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    out = tmp_path / "runs"
    result = invoke(*RUN, "--out", out, *args)
    assert_one_line_error(result, message)
    assert not out.exists()


def test_an_output_path_under_a_file_fails_before_running(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    for args in (
        (*RUN, "--out", blocker / "runs"),
        ("sweep", "-w", "chain3", "-s", "fcfs", "--rate", "0.1", "-n", "2", "--out", blocker),
        ("tune", "-w", "chain3", "-n", "2", "--out", blocker / "t"),
    ):
        assert_one_line_error(invoke(*args), f"{blocker} is not a directory")
    assert_one_line_error(
        invoke("workloads", "export", "dag4", "-o", blocker / "x.jsonl"),
        f"cannot write {blocker / 'x.jsonl'}: {blocker} is not a directory",
    )
    assert blocker.read_text() == ""


def test_an_unwritable_output_fails_before_running(tmp_path: Path) -> None:
    ro = unwritable_dir(tmp_path)
    for args in (
        (*RUN, "--out", ro / "runs"),
        ("sweep", "-w", "chain3", "-s", "fcfs", "--rate", "0.1", "-n", "2", "--out", ro / "s"),
        ("report", "tests", "--out", ro / "r"),
    ):
        assert_one_line_error(invoke(*args), f"cannot write in {ro}")
    assert_one_line_error(
        invoke("workloads", "export", "dag4", "-o", ro / "x.jsonl"), "takes no new files"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("workloads", "show", "nope"), f"unknown workload 'nope'; known: {KNOWN_WORKLOADS}"),
        (("workloads", "validate", "/nonexistent/trace.jsonl"), "cannot read trace"),
        (("presets", "show", "nope"), "unknown preset 'nope'"),
        (
            ("workloads", "show", "dag4", "--workload-param", "fanout=3"),
            "workload 'dag4': unknown parameter 'fanout'",
        ),
    ],
    ids=["show-unknown", "validate-missing-file", "preset-unknown", "show-unknown-param"],
)
def test_other_commands_reject_bad_input(args: tuple[str, ...], message: str) -> None:
    assert_one_line_error(invoke(*args), message)


def test_export_rejects_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    result = invoke("workloads", "export", "dag4", "-n", "0", "-o", path)
    assert_one_line_error(result, "workload 'dag4': num_tasks must be a positive integer, got 0")
    assert not path.exists()


# -- workloads -----------------------------------------------------------------------------------
def test_workloads_list() -> None:
    out = text(ok("workloads", "list"))
    for name in WORKLOADS.names():
        spec = WORKLOADS.get(name)
        rate = "the file's" if name == "trace" else f"{spec.default_rate_per_s:g}"
        assert f"│ {name} │ {spec.description} │ {rate}" in out
    assert "0.8 x capacity 0.283/s (FCFS knee, a100-qwen32b)" in out


def test_workloads_show() -> None:
    out = text(ok("workloads", "show", "dag4"))
    assert out.startswith("workload dag4 (seed 0)")
    for agent in "ABCD":
        assert f"│ {agent} │ 4,096 │" in out
    assert "task t0000 (4 calls)" in out
    # Segment keys print as they are (rich would otherwise render `:A:`/`:B:` as emoji).
    assert "│ s1 │ B │ B │ s0 │ agent:B:4096, t0000/s0/out:256 │ 4,352 │ 256 │ 256 │ 0 │" in out
    assert "max_tokens = exact" in out
    assert "│ s3 │ D │ D │ s1,s2 │ agent:D:4096, t0000/s1/out:256, t0000/s2/out:256 │" in out
    assert "prefix_tokens = 4096" in out

    capped = text(ok("workloads", "show", "dag4", "--workload-param", "max_tokens=cap"))
    assert "│ 4,352 │ 256 │ 4,096 │ 0 │" in capped  # the cap sent, the true output kept
    custom = text(ok("workloads", "show", "dag4", "--workload-param", "prefix_tokens=100"))
    assert "│ A │ 100 │" in custom
    assert "prefix_tokens = 100" in custom


def test_workloads_export_then_validate(tmp_path: Path) -> None:
    path = tmp_path / "dag4.jsonl"
    out = text(ok("workloads", "export", "dag4", "-n", "5", "--seed", "3", "-o", path))
    assert out == f"wrote {path}: 5 tasks, 20 calls"
    assert text(ok("workloads", "validate", path)) == f"{path}: valid: 5 tasks, 20 calls, 4 agents"
    ok("workloads", "validate", path, "--kv-budget", str(A100_BUDGET))
    assert load_workload(path).tasks == generate("dag4", num_tasks=5, seed=3).tasks

    rated = tmp_path / "rated.jsonl"
    ok("workloads", "export", "chain3", "-n", "2", "--rate", "2", "-o", rated,
       "--workload-param", "output_tokens=64")  # fmt: skip
    w = load_workload(rated)
    assert w.params["rate_per_s"] == 2.0
    assert {s.output_tokens for _, s in w.stages()} == {64}


def test_workloads_validate_lists_every_problem(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    ok("workloads", "export", "dag4", "-n", "3", "-o", good)
    lines = good.read_text().splitlines()
    t1, t2 = json.loads(lines[1]), json.loads(lines[2])
    t1["stages"][0]["output_tokens"] = -1
    t2["stages"][1]["agent"] = "Z"
    lines[1], lines[2], lines[3] = json.dumps(t1), json.dumps(t2), "{not json"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")

    result = invoke("workloads", "validate", bad)
    assert result.exit_code == 2
    assert isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    assert result.stderr.splitlines() == [
        f"error: {bad}: 3 problem(s)",
        f"{bad}:2: stages[0].output_tokens: expected a positive integer, got -1",
        f"{bad}:3: stages[1].agent: unknown agent 'Z'; the header has ['A', 'B', 'C', 'D']",
        f"{bad}:4: task: invalid JSON: Expecting property name enclosed in double quotes "
        "(column 2)",
    ]

    result = invoke("workloads", "validate", good, "--kv-budget", "4000")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[0] == f"error: {good}: 12 problem(s)"
    assert (
        f"{good}:2: stages[0].prompt: prompt of 4,352 tokens + output 256 exceeds the KV budget "
        "of 4,000 tokens"
    ) in result.stderr.splitlines()


# -- schedulers and presets ----------------------------------------------------------------------
def test_schedulers_list() -> None:
    result = ok("schedulers", "list")
    out = text(result)
    group = {n: "paper" for n in (*BASELINES, "topas")} | {n: "peer" for n in PEERS + PEERS_2026}
    group |= {n: "ablation" for n in ABLATIONS} | {n: "by name" for n in UNGROUPED}
    assert set(group) == set(SCHEDULERS.names())  # every scheduler has a group, or says why not
    yes = ("no", "yes")
    for name in SCHEDULERS.names():
        caps = capabilities(name)
        cells = (name, group.get(name, ""), yes[caps.acts_while_full], yes[caps.preempts])
        row = "│ " + " │ ".join(cells) + " │"
        assert " ".join(row.split()) in out
    assert "│ fcfs │ paper │ no │ no │ First come, first served: the queue as it stands" in out
    assert "│ kvflow │ peer │ no │ no │ FCFS admission; eviction by steps-to-execution" in out
    assert "│ topas │ paper │ yes │ yes │ TOPAS: joint prefix residency" in out
    assert "│ topas-no-preempt │ ablation │ no │ no │ TOPAS asked only where" in out
    # whole descriptions, wrapped in their cell (the first docstring line stopped at "R'")
    rows = [x.split("│") for x in ANSI.sub("", result.stdout).splitlines() if "│" in x]
    desc = " ".join(" ".join(x[-2].split()) for x in rows)
    assert "(ablation: the joint choice off; R' is still chosen and pinned)." in desc
    for name, why in UNGROUPED.items():
        assert f"In no group: {why}." in desc, name


def test_presets_list() -> None:
    out = text(ok("presets", "list"))
    for name in preset_names():
        p = load_preset(name)
        assert (
            f"│ {name} │ {p.gpu.name} │ {p.model.name} │ {p.kv_bytes_per_token:,} │ "
            f"{p.derived_kv_budget_tokens:,} │"
        ) in out
    assert "│ a100-qwen32b │ A100-SXM4-80GB │ Qwen2.5-32B-Instruct │ 262,144 │ 18,692 │" in out


def test_presets_show() -> None:
    lines = ANSI.sub("", ok("presets", "show", "a100-qwen32b").stdout).splitlines()
    assert lines[0].startswith("a100-qwen32b: One A100-SXM4-80GB serving Qwen2.5-32B-Instruct")
    for expected in (
        "gpu.peak_tflops = 312.0",
        "model.n_kv_heads = 8",
        "efficiency.eta_c = 0.6",
        "serving.mem_fraction_static = 0.88",
        "kv_bytes_per_token = 262,144",
        "derived_kv_budget_tokens = 18,692",
    ):
        assert f"  {expected}" in lines


def test_top_level_help_has_an_example() -> None:
    out = text(ok("--help"))
    assert "Usage:" in out
    assert "Example: topas-bench run --workload metagpt-tl --scheduler all" in out


@pytest.mark.parametrize(
    "command",
    [
        ("run",),
        ("workloads", "list"),
        ("workloads", "show"),
        ("workloads", "export"),
        ("workloads", "validate"),
        ("schedulers", "list"),
        ("presets", "list"),
        ("presets", "show"),
    ],
    ids=" ".join,
)
def test_every_command_has_help_with_an_example(command: tuple[str, ...]) -> None:
    out = text(ok(*command, "--help"))
    assert "Usage:" in out
    assert f"topas-bench {' '.join(command)}" in out


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("paper", (*BASELINES, "topas")),
        ("peers", PEERS),
        ("all", (*BASELINES, "topas", *PEERS)),
        ("baselines", BASELINES),
        ("sglang", ("fcfs", "lpm", *SGLANG_STOCK)),
        ("ablations", ("topas", *ABLATIONS)),
        ("everything", tuple(SCHEDULERS.names())),
        ("lpm, fcfs", ("lpm", "fcfs")),
        ("paper,topas-base", (*BASELINES, "topas", "topas-base")),
        ("topas,paper", ("topas", *BASELINES)),
        ("baselines,ablations", (*BASELINES, "topas", *ABLATIONS)),
        ("paper,peers", (*BASELINES, "topas", *PEERS)),
    ],
)
def test_scheduler_groups(spec: str, expected: tuple[str, ...]) -> None:
    from topas_bench.spec import parse_schedulers

    assert parse_schedulers(spec) == expected


def test_saturation_prints_each_schedulers_knee_and_the_best() -> None:
    result = invoke("workloads", "saturation", "chain3", "-s", "fcfs,spf")
    assert result.exit_code == 0, result.output
    pre = load_preset("a100-qwen32b")
    budget = pre.derived_kv_budget_tokens
    fcfs = measure_capacity("chain3", (), pre, budget)  # the capacity a load is relative to
    spf = measure_capacity("chain3", (), pre, budget, "spf")
    assert f"fcfs  {fcfs:.5f} tasks/s" in result.stdout
    assert f"spf  {spf:.5f} tasks/s" in result.stdout
    best, name = max((fcfs, "fcfs"), (spf, "spf"))
    assert f"best  {best:.5f} tasks/s ({name}; KV budget {budget})" in result.stdout
    bad = invoke("workloads", "saturation", "chain3", "-s", "nope")
    assert bad.exit_code == 2 and bad.stderr.startswith("error: ")


def test_saturation_takes_range_parameters() -> None:
    """A range given on the command line arrives as a list; the capacity cache needs it
    hashable (it raised TypeError)."""
    result = invoke(
        "workloads", "saturation", "metagpt-sop", "-s", "fcfs",
        "--workload-param", "prd_tokens=[250,350]",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    pre = load_preset("a100-qwen32b")
    want = measure_capacity(
        "metagpt-sop", (("prd_tokens", (250, 350)),), pre, pre.derived_kv_budget_tokens
    )
    assert f"fcfs  {want:.5f} tasks/s" in result.stdout


# -- small things a new user meets -----------------------------------------------------------
def test_version() -> None:
    from topas_bench import __version__

    assert ok("--version").stdout.strip() == f"topas-bench {__version__}"


def test_default_rate_on_another_setting_warns_and_suggests_load(tmp_path: Path) -> None:
    base = ("run", "-w", "chain3", "-s", "fcfs", "-n", "2", "--out", tmp_path)
    other = ok(*base, "--preset", "h100-llama8b")
    said = " ".join(other.stderr.split())
    assert "warning: chain3's default rate" in said and "--load 0.8" in said
    assert "h100-llama8b, 414,581 tokens" in said
    assert "warning" in " ".join(ok(*base, "--kv-budget", "30000").stderr.split())
    for quiet in ((), ("--rate", "0.1"), ("--kv-budget", str(A100_BUDGET))):
        assert "warning" not in ok(*base, *quiet).stderr
