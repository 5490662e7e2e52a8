"""MetaGPT workloads of the TOPAS paper in their abstract shapes: `metagpt-sop`, `metagpt-tl`.

Every length comes from docs/metagpt-facts.md (cl100k_base tokens measured on MetaGPT's own
prompts, with the TL system prompts' breakdown); the field comments below name the row. No MetaGPT
text is used: a segment is a key and a length.

Two prefix modes (parameter ``prefix_mode``):

- ``cache-friendly`` (default): an agent's prefix is its system prompt plus any fixed template
  moved in front of the job's content, with the per-call timestamp frozen, so it is identical
  across tasks (SOP: system line + template; TL: the whole RoleZero system prompt).
- ``faithful``: only the tokens MetaGPT really shares across calls as it ships. SOP (0.8.2): the
  system line (plus the Engineer's 100-token header, which comes before the context); each
  fixed template follows the job's content as a per-call segment ``<task>/<stage>/tmpl``. TL
  (main): the system prompt is cut at the timestamp (``tokens_before_timestamp``); the rest of
  it, which changes every second, is a per-call segment ``<task>/<stage>/sys``, so nothing after
  it (the TeamLeader's memory included) is shared between calls either.

The paper's numbers most likely used ``cache-friendly``: TOPAS gains by keeping agent prefixes
resident, and its largest MetaGPT gain is on TL (22% mean JCT), whose prefixes are 2-9k tokens
only when the timestamp is frozen; faithfully the shareable prefix is 25-57 tokens on TL and
41-149 on the SOP, which leaves a prefix-aware policy almost nothing to keep. The smaller SOP gain
(9.8%) also fits cache-friendly prefixes of 375-916 tokens there.

A task is one software idea (MetaGPT's SoftwareDev prompts are one-liners such as "a 2048
game"): the input segment ``<task_id>/input``, 10-100 tokens. Every length is drawn uniformly
(inclusive) from its range, per task in stage order, from the workload's content stream.
``max_tokens`` (`lengths`): ``cap`` (default) sends ``max_tokens_cap`` (4,096, MetaGPT's
``LLMConfig.max_token``) on every call, which ends at EOS after its sampled output, as a real
MetaGPT client does; ``exact`` sends each call's output length with ``ignore_eos`` (replaying
fixed trajectories), which tells the server, and any policy that reads the cap, every length.
Stage ids are ``s0``.. in the order of the shapes below, each depending on the one
before it (both workflows are sequential per task). The prefix mode changes no sampled length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from topas_bench.errors import TopasError
from topas_bench.workloads.lengths import METAGPT_CAP
from topas_bench.workloads.model import Agent, Segment, Stage, agent_key, output_key
from topas_bench.workloads.params import check_params
from topas_bench.workloads.registry import family, uniform_tokens

Range = tuple[int, int]

#: ``prefix_mode`` values; the first is the default.
PREFIX_MODES = ("cache-friendly", "faithful")


def check_prefix_mode(value: object) -> None:
    if value not in PREFIX_MODES:
        raise TopasError(f"prefix_mode must be one of {', '.join(PREFIX_MODES)}, got {value!r}")


PM, ARCH, PROJ, ENG, QA, TL = (
    "ProductManager",
    "Architect",
    "ProjectManager",
    "Engineer",
    "QaEngineer",
    "TeamLeader",
)
#: Each agent's parameter names start with its stem: ``pm_prefix_tokens``, ...
STEM = {PM: "pm", ARCH: "architect", PROJ: "project_manager", ENG: "engineer", QA: "qa", TL: "tl"}


class _Prefixes:
    """What `SopParams` and `TlParams` share: per agent of `_AGENTS` (their order), a full
    prefix ``<STEM>_prefix_tokens`` and the part of it MetaGPT really shares
    ``<STEM>_<_SHARED>_tokens``, checked (`_TOO_LONG`) and split by the prefix mode alike."""

    _AGENTS: ClassVar[tuple[str, ...]]
    _SHARED: ClassVar[str]
    _TOO_LONG: ClassVar[str]  # formatted with name, shared and full
    __dataclass_fields__: ClassVar[dict[str, Any]]
    prefix_mode: str

    def __post_init__(self) -> None:
        check_prefix_mode(self.prefix_mode)
        check_params(self)
        for name in self._AGENTS:
            full, shared = self._pair(name)
            if shared > full:
                raise TopasError(self._TOO_LONG.format(name=name, shared=shared, full=full))

    def _pair(self, agent: str) -> tuple[int, int]:
        stem = STEM[agent]
        full = getattr(self, f"{stem}_prefix_tokens")
        return full, getattr(self, f"{stem}_{self._SHARED}_tokens")

    def split(self, agent: str) -> tuple[int, int]:
        """(shared prefix, per-call rest of the prefix: template or system prompt) of `agent`."""
        full, shared = self._pair(agent)
        return (full, 0) if self.prefix_mode == "cache-friendly" else (shared, full - shared)

    def agents(self) -> tuple[Agent, ...]:
        return tuple(Agent(name, self.split(name)[0]) for name in self._AGENTS)


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
class SopParams(_Prefixes):
    """MetaGPT 0.8.2 SOP (docs/metagpt-facts.md, "MetaGPT-SOP"): prefix = system prefix + fixed
    template.

    The Engineer stage stands for one WriteCode call (the table's per-file row); review, rewrite
    and RunCode calls are in `metagpt-sop-full`. The ``*_prefix_tokens`` are the cache-friendly
    prefixes; ``faithful`` keeps the ``*_system_tokens`` of each in front and moves the rest
    (the fixed template) behind the job's content.
    """

    _AGENTS: ClassVar = (PM, ARCH, PROJ, ENG, QA)
    _SHARED: ClassVar = "system"
    _TOO_LONG: ClassVar = "a *_system_tokens ({shared}) exceeds its prefix ({full})"

    pm_prefix_tokens: int = 41 + 875  # ProductManager / WritePRD: system + template
    architect_prefix_tokens: int = 47 + 674  # Architect / WriteDesign
    project_manager_prefix_tokens: int = 50 + 455  # ProjectManager / WriteTasks
    engineer_prefix_tokens: int = 49 + 100 + 226  # Engineer / WriteCode: system + header + after
    qa_prefix_tokens: int = 63 + 384  # QaEngineer / WriteTest
    # faithful mode: the shared part of each prefix (system line; Engineer: + 100-token header)
    pm_system_tokens: int = 41
    architect_system_tokens: int = 47
    project_manager_system_tokens: int = 50
    engineer_system_tokens: int = 49 + 100
    # WriteTest's template is 384 tokens, 77 of them after the code (measured on 0.8.2's source)
    qa_system_tokens: int = 63 + 384 - 77
    requirement_tokens: Range = (10, 100)  # WritePRD per-call content
    prd_tokens: Range = (500, 700)  # WritePRD output
    design_tokens: Range = (400, 600)  # WriteDesign output
    tasks_tokens: Range = (150, 400)  # WriteTasks output
    code_tokens: Range = (200, 1300)  # WriteCode output
    test_tokens: Range = (400, 1000)  # WriteTest output
    delay_s: float = 0.0  # client-side tool time before every stage
    prefix_mode: str = PREFIX_MODES[0]  # cache-friendly | faithful (module docstring)
    max_tokens: str = "cap"  # cap | exact: the max_tokens the client sends (lengths.py)
    max_tokens_cap: int = METAGPT_CAP  # MetaGPT's LLMConfig.max_token


def _sop_stages(p: SopParams, task_id: str, rng: np.random.Generator) -> tuple[Stage, ...]:
    """PRD <- requirement; design <- PRD; tasks <- design; code <- design + tasks; test <- code."""
    req = uniform_tokens(rng, p.requirement_tokens)
    ranges = (p.prd_tokens, p.design_tokens, p.tasks_tokens, p.code_tokens, p.test_tokens)
    out = [uniform_tokens(rng, r) for r in ranges]

    def doc(i: int) -> Segment:
        return Segment(output_key(task_id, f"s{i}"), out[i])

    plan = (
        (PM, [_input(task_id, req)], "write_prd"),
        (ARCH, [doc(0)], "write_design"),
        (PROJ, [doc(1)], "write_tasks"),
        (ENG, [doc(1), doc(2)], "write_code"),
        (QA, [doc(3)], "write_test"),
    )
    stages = []
    for i, (agent, body, kind) in enumerate(plan):
        prefix, template = p.split(agent)
        if template:  # faithful: the fixed template follows the job's content
            body = [*body, Segment(f"{task_id}/s{i}/tmpl", template)]
        stages.append(_chain_stage(i, agent, prefix, body, out[i], kind, p.delay_s))
    return tuple(stages)


make_sop = family("metagpt-sop", SopParams, SopParams.agents, _sop_stages)


# --- metagpt-tl -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlParams(_Prefixes):
    """MetaGPT main ("1.0") TeamLeader workflow, docs/metagpt-facts.md "MetaGPT-TL" section.

    Prefixes are the measured RoleZero system prompts (docs/metagpt-facts.md "MetaGPT-TL",
    ``system_prompt_total``); outputs come from docs/metagpt-facts.md "Output lengths", ranges
    centred on its "~" figures where it gives only a typical value.
    """

    _AGENTS: ClassVar = (TL, PM, ARCH, PROJ, ENG)
    _SHARED: ClassVar = "before_timestamp"
    _TOO_LONG: ClassVar = "{name}: tokens before the timestamp ({shared}) exceed {full}"

    # faithful mode: each prefix is cut at its timestamp ("tokens_before_timestamp")
    tl_before_timestamp_tokens: int = 25
    pm_before_timestamp_tokens: int = 46
    architect_before_timestamp_tokens: int = 57
    project_manager_before_timestamp_tokens: int = 57  # the Architect's (see below)
    engineer_before_timestamp_tokens: int = 28
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
    prefix_mode: str = PREFIX_MODES[0]  # cache-friendly | faithful (module docstring)
    max_tokens: str = "cap"  # cap | exact: the max_tokens the client sends (lengths.py)
    max_tokens_cap: int = METAGPT_CAP  # MetaGPT's LLMConfig.max_token


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
        (TL, p.plan_tokens, "plan", ()),
        (PM, p.prd_tokens, "write_prd", ()),
        (TL, p.route_tokens, "route", ()),
        (ARCH, p.design_tokens, "write_design", (1,)),
        (TL, p.route_tokens, "route", ()),
        (PROJ, p.tasks_tokens, "write_tasks", (3,)),
        (TL, p.route_tokens, "route", ()),
        (ENG, p.code_tokens, "write_code", (3, 5)),
        (TL, p.status_tokens, "status", ()),
    )
    out = [uniform_tokens(rng, r) for _, r, _, _ in roles]
    docs = [Segment(output_key(task_id, f"s{i}"), n) for i, n in enumerate(out)]
    history = [_input(task_id, req)]  # the TeamLeader's memory so far
    stages = []
    for i, (agent, _, kind, reads) in enumerate(roles):
        prefix, rest = p.split(agent)
        sys = [Segment(f"{task_id}/s{i}/sys", rest)] if rest else []  # faithful: after the clock
        cmd = Segment(f"{task_id}/s{i}/cmd", p.command_tokens)
        # the TeamLeader reads its memory; a worker reads the routing message and its documents
        body = [*history, cmd] if agent == TL else [docs[i - 1], *(docs[d] for d in reads), cmd]
        stages.append(_chain_stage(i, agent, prefix, [*sys, *body], out[i], kind, p.delay_s))
        history.append(docs[i])
    return tuple(stages)


make_tl = family("metagpt-tl", TlParams, TlParams.agents, _tl_stages)
