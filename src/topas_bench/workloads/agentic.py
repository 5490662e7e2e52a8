"""Agentic workloads where tool waits matter: `code-agent` and `deep-research`.

Both put a client-side tool call (`Stage.delay_s`) between LLM calls, drawn per call from a
lognormal fitted to a median and a 90th percentile (`tool_wait_s`), and both grow an agent's
prompt call by call, so an agent's previous call (prompt and output) is a prefix of its next.
Every source and every choice of ours is in docs/workload-format.md ("Agentic workloads").
No prompt text is used: a segment is a key and a length.

`code-agent` (an edit / run-tests / read-output loop, as a SWE-bench agent runs: Continuum,
arXiv 2511.02230, Fig. 2): one ``coder`` agent, ``turns`` calls per task. Turn ``s0`` reads the
agent's system prompt and the issue (``<task>/input``); turn ``s<i>`` reads turn ``s<i-1>``'s
whole prompt, its output (the action) and the tool's observation (``<task>/s<i>/obs``), and is
sent after that tool ran: a file read or edit (fast) or, with probability ``test_fraction``, a
test / script run (slow, seconds to minutes).

`deep-research` (a planner fanning out search and read calls, a writer joining them: Tokencake's
Deep-Research application, arXiv 2510.18586): ``plan`` (``planner``) reads the question and
writes the research plan; then ``fanout`` branches, each a ``researcher`` searching then reading:
``search<j>`` reads the question, the plan and the search results (``<task>/search<j>/results``),
sent after a search-API wait, and picks sources; ``read<j>`` extends ``search<j>``'s prompt with its
output and the fetched pages (``<task>/read<j>/pages``), sent after a fetch wait, and writes notes;
``write`` (``writer``) reads the question, the plan and every branch's notes and writes the report.

Lengths are drawn uniformly (inclusive) from their ranges, per task in stage order, from the
workload's content stream; tool waits from the same stream. ``max_tokens`` (`lengths`): ``cap``
(default: an agent client sends one fixed cap and the call ends at EOS) or ``exact``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from topas_bench.errors import TopasError
from topas_bench.workloads.lengths import METAGPT_CAP
from topas_bench.workloads.model import Agent, Segment, Stage, agent_key, output_key
from topas_bench.workloads.params import check_params
from topas_bench.workloads.registry import family, uniform_tokens

Range = tuple[int, int]

#: z of the standard normal's 90th percentile: a lognormal with median m and p90 q has
#: sigma = ln(q / m) / Z90.
Z90 = 1.2815515655446004


def tool_wait_s(rng: np.random.Generator, median_s: float, p90_s: float, max_s: float) -> float:
    """One tool call's duration: lognormal with this median and 90th percentile, at most
    `max_s` (a client's tool timeout), rounded to the millisecond (trace files keep it exactly)."""
    sigma = math.log(p90_s / median_s) / Z90
    return round(min(median_s * math.exp(sigma * float(rng.standard_normal())), max_s), 3)


def _check_waits(*pairs: tuple[str, float, float]) -> None:
    for name, median_s, p90_s in pairs:
        if median_s <= 0:
            raise TopasError(f"{name}_median_s must be > 0, got {median_s!r}")
        if p90_s < median_s:
            raise TopasError(f"{name}_p90_s ({p90_s}) must be >= {name}_median_s ({median_s})")


def _stage(
    sid: str, agent: str, prompt: list[Segment], out: int, deps: tuple[str, ...], delay: float,
    kind: str,
) -> Stage:  # fmt: skip
    return Stage(sid, agent, tuple(prompt), out, deps, delay, kind, max_new_tokens=out)


# --- code-agent -------------------------------------------------------------------------------

CODER = "coder"


@dataclass(frozen=True)
class CodeAgentParams:
    """`code-agent`'s lengths and tool-time distribution (docs/workload-format.md has the
    source of each default)."""

    prefix_tokens: int = 2048  # the coder's system prompt + tool instructions (ours)
    issue_tokens: Range = (100, 600)  # the task's issue text (SWE-bench: mean 195 words)
    turns: Range = (5, 15)  # LLM calls per task (ours, fitted to the KV budget)
    action_tokens: Range = (50, 400)  # each turn's output (Tokencake Code-Writer: 128-400)
    observation_tokens: Range = (30, 500)  # each tool's output read by the next turn (ours)
    test_fraction: float = 0.3  # share of tool calls that run tests / scripts (ours)
    fast_median_s: float = 0.4  # file read / edit / grep (Tokencake: 0.1-0.4 s)
    fast_p90_s: float = 2.0  # (ours; Continuum's code pins below 2 s)
    test_median_s: float = 8.0  # test run (Tokencake Code-Writer's patch validation: 8 s)
    test_p90_s: float = 60.0  # (ours: the minutes-long tail of test suites)
    max_tool_s: float = 600.0  # a client's tool timeout (ours)
    max_tokens: str = "cap"  # cap | exact: the max_tokens the client sends (lengths.py)
    max_tokens_cap: int = METAGPT_CAP  # the cap of max_tokens=cap

    def __post_init__(self) -> None:
        check_params(self)
        if not 0.0 <= self.test_fraction <= 1.0:
            raise TopasError(f"test_fraction must be in [0, 1], got {self.test_fraction!r}")
        _check_waits(
            ("fast", self.fast_median_s, self.fast_p90_s),
            ("test", self.test_median_s, self.test_p90_s),
        )


def _code_agents(p: CodeAgentParams) -> tuple[Agent, ...]:
    return (Agent(CODER, p.prefix_tokens),)


def _code_stages(p: CodeAgentParams, task_id: str, rng: np.random.Generator) -> tuple[Stage, ...]:
    """Turn i's prompt is turn i-1's prompt + its action + the observation of the tool the
    action called; turn i is sent when that tool finishes (`delay_s`)."""
    turns = uniform_tokens(rng, p.turns)
    prompt = [Segment(agent_key(CODER), p.prefix_tokens)]
    prompt.append(Segment(f"{task_id}/input", uniform_tokens(rng, p.issue_tokens)))
    stages: list[Stage] = []
    for i in range(turns):
        delay, kind = 0.0, "issue"
        if i:
            prev = stages[-1]
            if rng.random() < p.test_fraction:  # a test / script run
                kind, median_s, p90_s = "after_test", p.test_median_s, p.test_p90_s
            else:  # a file read, edit or search
                kind, median_s, p90_s = "after_edit", p.fast_median_s, p.fast_p90_s
            delay = tool_wait_s(rng, median_s, p90_s, p.max_tool_s)
            obs = Segment(f"{task_id}/s{i}/obs", uniform_tokens(rng, p.observation_tokens))
            prompt += [Segment(output_key(task_id, prev.id), prev.output_tokens), obs]
        out = uniform_tokens(rng, p.action_tokens)
        deps = (f"s{i - 1}",) if i else ()
        stages.append(_stage(f"s{i}", CODER, list(prompt), out, deps, delay, kind))
    return tuple(stages)


make_code_agent = family("code-agent", CodeAgentParams, _code_agents, _code_stages)


# --- deep-research ----------------------------------------------------------------------------

PLANNER, RESEARCHER, WRITER = "planner", "researcher", "writer"


@dataclass(frozen=True)
class DeepResearchParams:
    """`deep-research`'s shape, lengths and tool waits (docs/workload-format.md has the source
    of each default)."""

    planner_prefix_tokens: int = 1200  # system prompts (ours)
    researcher_prefix_tokens: int = 1000
    writer_prefix_tokens: int = 1500
    question_tokens: Range = (30, 200)  # the task's question (ours)
    fanout: Range = (3, 6)  # search-and-read branches per task (ours)
    plan_tokens: Range = (150, 400)  # planner output: the sub-questions (ours)
    results_tokens: Range = (300, 1000)  # search-result snippets a search call reads (ours)
    pick_tokens: Range = (50, 200)  # a search call's output: sources to open (Tokencake: 128)
    pages_tokens: Range = (1000, 3000)  # fetched page text a read call reads (ours)
    notes_tokens: Range = (150, 500)  # a read call's output (ours)
    report_tokens: Range = (800, 2000)  # the writer's report (ours)
    search_median_s: float = 4.0  # search API (Tokencake's search tool: 4.0 s)
    search_p90_s: float = 8.0  # (ours)
    fetch_median_s: float = 2.0  # page fetch (ours)
    fetch_p90_s: float = 8.0  # (ours)
    max_tool_s: float = 600.0  # a client's tool timeout (ours)
    max_tokens: str = "cap"  # cap | exact: the max_tokens the client sends (lengths.py)
    max_tokens_cap: int = METAGPT_CAP  # the cap of max_tokens=cap

    def __post_init__(self) -> None:
        check_params(self)
        _check_waits(
            ("search", self.search_median_s, self.search_p90_s),
            ("fetch", self.fetch_median_s, self.fetch_p90_s),
        )


def _research_agents(p: DeepResearchParams) -> tuple[Agent, ...]:
    return (
        Agent(PLANNER, p.planner_prefix_tokens),
        Agent(RESEARCHER, p.researcher_prefix_tokens),
        Agent(WRITER, p.writer_prefix_tokens),
    )


def _research_stages(
    p: DeepResearchParams, task_id: str, rng: np.random.Generator
) -> tuple[Stage, ...]:
    """plan -> fanout x (search<j> -> read<j>) -> write; read<j> extends search<j>'s prompt."""
    question = Segment(f"{task_id}/input", uniform_tokens(rng, p.question_tokens))
    fanout = uniform_tokens(rng, p.fanout)
    plan_out = uniform_tokens(rng, p.plan_tokens)
    plan = Segment(output_key(task_id, "plan"), plan_out)
    prefix = Segment(agent_key(PLANNER), p.planner_prefix_tokens)
    stages = [_stage("plan", PLANNER, [prefix, question], plan_out, (), 0.0, "plan")]
    notes: list[Segment] = []
    for j in range(1, fanout + 1):
        search, read = f"search{j}", f"read{j}"
        results = Segment(f"{task_id}/{search}/results", uniform_tokens(rng, p.results_tokens))
        prompt = [Segment(agent_key(RESEARCHER), p.researcher_prefix_tokens), question, plan]
        prompt.append(results)
        wait = tool_wait_s(rng, p.search_median_s, p.search_p90_s, p.max_tool_s)
        pick = uniform_tokens(rng, p.pick_tokens)
        stages.append(_stage(search, RESEARCHER, prompt, pick, ("plan",), wait, "search"))
        pages = Segment(f"{task_id}/{read}/pages", uniform_tokens(rng, p.pages_tokens))
        prompt = [*prompt, Segment(output_key(task_id, search), pick), pages]
        wait = tool_wait_s(rng, p.fetch_median_s, p.fetch_p90_s, p.max_tool_s)
        note = uniform_tokens(rng, p.notes_tokens)
        stages.append(_stage(read, RESEARCHER, prompt, note, (search,), wait, "read"))
        notes.append(Segment(output_key(task_id, read), note))
    prompt = [Segment(agent_key(WRITER), p.writer_prefix_tokens), question, plan, *notes]
    reads = tuple(f"read{j}" for j in range(1, fanout + 1))
    report = uniform_tokens(rng, p.report_tokens)
    stages.append(_stage("write", WRITER, prompt, report, reads, 0.0, "write"))
    return tuple(stages)


make_deep_research = family("deep-research", DeepResearchParams, _research_agents, _research_stages)
