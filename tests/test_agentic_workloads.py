"""`code-agent` and `deep-research` (workloads/agentic.py): shapes, growing prompts, tool waits,
determinism, bad parameters, the trace-file round trip and a simulator run of each."""

from __future__ import annotations

import math
import statistics
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from topas_bench.errors import TopasError
from topas_bench.experiment import plan_run
from topas_bench.harness import run_cell
from topas_bench.results import read_table
from topas_bench.spec import RunSpec
from topas_bench.workloads.agentic import (
    CodeAgentParams,
    DeepResearchParams,
    tool_wait_s,
)
from topas_bench.workloads.model import Stage, Task, output_key
from topas_bench.workloads.registry import WORKLOADS, generate
from topas_bench.workloads.trace import dump_workload, load_workload, validate

NAMES = ("code-agent", "deep-research")
PARAMS: dict[str, Any] = {"code-agent": CodeAgentParams, "deep-research": DeepResearchParams}


def _quantile(xs: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs), q))


def test_registered_with_a_measured_default_rate() -> None:
    for name in NAMES:
        spec = WORKLOADS.get(name)
        assert spec.default_rate_per_s > 0 and "capacity" in spec.rate_note
        assert spec.max_tokens == "cap"


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_per_seed(name: str) -> None:
    a = generate(name, num_tasks=15, seed=3)
    assert a == generate(name, num_tasks=15, seed=3)
    assert a.tasks != generate(name, num_tasks=15, seed=4).tasks
    more = generate(name, num_tasks=20, seed=3)
    assert more.tasks[:15] == a.tasks  # the first n tasks do not depend on the count


def test_code_agent_turns_extend_the_previous_turn() -> None:
    w = generate("code-agent", num_tasks=60, seed=1)
    p = CodeAgentParams()
    assert [(a.name, a.prefix_tokens) for a in w.agents] == [("coder", 2048)]
    for task in w.tasks:
        assert p.turns[0] <= len(task.stages) <= p.turns[1]
        first = task.stages[0]
        assert first.deps == () and first.delay_s == 0.0 and first.kind == "issue"
        assert [g.key for g in first.prompt] == ["agent:coder", f"{task.id}/input"]
        for prev, cur in zip(task.stages, task.stages[1:], strict=False):
            assert cur.deps == (prev.id,) and cur.agent == "coder"
            n = len(prev.prompt)
            assert cur.prompt[:n] == prev.prompt  # the previous turn's context is a prefix
            out, obs = cur.prompt[n:]
            assert (out.key, out.tokens) == (output_key(task.id, prev.id), prev.output_tokens)
            assert obs.key == f"{task.id}/{cur.id}/obs"
            assert p.observation_tokens[0] <= obs.tokens <= p.observation_tokens[1]
            assert cur.prompt_tokens > prev.prompt_tokens
            assert cur.kind in ("after_edit", "after_test") and cur.delay_s > 0
        for s in task.stages:
            assert p.action_tokens[0] <= s.output_tokens <= p.action_tokens[1]
            assert s.max_new_tokens == 4096  # the cap, the default


def _waits(stages: list[Stage], kind: str) -> list[float]:
    return [s.delay_s for s in stages if s.kind == kind]


def test_code_agent_tool_waits_follow_the_fitted_lognormals() -> None:
    w = generate("code-agent", num_tasks=600, seed=2)
    stages = [s for _, s in w.stages()]
    p = CodeAgentParams()
    tests, edits = _waits(stages, "after_test"), _waits(stages, "after_edit")
    assert len(tests) / (len(tests) + len(edits)) == pytest.approx(p.test_fraction, abs=0.03)
    assert statistics.median(tests) == pytest.approx(p.test_median_s, rel=0.15)
    assert _quantile(tests, 0.9) == pytest.approx(p.test_p90_s, rel=0.25)
    assert statistics.median(edits) == pytest.approx(p.fast_median_s, rel=0.10)
    assert _quantile(edits, 0.9) == pytest.approx(p.fast_p90_s, rel=0.15)
    assert max(tests) <= p.max_tool_s and min(edits) > 0
    assert max(tests) > 120  # seconds to minutes: a heavy tail


def test_tool_wait_is_the_lognormal_it_names() -> None:
    rng = np.random.Generator(np.random.PCG64(0))
    xs = [tool_wait_s(rng, 3.0, 12.0, 1e9) for _ in range(20_000)]
    assert statistics.median(xs) == pytest.approx(3.0, rel=0.05)
    assert _quantile(xs, 0.9) == pytest.approx(12.0, rel=0.05)
    assert tool_wait_s(rng, 5.0, 5.0, 100.0) == 5.0  # p90 = median: a fixed time
    assert max(tool_wait_s(rng, 5.0, 500.0, 7.5) for _ in range(200)) == 7.5


def _check_research_task(task: Task, p: DeepResearchParams) -> None:
    stages = {s.id: s for s in task.stages}
    k = (len(stages) - 2) // 2
    assert p.fanout[0] <= k <= p.fanout[1] and len(stages) == 2 * k + 2
    plan, write = stages["plan"], stages["write"]
    assert plan.deps == () and plan.agent == "planner"
    plan_seg = (output_key(task.id, "plan"), plan.output_tokens)
    for j in range(1, k + 1):
        search, read = stages[f"search{j}"], stages[f"read{j}"]
        assert search.deps == ("plan",) and read.deps == (f"search{j}",)
        assert search.agent == read.agent == "researcher"
        assert plan_seg in [(g.key, g.tokens) for g in search.prompt]
        n = len(search.prompt)
        assert read.prompt[:n] == search.prompt  # the read call extends the search call
        assert read.prompt[n].key == output_key(task.id, search.id)
        assert read.prompt[n + 1].key == f"{task.id}/read{j}/pages"
        assert search.delay_s > 0 and read.delay_s > 0  # each after a tool wait
    assert write.deps == tuple(f"read{j}" for j in range(1, k + 1)) and write.agent == "writer"
    keys = [g.key for g in write.prompt]
    assert keys == [
        "agent:writer", f"{task.id}/input", output_key(task.id, "plan"),
        *(output_key(task.id, f"read{j}") for j in range(1, k + 1)),
    ]  # fmt: skip
    for j in range(1, k + 1):  # the writer reads each branch's notes at their length
        assert write.prompt[2 + j].tokens == stages[f"read{j}"].output_tokens


def test_deep_research_fans_out_and_joins() -> None:
    w = generate("deep-research", num_tasks=200, seed=5)
    p = DeepResearchParams()
    assert {a.name for a in w.agents} == {"planner", "researcher", "writer"}
    for task in w.tasks:
        _check_research_task(task, p)
    widths = {(len(t.stages) - 2) // 2 for t in w.tasks}
    assert widths == set(range(p.fanout[0], p.fanout[1] + 1))
    stages = [s for _, s in w.stages()]
    searches = _waits(stages, "search")
    assert statistics.median(searches) == pytest.approx(p.search_median_s, rel=0.10)
    assert _quantile(searches, 0.9) == pytest.approx(p.search_p90_s, rel=0.15)
    assert statistics.median(_waits(stages, "read")) == pytest.approx(p.fetch_median_s, rel=0.1)
    assert 1 < statistics.median(searches) < 10  # tool waits of seconds


@pytest.mark.parametrize("name", NAMES)
def test_requests_fit_the_kv_budget(name: str) -> None:
    assert generate(name, num_tasks=300, seed=8).max_request_tokens < 18_000
    worst = {f.name: f.default[1] for f in fields(PARAMS[name]) if isinstance(f.default, tuple)}
    assert generate(name, num_tasks=2, **worst).max_request_tokens < 17_000


@pytest.mark.parametrize("name", NAMES)
def test_output_scale_keeps_prompts_growing(name: str) -> None:
    w = generate(name, num_tasks=10, seed=1, output_scale=2.0)
    base = generate(name, num_tasks=10, seed=1)
    assert validate(w) == []
    for t, b in zip(w.tasks, base.tasks, strict=True):
        assert [s.output_tokens for s in t.stages] == [2 * s.output_tokens for s in b.stages]
        if name == "code-agent":
            for prev, cur in zip(t.stages, t.stages[1:], strict=False):
                assert cur.prompt[: len(prev.prompt)] == prev.prompt
        else:
            _check_research_task(t, DeepResearchParams())


@pytest.mark.parametrize(
    ("name", "kwargs", "param"),
    [
        ("code-agent", {"turns": (0, 3)}, "turns"),
        ("code-agent", {"turns": (9, 3)}, "turns"),
        ("code-agent", {"test_fraction": 1.5}, "test_fraction"),
        ("code-agent", {"test_p90_s": 2.0}, "test_p90_s"),
        ("code-agent", {"fast_median_s": 0.0}, "fast_median_s"),
        ("code-agent", {"max_tool_s": math.inf}, "max_tool_s"),
        ("code-agent", {"prefix_tokens": "big"}, "prefix_tokens"),
        ("code-agent", {"max_tokens": "huge"}, "max_tokens"),
        ("code-agent", {"turn": 5}, "turn"),
        ("deep-research", {"fanout": "x"}, "fanout"),
        ("deep-research", {"fetch_median_s": -1.0}, "fetch_median_s"),
        ("deep-research", {"search_p90_s": 1.0}, "search_p90_s"),
        ("deep-research", {"max_tokens": "exact", "max_tokens_cap": 10}, "max_tokens_cap"),
    ],
)
def test_bad_parameters_are_one_line_errors(name: str, kwargs: dict[str, Any], param: str) -> None:
    with pytest.raises(TopasError, match=param) as e:
        generate(name, num_tasks=2, **kwargs)
    assert str(e.value).startswith(f"workload {name!r}: ") and "\n" not in str(e.value)


def _run(workload: str, scheduler: str, out: Path, rate_per_s: float | None = None) -> Any:
    """A 6-task run; a file at its own recorded arrivals (no rate)."""
    spec = RunSpec(workload=workload, schedulers=(scheduler,), num_tasks=6, seed=2,
                   rate_per_s=rate_per_s, out=out)  # fmt: skip
    return run_cell(plan_run(spec), scheduler)


@pytest.mark.parametrize("name", NAMES)
def test_export_then_run_the_file_gives_identical_results(name: str, tmp_path: Path) -> None:
    path = tmp_path / f"{name}.jsonl"
    w = generate(name, num_tasks=6, seed=2, rate_per_s=0.05)
    dump_workload(w, path)
    assert load_workload(path).tasks == w.tasks and validate(load_workload(path)) == []
    for scheduler in ("fcfs", "topas"):
        direct = _run(name, scheduler, tmp_path / "direct", rate_per_s=0.05)
        replay = _run(str(path), scheduler, tmp_path / "file")
        assert direct.summary["tasks"] == 6  # every task finished
        a = read_table(direct.run_dir, "tasks").sort_values("task_id")
        b = read_table(replay.run_dir, "tasks").sort_values("task_id")
        assert list(a["jct_s"]) == list(b["jct_s"])


def test_the_committed_tool_workloads_sweep_file_is_valid() -> None:
    from topas_bench.spec import parse_schedulers
    from topas_bench.sweep import load_specs, read_toml

    path = Path(__file__).resolve().parents[1] / "results" / "tool-workloads.toml"
    [(spec, _)] = load_specs(read_toml(path), {}, str(path), base=path.parent)
    assert spec.workloads == NAMES and spec.seeds == tuple(range(10)) and spec.loads == (0.8,)
    assert set(parse_schedulers("paper,peers")) <= set(spec.schedulers)
    assert spec.tuned is not None and not spec.tuned_only  # tuned forms beside the defaults
    runs = spec.runs(Path("o"))  # every group a valid run specification
    assert {r.workload for r in runs} == set(NAMES)
    assert {r.seed for r in runs} == set(range(10))
