"""`metagpt-tl-full`: every LLM call of MetaGPT's TeamLeader workflow (main, "1.0"), per job.

The call sequence follows the recorded tl-2048 run (28 calls) with the classic ProjectManager
added as in the TOPAS paper's nine-stage star. Per job, strictly sequential:

    TeamLeader: classify (quick think), language detection, plan (think)
    for each task of the plan, worker W (ProductManager, Architect, ProjectManager, Engineer,
    then any further Engineer tasks):
        W: language detection (first task of W only), think loop, summary (``_end``)
        TeamLeader: think (routes the next task; the last one reports status)

Think loops (RoleZero: each think's output and its command results join the role's memory):
ProductManager: document, end; Architect: document, follow-up, end; ProjectManager: task list,
end; Engineer: read documents, plan, per file (command think -> write_new_code), end; a further
Engineer task: plan, files, end. The plan has ``plan_tasks`` tasks (3 = no ProjectManager, as in
the recorded run; 4 = the paper's star; more = extra Engineer tasks), ``files`` per Engineer task.

Prompts. A think is [system prompt, memory..., 368-token command prompt (per call)]; memory is
append-only, so each think of a role extends the previous one's prompt minus its command prompt.
write_new_code is [Engineer.write (118-token system), the Engineer's memory, 97-token prompt];
classify is [TeamLeader.quick, memory, 67-token prompt]; language detection and summaries use the
role's short system prompt (``X.info``: its role info) with the requirement or memory. Upstream
documents enter a worker's memory as command results (Architect: the PRD; ProjectManager: the
design; Engineer: PRD + design + task list) and written code as write_new_code's result.

Memory cap. With the recorded growth the Engineer's thinks pass 19k tokens (docs/metagpt-facts.md),
beyond the a100-qwen32b KV budget (18,692). MetaGPT's own remedy is ``llm.compress_type``
(``BaseLLM.compress_messages``, main): ``post_cut_by_msg`` keeps the system messages and the
most recent messages that fit in 80% of the model's context (``TOKEN_MAX``), dropping the oldest.
We apply exactly that to every call with ``context_tokens`` (default 18,692: the a100-qwen32b
KV budget; lower it with a smaller budget), so a
prompt is at most 14,953 tokens and prompt + output stays below the budget. Once a role's
memory is cut, its next prompt no longer extends the previous one (the front changed).

``prefix_mode`` (see `metagpt.py`): cache-friendly prefixes are whole system prompts (timestamp
frozen). Faithful: RoleZero writes the time (to the second) ``tokens_before_timestamp`` tokens
into every think and classify system prompt, so only those tokens are the agent prefix and the
rest is a per-call ``<task>/<stage>/sys`` segment (nothing after it is shared); the short system
prompt is fixed when the role is created, so its rest is per job (``<task>/<agent>/info``);
write_new_code's system prompt has no timestamp.

Outputs: docs/metagpt-facts.md "Output lengths"; follow-up/end thinks and command results from the
recorded run. Gaps (`delay_s`): 5-26 ms between roles and 2-88 ms within one role in the recorded
run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from topas_bench.errors import TopasError
from topas_bench.workloads.lengths import METAGPT_CAP
from topas_bench.workloads.metagpt import (
    ARCH,
    ENG,
    PM,
    PREFIX_MODES,
    PROJ,
    STEM,
    TL,
    check_prefix_mode,
)
from topas_bench.workloads.metagpt_ideas import delay_s, sample_idea
from topas_bench.workloads.model import Agent, Segment, Stage, agent_key, output_key
from topas_bench.workloads.params import check_params
from topas_bench.workloads.registry import family, uniform_tokens

Range = tuple[int, int]
Message = tuple[Segment, ...]
QUICK, WRITE = f"{TL}.quick", f"{ENG}.write"
ROLES = (TL, PM, ARCH, PROJ, ENG)


@dataclass(frozen=True)
class TlFullParams:
    """System prompts: docs/metagpt-facts.md, "MetaGPT-TL" (``system_prompt_total``, ``role_info``,
    ``tokens_before_timestamp``); the ProjectManager reuses the Architect's (see `TlParams`)."""

    prefix_mode: str = PREFIX_MODES[0]
    max_tokens: str = "cap"  # cap | exact: the max_tokens the client sends (lengths.py)
    max_tokens_cap: int = METAGPT_CAP  # MetaGPT's LLMConfig.max_token
    tl_system_tokens: int = 3628
    tl_info_tokens: int = 150
    tl_before_timestamp_tokens: int = 25
    tl_quick_system_tokens: int = 970  # QUICK_THINK_SYSTEM_PROMPT (821) with the role info
    pm_system_tokens: int = 4858
    pm_info_tokens: int = 59
    pm_before_timestamp_tokens: int = 46
    architect_system_tokens: int = 1982
    architect_info_tokens: int = 70
    architect_before_timestamp_tokens: int = 57
    project_manager_system_tokens: int = 1982
    project_manager_info_tokens: int = 70
    project_manager_before_timestamp_tokens: int = 57
    engineer_system_tokens: int = 9000
    engineer_info_tokens: int = 41
    engineer_before_timestamp_tokens: int = 28
    write_system_tokens: int = 118  # Engineer2.WRITE_CODE_SYSTEM_PROMPT
    command_tokens: int = 368  # CMD_PROMPT_fixed: ends every think
    quick_prompt_tokens: int = 67  # QUICK_THINK_PROMPT
    language_prompt_tokens: int = 19  # DETECT_LANGUAGE_PROMPT
    summary_prompt_tokens: int = 57  # SUMMARY_PROMPT
    write_prompt_tokens: int = 97  # Engineer2.WRITE_CODE_PROMPT_fixed
    context_tokens: int = 18692  # TOKEN_MAX told to compress_messages (keeps 80% for prompts)
    plan_tasks: Range = (4, 5)
    files: Range = (3, 5)  # per Engineer task; the recorded 2048 run wrote 4
    classify_tokens: Range = (20, 40)
    language_tokens: Range = (1, 3)
    plan_tokens: Range = (450, 650)
    route_tokens: Range = (200, 300)
    status_tokens: Range = (80, 120)
    doc_tokens: Range = (800, 2000)  # PRD and design thinks
    task_list_tokens: Range = (150, 400)
    follow_up_tokens: Range = (250, 400)  # the Architect's second think (recorded 311)
    end_tokens: Range = (50, 100)  # the think that ends a role's task (recorded 54-77)
    read_tokens: Range = (90, 130)
    engineer_plan_tokens: Range = (500, 700)
    command_think_tokens: Range = (60, 90)  # the think before each file (recorded 75-77)
    code_tokens: Range = (300, 1500)
    summary_tokens: Range = (50, 150)
    result_tokens: Range = (20, 60)  # a command-result message (recorded ~33-57)
    handoff_ms: Range = (5, 30)
    step_ms: Range = (2, 90)

    def __post_init__(self) -> None:
        check_prefix_mode(self.prefix_mode)
        check_params(self)
        if self.plan_tasks[0] < 3:
            raise TopasError(f"plan_tasks must be at least 3, got {self.plan_tasks}")
        for role in ROLES:
            if self.cut(role) > min(self.system(role), self.info(role)):
                raise TopasError(f"{role}: tokens before the timestamp exceed its prompts")

    def system(self, role: str) -> int:
        return int(getattr(self, f"{STEM[role]}_system_tokens"))

    def info(self, role: str) -> int:
        return int(getattr(self, f"{STEM[role]}_info_tokens"))

    def cut(self, role: str) -> int:
        return int(getattr(self, f"{STEM[role]}_before_timestamp_tokens"))

    @property
    def keep_tokens(self) -> int:
        """The most prompt tokens compress_messages keeps (its threshold 0.8)."""
        return int(self.context_tokens * 0.8)

    def agents(self) -> dict[str, tuple[int, int, str]]:
        """Agent -> (full system prompt, part before the timestamp, what the rest is keyed by:
        ``call``, ``job`` or ``none``)."""
        out: dict[str, tuple[int, int, str]] = {}
        for role in ROLES:
            out[role] = (self.system(role), self.cut(role), "call")
            out[f"{role}.info"] = (self.info(role), self.cut(role), "job")
        out[QUICK] = (self.tl_quick_system_tokens, self.tl_before_timestamp_tokens, "call")
        out[WRITE] = (self.write_system_tokens, self.write_system_tokens, "none")
        return out


def _agents(p: TlFullParams) -> tuple[Agent, ...]:
    friendly = p.prefix_mode == "cache-friendly"
    return tuple(Agent(a, full if friendly else cut) for a, (full, cut, _) in p.agents().items())


class _Job:
    """Builds one job's stages in order; every stage depends on the one before it."""

    def __init__(self, p: TlFullParams, task_id: str, rng: np.random.Generator) -> None:
        self.p, self.task_id, self.rng = p, task_id, rng
        self.stages: list[Stage] = []
        self.memory: dict[str, list[Message]] = {role: [] for role in ROLES}

    def _sid(self) -> str:
        return f"s{len(self.stages)}"

    def seg(self, what: str, tokens: int) -> Segment:
        """A segment of the next call (``<task>/<stage>/<what>``)."""
        return Segment(f"{self.task_id}/{self._sid()}/{what}", tokens)

    def result(self, said: Segment) -> Segment:
        """The command-result message that follows the call whose output is `said`."""
        tokens = uniform_tokens(self.rng, self.p.result_tokens)
        return Segment(said.key.removesuffix("/out") + "/res", tokens)

    def system(self, agent: str) -> list[Segment]:
        full, cut, rest_by = self.p.agents()[agent]
        if self.p.prefix_mode == "cache-friendly" or rest_by == "none":
            return [Segment(agent_key(agent), full)]
        rest_key = f"{self.task_id}/{agent}/info" if rest_by == "job" else self.seg("sys", 0).key
        return [Segment(agent_key(agent), cut), Segment(rest_key, full - cut)]

    def call(
        self, agent: str, memory: list[Message], tail: list[Segment], out: Range, kind: str
    ) -> Segment:
        """Add a call: system, the latest messages that fit (post_cut_by_msg), `tail`."""
        role = agent.split(".")[0]
        system = self.system(agent)
        room = self.p.keep_tokens - sum(s.tokens for s in (*system, *tail))
        kept: list[Message] = []
        for message in reversed(memory):
            room -= sum(s.tokens for s in message)
            if room < 0:
                break
            kept.insert(0, message)
        if room < 0 and not kept and memory:
            need = self.p.keep_tokens - room  # system + tail + the newest message
            raise TopasError(
                f"context_tokens {self.p.context_tokens:,} keeps {self.p.keep_tokens:,} prompt "
                f"tokens (80%), but {role}'s system prompt, newest message and request need "
                f"{need:,}: raise context_tokens to at least {math.ceil(need / 0.8):,} for this "
                "call"
            )
        prev = self.stages[-1] if self.stages else None
        same_role = prev is not None and prev.agent.split(".")[0] == role
        n = uniform_tokens(self.rng, out)
        self.stages.append(
            Stage(
                id=self._sid(),
                agent=agent,
                prompt=(*system, *(s for m in kept for s in m), *tail),
                output_tokens=n,
                deps=() if prev is None else (prev.id,),
                delay_s=0.0 if prev is None else self.gap(same_role),
                kind=kind,
                max_new_tokens=n,
            )
        )
        return Segment(output_key(self.task_id, self.stages[-1].id), n)

    def gap(self, same_role: bool) -> float:
        return delay_s(self.rng, self.p.step_ms if same_role else self.p.handoff_ms)

    def think(self, role: str, out: Range, kind: str, reads: int = 0) -> Segment:
        """A RoleZero think; its output and a command result (+ `reads` tokens of documents
        read) join the role's memory."""
        cmd = self.seg("cmd", self.p.command_tokens)
        said = self.call(role, self.memory[role], [cmd], out, kind)
        result = self.result(said)
        self.memory[role] += [(said,), (Segment(result.key, result.tokens + reads),)]
        return said

    def language(self, role: str, goal: Segment) -> None:
        tail = [goal, self.seg("tmpl", self.p.language_prompt_tokens)]
        self.call(f"{role}.info", [], tail, self.p.language_tokens, "detect_language")

    def summary(self, role: str) -> Segment:
        tail = [self.seg("tmpl", self.p.summary_prompt_tokens)]
        return self.call(f"{role}.info", self.memory[role], tail, self.p.summary_tokens, "summary")

    def write_code(self) -> None:
        tail = [self.seg("tmpl", self.p.write_prompt_tokens)]
        code = self.call(WRITE, self.memory[ENG], tail, self.p.code_tokens, "write_code")
        self.memory[ENG].append((code, self.result(code)))  # the result carries the code


def _worker(job: _Job, role: str, route: Segment, docs: dict[str, int], first: bool) -> None:
    """One plan task of `role`: its think loop and summary; fills `docs` (document tokens)."""
    p = job.p
    job.memory[role].append((route,))
    if first:
        job.language(role, route)
    if role == PM:
        docs[PM] = job.think(PM, p.doc_tokens, "write_prd").tokens
    elif role == ARCH:
        docs[ARCH] = job.think(ARCH, p.doc_tokens, "write_design", reads=docs.get(PM, 0)).tokens
        job.think(ARCH, p.follow_up_tokens, "think")
    elif role == PROJ:
        docs[PROJ] = job.think(PROJ, p.task_list_tokens, "write_tasks", docs.get(ARCH, 0)).tokens
    else:
        if first:
            job.think(ENG, p.read_tokens, "read", reads=sum(docs.values()))
        job.think(ENG, p.engineer_plan_tokens, "plan")
        for _ in range(uniform_tokens(job.rng, p.files)):
            job.think(ENG, p.command_think_tokens, "command")
            job.write_code()
    job.think(role, p.end_tokens, "end")


def _stages(p: TlFullParams, task_id: str, rng: np.random.Generator) -> tuple[Stage, ...]:
    job = _Job(p, task_id, rng)
    _, idea_tokens = sample_idea(rng)
    idea = Segment(f"{task_id}/input", idea_tokens)
    job.memory[TL].append((idea,))
    job.call(QUICK, job.memory[TL], [job.seg("tmpl", p.quick_prompt_tokens)], p.classify_tokens,
             "classify")  # fmt: skip
    job.language(TL, idea)
    route = job.think(TL, p.plan_tokens, "plan")
    n = uniform_tokens(rng, p.plan_tasks)
    plan = [PM, ARCH, ENG] if n == 3 else [PM, ARCH, PROJ, ENG] + [ENG] * (n - 4)
    docs: dict[str, int] = {}
    for i, role in enumerate(plan):
        _worker(job, role, route, docs, first=role not in plan[:i])
        report = job.summary(role)
        job.memory[TL].append((report, job.result(report)))
        last = i == len(plan) - 1
        out, kind = (p.status_tokens, "status") if last else (p.route_tokens, "route")
        route = job.think(TL, out, kind)
    return tuple(job.stages)


make_tl_full = family("metagpt-tl-full", TlFullParams, _agents, _stages)
