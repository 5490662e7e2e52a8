"""`metagpt-sop-full`: every LLM call of MetaGPT 0.8.2's software-company SOP, per job.

Shape (a strict chain, as MetaGPT runs it; each stage depends on the one before it):

    PRD -> design -> tasks -> for each code file f:
        WriteCode(f) -> review(f, 1) [-> rewrite(f, 1) -> review(f, 2) [-> rewrite(f, 2)]]
    -> (QA on) WriteTest(f) for each file -> RunCode(f) for each file

Reviews follow WriteCodeReview: up to ``review_rounds`` (MetaGPT's ``code_review_k_times``, 2)
rounds per file; a round says LBTM with probability ``lbtm_probability`` and then rewrites the
code (the next round reviews the rewrite), or LGTM and ends the file. QA writes every test, then
runs every test (the order of the recorded sop-qa-2048 run). MetaGPT 0.8.2's SummarizeCode is
not reached in the recorded runs and is left out.

Prompts (lengths from docs/metagpt-facts.md's SOP table, fixed templates measured on 0.8.2's
source):

- PRD: [ProductManager, idea]; design: [Architect, PRD]; tasks: [ProjectManager, design].
- WriteCode(f): [Engineer, design, tasks, final code of files < f]: consecutive WriteCode calls
  of a job share everything up to the newest file (``Legacy Code`` grows).
- review(f, r): [Engineer.review, design, tasks, final code of files < f, current code of f].
- rewrite(f, r): the review's prompt without the review instruction, then the review, then a
  70-token rewrite instruction (``<task>/<stage>/tmpl``): with the review template moved in
  front (cache-friendly) it extends the review's prompt + output, the ~90% sharing
  docs/metagpt-facts.md notes.
- WriteTest(f): [QaEngineer, final code of f]; RunCode(f): [QaEngineer.run, code, test, logs].

Agents are (role, fixed template) pairs: the Engineer's WriteCode and review calls have
different templates, hence different cacheable prefixes. ``prefix_mode`` (see `metagpt.py`):
cache-friendly prefixes are system line + whole template; faithful ones are the system line plus
whatever part of the template precedes the content (WriteCode's 100-token header, the review's
139, WriteTest's 307, RunCode's 85), the rest being a per-call ``<task>/<stage>/tmpl`` segment
after the content.

Non-LLM gaps (`delay_s`) come from the recorded runs (sop-2048, sop-qa-2048): 56-148 ms when the
work passes to another role, 4-33 ms between calls of one role, 4.5-7.9 s before RunCode (the
test run). Worst case with the defaults (6 files of 1,300 tokens): the last rewrite's prompt is
751 + 600 + 400 + 6 x 1,300 + 400 + 70 = 10,021 tokens + 1,300 output, far below 18,692, so no
memory needs capping here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from topas_bench.errors import TopasError
from topas_bench.workloads.lengths import METAGPT_CAP
from topas_bench.workloads.metagpt import ARCH, ENG, PM, PREFIX_MODES, PROJ, QA, check_prefix_mode
from topas_bench.workloads.metagpt_ideas import delay_s, sample_idea
from topas_bench.workloads.model import Agent, Segment, Stage, agent_key, output_key
from topas_bench.workloads.params import check_params
from topas_bench.workloads.registry import family, uniform_tokens

Range = tuple[int, int]
REVIEW, RUN = f"{ENG}.review", f"{QA}.run"


@dataclass(frozen=True)
class SopFullParams:
    """Token figures: docs/metagpt-facts.md, "MetaGPT-SOP" (system line, template before / after
    content)."""

    prefix_mode: str = PREFIX_MODES[0]
    max_tokens: str = "cap"  # cap | exact: the max_tokens the client sends (lengths.py)
    max_tokens_cap: int = METAGPT_CAP  # MetaGPT's LLMConfig.max_token
    pm_system_tokens: int = 41
    prd_template_tokens: int = 875  # after the requirement
    architect_system_tokens: int = 47
    design_template_tokens: int = 674  # after the PRD
    project_manager_system_tokens: int = 50
    tasks_template_tokens: int = 455  # after the design
    engineer_system_tokens: int = 49
    code_header_tokens: int = 100  # WriteCode: before the context
    code_template_tokens: int = 226  # WriteCode: after it
    review_header_tokens: int = 139
    review_template_tokens: int = 563
    rewrite_template_tokens: int = 70
    qa_system_tokens: int = 63
    test_header_tokens: int = 307  # WriteTest: 384 in all, 77 after the code
    test_template_tokens: int = 77
    run_header_tokens: int = 85  # RunCode: 246 in all
    run_template_tokens: int = 161
    files: Range = (3, 6)  # code files per job (the Task list); 2048 runs: 2-5
    review_rounds: int = 2  # MetaGPT's code_review_k_times
    lbtm_probability: float = 0.5  # a review asks for a rewrite
    qa: str = "on"  # on | off: MetaGPT hires the QaEngineer only with --run-tests
    prd_tokens: Range = (500, 700)
    design_tokens: Range = (400, 600)
    tasks_tokens: Range = (150, 400)
    code_tokens: Range = (200, 1300)  # WriteCode and rewrite
    review_tokens: Range = (100, 400)
    test_tokens: Range = (400, 1000)
    logs_tokens: Range = (100, 400)  # test output that RunCode reads (our estimate)
    run_tokens: Range = (30, 80)
    handoff_ms: Range = (50, 150)  # gap when the work passes to another role
    step_ms: Range = (4, 35)  # gap between calls of one role
    run_tests_ms: Range = (4500, 8000)  # the test run before each RunCode

    def __post_init__(self) -> None:
        check_prefix_mode(self.prefix_mode)
        if self.qa not in ("on", "off"):
            raise TopasError(f"qa must be on or off, got {self.qa!r}")
        check_params(self)
        if self.lbtm_probability > 1:
            raise TopasError(f"lbtm_probability must be <= 1, got {self.lbtm_probability}")

    def layout(self) -> dict[str, tuple[int, int, int]]:
        """Per agent: (system line, template before the content, template after it)."""
        e, q = self.engineer_system_tokens, self.qa_system_tokens
        return {
            PM: (self.pm_system_tokens, 0, self.prd_template_tokens),
            ARCH: (self.architect_system_tokens, 0, self.design_template_tokens),
            PROJ: (self.project_manager_system_tokens, 0, self.tasks_template_tokens),
            ENG: (e, self.code_header_tokens, self.code_template_tokens),
            REVIEW: (e, self.review_header_tokens, self.review_template_tokens),
            QA: (q, self.test_header_tokens, self.test_template_tokens),
            RUN: (q, self.run_header_tokens, self.run_template_tokens),
        }

    def split(self, agent: str) -> tuple[int, int]:
        """(agent prefix, per-call template after the content) in this prefix mode."""
        system, before, after = self.layout()[agent]
        if self.prefix_mode == "cache-friendly":
            return system + before + after, 0
        return system + before, after


def _agents(p: SopFullParams) -> tuple[Agent, ...]:
    return tuple(Agent(name, p.split(name)[0]) for name in p.layout())


class _Job:
    """Appends the stages of one job, each depending on the one before it."""

    def __init__(self, p: SopFullParams, task_id: str, rng: np.random.Generator) -> None:
        self.p, self.task_id, self.rng = p, task_id, rng
        self.stages: list[Stage] = []

    def call(
        self, agent: str, body: list[Segment], out: int, kind: str, gap_ms: Range, tail: int = -1
    ) -> Segment:
        """Add a call; returns its output segment. `tail` replaces the agent's per-call template
        after the content (-1: the agent's own, 0: none)."""
        sid = f"s{len(self.stages)}"
        prefix, after = self.p.split(agent)
        after = after if tail < 0 else tail
        tmpl = [Segment(f"{self.task_id}/{sid}/tmpl", after)] if after else []
        prev = self.stages[-1] if self.stages else None
        gap = 0.0 if prev is None else delay_s(self.rng, gap_ms)
        self.stages.append(
            Stage(
                id=sid,
                agent=agent,
                prompt=(Segment(agent_key(agent), prefix), *body, *tmpl),
                output_tokens=out,
                deps=() if prev is None else (prev.id,),
                delay_s=gap,
                kind=kind,
                max_new_tokens=out,
            )
        )
        return Segment(output_key(self.task_id, sid), out)

    def gap(self, agent: str) -> Range:
        prev = self.stages[-1].agent if self.stages else agent
        same = prev.split(".")[0] == agent.split(".")[0]  # one role, e.g. Engineer(.review)
        return self.p.step_ms if same else self.p.handoff_ms

    def add(
        self, agent: str, body: list[Segment], out: Range, kind: str, tail: int = -1
    ) -> Segment:
        return self.call(agent, body, uniform_tokens(self.rng, out), kind, self.gap(agent), tail)


def _stages(p: SopFullParams, task_id: str, rng: np.random.Generator) -> tuple[Stage, ...]:
    job = _Job(p, task_id, rng)
    _, idea_tokens = sample_idea(rng)
    prd = job.add(PM, [Segment(f"{task_id}/input", idea_tokens)], p.prd_tokens, "write_prd")
    design = job.add(ARCH, [prd], p.design_tokens, "write_design")
    tasks = job.add(PROJ, [design], p.tasks_tokens, "write_tasks")
    final: list[Segment] = []  # each file's code after its last rewrite
    for _ in range(uniform_tokens(rng, p.files)):
        context = [design, tasks, *final]
        code = job.add(ENG, context, p.code_tokens, "write_code")
        for _ in range(p.review_rounds):
            reviewed = [*context, code]
            review = job.add(REVIEW, reviewed, p.review_tokens, "review")
            if rng.random() >= p.lbtm_probability:  # LGTM
                break
            # the review's prompt without its instruction, the review, the rewrite instruction
            tail = p.rewrite_template_tokens
            code = job.add(REVIEW, [*reviewed, review], p.code_tokens, "rewrite", tail)
        final.append(code)
    if p.qa == "on":
        tests = [job.add(QA, [code], p.test_tokens, "write_test") for code in final]
        for code, test in zip(final, tests, strict=True):
            logs = Segment(f"{task_id}/s{len(job.stages)}/logs", uniform_tokens(rng, p.logs_tokens))
            job.call(RUN, [code, test, logs], uniform_tokens(rng, p.run_tokens), "run_code",
                     p.run_tests_ms)  # fmt: skip
    return tuple(job.stages)


make_sop_full = family("metagpt-sop-full", SopFullParams, _agents, _stages)
