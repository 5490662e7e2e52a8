"""MetaGPT generators: prefix modes of metagpt-sop/-tl, and the -full variants' calls."""

from __future__ import annotations

from dataclasses import fields
from itertools import pairwise
from typing import Any

import pytest

from topas_bench.errors import TopasError
from topas_bench.runners.sim.config import check_fits
from topas_bench.workloads.metagpt_sop_full import SopFullParams
from topas_bench.workloads.metagpt_tl_full import TlFullParams
from topas_bench.workloads.model import Segment, Stage, Task, Workload, agent_key, output_key
from topas_bench.workloads.registry import generate
from topas_bench.workloads.trace import validate

BUDGET = 18_692  # a100-qwen32b's derived KV budget
ALL = ["metagpt-sop", "metagpt-tl", "metagpt-sop-full", "metagpt-tl-full"]


def _both(name: str, **kw: Any) -> tuple[Workload, Workload]:
    return (
        generate(name, prefix_mode="cache-friendly", **kw),
        generate(name, prefix_mode="faithful", **kw),
    )


def _is_prefix(a: tuple[Segment, ...], b: tuple[Segment, ...]) -> bool:
    return b[: len(a)] == a


@pytest.mark.parametrize("name", ALL)
def test_prefix_modes_change_only_where_tokens_sit(name: str) -> None:
    friendly, faithful = _both(name, num_tasks=20, seed=3)
    assert generate(name, num_tasks=20, seed=3) == friendly  # cache-friendly is the default
    assert friendly.params["prefix_mode"] == "cache-friendly"
    for a, b in zip(friendly.stages(), faithful.stages(), strict=True):
        sa, sb = a[1], b[1]
        assert (sa.id, sa.agent, sa.output_tokens, sa.deps, sa.delay_s, sa.kind) == (
            sb.id, sb.agent, sb.output_tokens, sb.deps, sb.delay_s, sb.kind,
        )  # fmt: skip
        # same call, same length; except a rewrite, which carries the review's template in
        # front when that template is part of the prefix (cache-friendly)
        assert sa.prompt_tokens - sb.prompt_tokens == (563 if sa.kind == "rewrite" else 0)
        assert sb.prompt[0].tokens <= sa.prompt[0].tokens
    for w in (friendly, faithful):
        assert validate(w, kv_budget_tokens=BUDGET) == []
        check_fits(w, BUDGET)


def test_sop_prefix_figures() -> None:
    friendly, faithful = _both("metagpt-sop", num_tasks=1)
    assert [a.prefix_tokens for a in friendly.agents] == [916, 721, 505, 375, 447]
    assert [a.prefix_tokens for a in faithful.agents] == [41, 47, 50, 149, 370]
    task = faithful.tasks[0]
    for stage in task.stages:  # the fixed template follows the content, per call
        assert stage.prompt[-1].key == f"{task.id}/{stage.id}/tmpl"
    assert task.stage("s0").prompt[-1].tokens == 875


def test_tl_faithful_prefix_is_cut_at_the_timestamp() -> None:
    friendly, faithful = _both("metagpt-tl", num_tasks=3, seed=1)
    assert [a.prefix_tokens for a in faithful.agents] == [25, 46, 57, 57, 28]
    full = {a.name: a.prefix_tokens for a in friendly.agents}
    for task in faithful.tasks:
        for stage in task.stages:
            rest = full[stage.agent] - stage.prompt[0].tokens
            assert stage.prompt[1] == Segment(f"{task.id}/{stage.id}/sys", rest)


@pytest.mark.parametrize("name", ALL)
def test_bad_prefix_mode(name: str) -> None:
    with pytest.raises(TopasError, match="prefix_mode must be one of cache-friendly, faithful"):
        generate(name, num_tasks=1, prefix_mode="greedy")


# -- metagpt-sop-full --------------------------------------------------------------------------
def _files(task: Task) -> list[list[Stage]]:
    """The Engineer's calls, one list per code file (starting at its write_code)."""
    blocks: list[list[Stage]] = []
    for s in task.stages:
        if s.kind == "write_code":
            blocks.append([s])
        elif s.kind in ("review", "rewrite"):
            blocks[-1].append(s)
    return blocks


def test_sop_full_call_sequence() -> None:
    w = generate("metagpt-sop-full", num_tasks=100, seed=2)
    n_files, n_rewrites = set(), 0
    for task in w.tasks:
        kinds = [s.kind for s in task.stages]
        assert kinds[:3] == ["write_prd", "write_design", "write_tasks"]
        files = _files(task)
        n_files.add(len(files))
        for block in files:
            ks = [s.kind for s in block]
            assert ks in (
                ["write_code", "review"],
                ["write_code", "review", "rewrite", "review"],
                ["write_code", "review", "rewrite", "review", "rewrite"],
            )
            n_rewrites += ks.count("rewrite")
        qa = kinds[3 + sum(len(b) for b in files) :]
        assert qa == ["write_test"] * len(files) + ["run_code"] * len(files)
        for prev, cur in pairwise(task.stages):
            assert cur.deps == (prev.id,)
            if cur.kind == "run_code":
                assert 4.5 <= cur.delay_s <= 8.0
            else:
                assert 0.004 <= cur.delay_s <= 0.15
    assert n_files == {3, 4, 5, 6}
    assert n_rewrites > 0
    off = generate("metagpt-sop-full", num_tasks=5, seed=2, qa="off", lbtm_probability=0.0)
    for task in off.tasks:
        assert {s.kind for s in task.stages} == {
            "write_prd", "write_design", "write_tasks", "write_code", "review",
        }  # fmt: skip


def test_sop_full_shared_prefixes() -> None:
    friendly, faithful = _both("metagpt-sop-full", num_tasks=30, seed=5)
    assert {a.name: a.prefix_tokens for a in friendly.agents} == {
        "ProductManager": 916, "Architect": 721, "ProjectManager": 505, "Engineer": 375,
        "Engineer.review": 751, "QaEngineer": 447, "QaEngineer.run": 309,
    }  # fmt: skip
    assert {a.name: a.prefix_tokens for a in faithful.agents} == {
        "ProductManager": 41, "Architect": 47, "ProjectManager": 50, "Engineer": 149,
        "Engineer.review": 188, "QaEngineer": 370, "QaEngineer.run": 148,
    }  # fmt: skip
    for w, tail in ((friendly, 0), (faithful, 1)):  # faithful: a per-call template at the end
        for task in w.tasks:
            files = _files(task)
            writes = [b[0] for b in files]
            for prev, cur in pairwise(writes):  # Legacy Code grows: prefix extension
                assert _is_prefix(prev.prompt[: len(prev.prompt) - tail], cur.prompt)
                block = files[writes.index(prev)]
                final = [s for s in block if s.kind in ("write_code", "rewrite")][-1]
                assert cur.prompt[len(prev.prompt) - tail] == Segment(
                    output_key(task.id, final.id), final.output_tokens
                )
            for block in files:
                for review, rewrite in pairwise(block):
                    if rewrite.kind != "rewrite":
                        continue
                    out = Segment(output_key(task.id, review.id), review.output_tokens)
                    body = review.prompt[: len(review.prompt) - tail]
                    assert rewrite.prompt[:-1] == (*body, out)
                    assert rewrite.prompt[-1] == Segment(f"{task.id}/{rewrite.id}/tmpl", 70)


# -- metagpt-tl-full ---------------------------------------------------------------------------
def test_tl_full_call_sequence() -> None:
    w = generate("metagpt-tl-full", num_tasks=60, seed=4)
    plans = set()
    for task in w.tasks:
        stages = task.stages
        assert [s.kind for s in stages[:3]] == ["classify", "detect_language", "plan"]
        tl = [s for s in stages if s.agent == "TeamLeader"]
        routes = [s.kind for s in tl[1:]]
        plans.add(len(routes))
        assert routes == ["route"] * (len(routes) - 1) + ["status"]
        summaries = [s for s in stages if s.kind == "summary"]
        assert len(summaries) == len(routes)  # every plan task ends with the worker's summary
        detect = [s.agent for s in stages if s.kind == "detect_language"]
        assert len(detect) == len(set(detect))  # once per role and job
        for prev, cur in pairwise(stages):
            assert cur.deps == (prev.id,)
            assert cur.delay_s <= 0.09
        writes = [s for s in stages if s.kind == "write_code"]
        commands = [s for s in stages if s.kind == "command"]
        assert len(writes) == len(commands) >= 3
        assert all(stages[stages.index(c) + 1].kind == "write_code" for c in commands)
    assert plans == {4, 5}


def test_tl_full_think_loops_extend_until_the_memory_cap() -> None:
    w = generate("metagpt-tl-full", num_tasks=40, seed=9)
    keep = int(BUDGET * 0.8)
    cuts = 0
    for task in w.tasks:
        by_agent: dict[str, list[Stage]] = {}
        for s in task.stages:
            assert s.prompt_tokens <= keep
            by_agent.setdefault(s.agent, []).append(s)
        for agent in ("TeamLeader", "ProductManager", "Architect", "ProjectManager", "Engineer"):
            for prev, cur in pairwise(by_agent.get(agent, [])):
                body = prev.prompt[:-1]  # without the command prompt
                assert prev.prompt[-1].tokens == 368 == cur.prompt[-1].tokens
                if _is_prefix(body, cur.prompt):
                    assert cur.prompt_tokens > prev.prompt_tokens
                else:  # post_cut_by_msg dropped the oldest messages
                    cuts += 1
                    assert cur.prompt[0] == prev.prompt[0]
                    assert prev.prompt_tokens + cur.output_tokens > keep - 2500
    assert cuts > 0  # the Engineer's memory does reach the cap


def test_tl_full_faithful_keys() -> None:
    _, faithful = _both("metagpt-tl-full", num_tasks=2, seed=1)
    prefix = {a.name: a.prefix_tokens for a in faithful.agents}
    assert prefix["TeamLeader"] == 25 and prefix["Engineer"] == 28
    assert prefix["Engineer.write"] == 118 and prefix["TeamLeader.quick"] == 25
    for task in faithful.tasks:
        for s in task.stages:
            assert s.prompt[0] == Segment(agent_key(s.agent), prefix[s.agent])
            if s.agent == "Engineer.write":
                continue
            rest = s.prompt[1].key
            if s.agent.endswith(".info"):  # fixed when the role is created: per job
                assert rest == f"{task.id}/{s.agent}/info"
            else:  # the clock ticks: per call
                assert rest == f"{task.id}/{s.id}/sys"


@pytest.mark.parametrize(
    ("name", "cls"), [("metagpt-sop-full", SopFullParams), ("metagpt-tl-full", TlFullParams)]
)
def test_full_worst_case_fits_budget(name: str, cls: type) -> None:
    worst = {f.name: f.default[1] for f in fields(cls) if isinstance(f.default, tuple)}
    if name == "metagpt-tl-full":
        worst = {k: v for k, v in worst.items() if not k.endswith("_ms")}
    w = generate(name, num_tasks=3, seed=0, **worst)
    check_fits(w, BUDGET)
    assert validate(w, kv_budget_tokens=BUDGET) == []


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("metagpt-sop-full", {"qa": "maybe"}, "qa must be on or off"),
        ("metagpt-sop-full", {"lbtm_probability": 1.5}, "lbtm_probability must be <= 1"),
        ("metagpt-sop-full", {"files": (0, 3)}, "files must be a token range"),
        ("metagpt-tl-full", {"plan_tasks": (2, 4)}, "plan_tasks must be at least 3"),
        (
            "metagpt-tl-full",
            {"context_tokens": 9000},
            r"keeps 7,200 prompt tokens \(80%\), but \w+'s .* need [\d,]+: "
            r"raise context_tokens to at least [\d,]+ for this call",
        ),
        ("metagpt-tl-full", {"engineer_before_timestamp_tokens": 50}, "before the timestamp"),
    ],
)
def test_full_bad_params(name: str, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(TopasError, match=match):
        generate(name, num_tasks=2, **kwargs)
