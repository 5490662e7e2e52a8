"""MetaGPT workloads of the TOPAS paper in their abstract shapes: `metagpt-sop`, `metagpt-tl`.

Every length comes from ../shared/metagpt/FACTS.md (cl100k_base tokens measured on MetaGPT's own
prompts) and tl-system-prompt-sizes.json; the field comments below name the row. No MetaGPT text
is used: a segment is a key and a length. Both workloads are *cache-friendly*: an agent's prefix
is its system prompt plus any fixed template moved in front of the job's content, with the
per-call timestamp frozen, so it is identical across tasks. (As MetaGPT ships, only the first
~45 tokens would be shareable; that `faithful` mode is not modelled here.)

A task is one software idea (MetaGPT's SoftwareDev prompts are one-liners such as "a 2048
game"): the input segment ``<task_id>/input``, 10-100 tokens. Every length is drawn uniformly
(inclusive) from its range, per task in stage order, from the workload's content stream.
Stages send ``max_new_tokens == output_tokens`` (exact lengths with ``ignore_eos``, DESIGN
section 7). Stage ids are ``s0``.. in the order of the shapes below, each depending on the one
before it (both workflows are sequential per task).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from topas_bench.workloads.model import Agent, Segment, Stage, Workload, agent_key, output_key
from topas_bench.workloads.registry import build_workload, check_params, uniform_tokens

Range = tuple[int, int]

PM, ARCH, PROJ, ENG, QA, TL = (
    "ProductManager",
    "Architect",
    "ProjectManager",
    "Engineer",
    "QaEngineer",
    "TeamLeader",
)


def _input(task_id: str, tokens: int) -> Segment:
    return Segment(f"{task_id}/input", tokens)


def _chain_stage(
    i: int,
    agent: str,
    prefix: int,
    body: list[Segment],
    out: int,
    kind: str,
    delay: float,
) -> Stage:
    """Stage ``s<i>`` of a sequential workflow: the agent's prefix, then `body`; needs s<i-1>."""
    return Stage(
        id=f"s{i}",
        agent=agent,
        prompt=(Segment(agent_key(agent), prefix), *body),
        output_tokens=out,
        deps=(f"s{i - 1}",) if i else (),
        delay_s=delay,
        kind=kind,
        max_new_tokens=out,
    )


# --- metagpt-sop ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SopParams:
    """MetaGPT 0.8.2 SOP, FACTS.md "MetaGPT-SOP" table: prefix = system prefix + fixed template.

    The Engineer stage stands for one WriteCode call (the table's per-file row); review, rewrite
    and RunCode calls are left to a `-full` replay variant.
    """

    pm_prefix_tokens: int = 41 + 875  # ProductManager / WritePRD: system + template
    architect_prefix_tokens: int = 47 + 674  # Architect / WriteDesign
    project_manager_prefix_tokens: int = 50 + 455  # ProjectManager / WriteTasks
    engineer_prefix_tokens: int = 49 + 100 + 226  # Engineer / WriteCode: system + header + after
    qa_prefix_tokens: int = 63 + 384  # QaEngineer / WriteTest
    requirement_tokens: Range = (10, 100)  # WritePRD per-call content
    prd_tokens: Range = (500, 700)  # WritePRD output
    design_tokens: Range = (400, 600)  # WriteDesign output
    tasks_tokens: Range = (150, 400)  # WriteTasks output
    code_tokens: Range = (200, 1300)  # WriteCode output
    test_tokens: Range = (400, 1000)  # WriteTest output
    delay_s: float = 0.0  # client-side tool time before every stage

    def __post_init__(self) -> None:
        check_params(self)


def _sop_agents(p: SopParams) -> tuple[Agent, ...]:
    return (
        Agent(PM, p.pm_prefix_tokens),
        Agent(ARCH, p.architect_prefix_tokens),
        Agent(PROJ, p.project_manager_prefix_tokens),
        Agent(ENG, p.engineer_prefix_tokens),
        Agent(QA, p.qa_prefix_tokens),
    )


def _sop_stages(p: SopParams, task_id: str, rng: np.random.Generator) -> tuple[Stage, ...]:
    """PRD <- requirement; design <- PRD; tasks <- design; code <- design + tasks; test <- code."""
    req = uniform_tokens(rng, p.requirement_tokens)
    ranges = (p.prd_tokens, p.design_tokens, p.tasks_tokens, p.code_tokens, p.test_tokens)
    out = [uniform_tokens(rng, r) for r in ranges]

    def doc(i: int) -> Segment:
        return Segment(output_key(task_id, f"s{i}"), out[i])

    plan = (
        (PM, p.pm_prefix_tokens, [_input(task_id, req)], "write_prd"),
        (ARCH, p.architect_prefix_tokens, [doc(0)], "write_design"),
        (PROJ, p.project_manager_prefix_tokens, [doc(1)], "write_tasks"),
        (ENG, p.engineer_prefix_tokens, [doc(1), doc(2)], "write_code"),
        (QA, p.qa_prefix_tokens, [doc(3)], "write_test"),
    )
    return tuple(
        _chain_stage(i, agent, prefix, body, out[i], kind, p.delay_s)
        for i, (agent, prefix, body, kind) in enumerate(plan)
    )


def make_sop(num_tasks: int, rate_per_s: float, seed: int, overrides: dict[str, Any]) -> Workload:
    return build_workload(
        "metagpt-sop", SopParams, overrides, _sop_agents, _sop_stages, num_tasks, rate_per_s, seed
    )


# --- metagpt-tl -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlParams:
    """MetaGPT main ("1.0") TeamLeader workflow, FACTS.md "MetaGPT-TL" section.

    Prefixes are the measured RoleZero system prompts (tl-system-prompt-sizes.json,
    ``system_prompt_total``); outputs come from FACTS "Output lengths", ranges centred on its
    "~" figures where it gives only a typical value.
    """

    tl_prefix_tokens: int = 3628  # "Mike(Team Leader)"
    pm_prefix_tokens: int = 4858  # "Alice(Product Manager)"
    architect_prefix_tokens: int = 1982  # "Bob(Architect)"
    # No RoleZero ProjectManager prompt was measured. Its tools in MetaGPT main are
    # Editor:write,read,similarity_search + RoleZero + WriteTasks; the Architect's are the same
    # Editor subset + RoleZero + Terminal:run_command: the closest measured prompt, so we reuse
    # 1,982. It is probably an upper bound: the Architect's prompt also has a 706-token
    # instruction and a 260-token example, where the ProjectManager's instruction is one line.
    project_manager_prefix_tokens: int = 1982
    engineer_prefix_tokens: int = 9000  # "Alex(Engineer)"
    command_tokens: int = 368  # templates.CMD_PROMPT_fixed: ends every think, never a prefix
    requirement_tokens: Range = (10, 100)  # a one-line SoftwareDev idea
    plan_tokens: Range = (450, 650)  # TL plan ~550 (first TL call)
    route_tokens: Range = (200, 300)  # TL routing ~250
    status_tokens: Range = (80, 120)  # TL status ~100 (last TL call)
    prd_tokens: Range = (800, 2000)  # document-writing thinks 800-2000
    design_tokens: Range = (800, 2000)  # document-writing thinks 800-2000
    tasks_tokens: Range = (150, 400)  # no TL figure: the SOP's WriteTasks output
    code_tokens: Range = (300, 1500)  # write_new_code 300-1500 per file
    delay_s: float = 0.0  # client-side tool time before every stage

    def __post_init__(self) -> None:
        check_params(self)


def _tl_agents(p: TlParams) -> tuple[Agent, ...]:
    return (
        Agent(TL, p.tl_prefix_tokens),
        Agent(PM, p.pm_prefix_tokens),
        Agent(ARCH, p.architect_prefix_tokens),
        Agent(PROJ, p.project_manager_prefix_tokens),
        Agent(ENG, p.engineer_prefix_tokens),
    )


def _tl_stages(p: TlParams, task_id: str, rng: np.random.Generator) -> tuple[Stage, ...]:
    """The nine-stage star TL -> PM -> TL -> Architect -> TL -> ProjectManager -> TL -> Eng -> TL.

    TeamLeader memory is append-only: a TL call reads the task input and every earlier output
    of the task in order, so its prompt minus the command prompt extends the previous TL call's
    prompt minus its command prompt, plus that call's output. A worker reads the TL's routing
    message (the stage before it) and its upstream documents: PM none (the routing message
    carries the requirement), Architect the PRD, ProjectManager the design, Engineer the design
    and the task list (as the SOP's WriteCode). Every call ends with the command prompt, keyed
    per call (``<task>/<stage>/cmd``) since it follows per-call content.

    Worst cases with the default ranges: Engineer 9,000 + 300 + 2,000 + 400 + 368 prompt +
    1,500 output = 13,568 tokens; final TL call 11,546 + 120 = 11,666. Both stay under 17,000,
    so no document needs capping.
    """
    req = uniform_tokens(rng, p.requirement_tokens)
    roles = (
        (TL, p.tl_prefix_tokens, p.plan_tokens, "plan", ()),
        (PM, p.pm_prefix_tokens, p.prd_tokens, "write_prd", ()),
        (TL, p.tl_prefix_tokens, p.route_tokens, "route", ()),
        (ARCH, p.architect_prefix_tokens, p.design_tokens, "write_design", (1,)),
        (TL, p.tl_prefix_tokens, p.route_tokens, "route", ()),
        (PROJ, p.project_manager_prefix_tokens, p.tasks_tokens, "write_tasks", (3,)),
        (TL, p.tl_prefix_tokens, p.route_tokens, "route", ()),
        (ENG, p.engineer_prefix_tokens, p.code_tokens, "write_code", (3, 5)),
        (TL, p.tl_prefix_tokens, p.status_tokens, "status", ()),
    )
    out = [uniform_tokens(rng, r) for _, _, r, _, _ in roles]
    docs = [Segment(output_key(task_id, f"s{i}"), n) for i, n in enumerate(out)]
    history = [_input(task_id, req)]  # the TeamLeader's memory so far
    stages = []
    for i, (agent, prefix, _, kind, reads) in enumerate(roles):
        cmd = Segment(f"{task_id}/s{i}/cmd", p.command_tokens)
        # the TeamLeader reads its memory; a worker reads the routing message and its documents
        body = [*history, cmd] if agent == TL else [docs[i - 1], *(docs[d] for d in reads), cmd]
        stages.append(_chain_stage(i, agent, prefix, body, out[i], kind, p.delay_s))
        history.append(docs[i])
    return tuple(stages)


def make_tl(num_tasks: int, rate_per_s: float, seed: int, overrides: dict[str, Any]) -> Workload:
    return build_workload(
        "metagpt-tl", TlParams, overrides, _tl_agents, _tl_stages, num_tasks, rate_per_s, seed
    )
