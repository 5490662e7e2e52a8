"""Scripted replies that walk MetaGPT main's TeamLeader workflow (MGXEnv) to the end, offline.

Used by `responder` with ``--workflow tl``. Every reply is chosen from the prompt alone:

- the TeamLeader's intent classification gets the category ``TASK``; a language question gets
  ``English``;
- a think (RoleZero's command prompt: the prompt asks for a JSON list of ``command_name`` entries)
  gets a few sentences of thought and a ```` ```json ```` command list, chosen by the role (its
  profile and name, from the ``You are a <profile>, named <name>`` line of its system prompt) and
  by how many of our replies to that role its memory already holds (each carries a
  ``topas-step <name> <k>`` tag):

  - TeamLeader: the first think appends one plan task per member found in its team list
    (Product Manager -> Architect -> Project Manager -> Engineer, those present) and publishes
    the first; after each member's report (a ``[Message] from <member>`` in its memory) it
    finishes the current task and publishes the next; after the last report it replies to the
    human and ends;
  - Product Manager / Architect: write short documents under ``docs/`` with ``Editor.write``
    (relative paths: MetaGPT resolves them in its workspace, which the recorder puts in a
    temporary directory), reply to the human, then ``end``;
  - Project Manager (a react loop of one think): its ``WriteTasks`` tool, which reads the design
    and asks the LLM for the task list itself;
  - Engineer: reads the documents named in its task, plans one task per code file, writes each
    file with ``Engineer2.write_new_code``, then replies and ends;
  - a leader with nothing new to act on answers ``end`` with a ``topas-wait`` tag (no step);
- an ActionNode prompt (a ``[CONTENT]`` JSON example: WriteTasks) gets that example back with
  our file list;
- a code-writing prompt (no role line; it names scripted code files) gets a Python code block
  for the file it names last (the plan lists them all, the file to write comes after);
- anything else (summaries, reports to the human) gets a short plain-text summary.

Completions carry the call number, so no two are equal (RoleZero treats a repeated reply as a
stuck loop). No MetaGPT prompt text is stored here, only the command names and argument names
that MetaGPT's tool registry accepts.
"""

from __future__ import annotations

import json
import re
from typing import Any

#: the members the TeamLeader plans for, in order, by profile
PIPELINE = ("Product Manager", "Architect", "Project Manager", "Engineer")
DOCS = {
    "Product Manager": ["docs/prd.md"],
    "Architect": ["docs/system_design.md", "docs/class_diagram.mmd"],
    "Project Manager": ["docs/project_schedule.md"],  # written by its WriteTasks tool
}
#: where MetaGPT's workspace is, seen from the recorder's work directory (its cwd and
#: METAGPT_PROJECT_ROOT): the Editor resolves relative paths there, WriteTasks reads from the cwd
WORKSPACE = "workspace"
_ROLE = re.compile(r"You are an? ([A-Za-z ]+?), named (\w+)")
_MEMBER = re.compile(r"^(\w+): (" + "|".join(PIPELINE) + r"),", re.M)
_FROM = re.compile(r"\[Message\] from (\w+)(?:\([^)]*\))? to ")
_REQUIREMENT = re.compile(r"\[Message\] from User to \w+: (.+)")
_DOC = re.compile(r"docs/[\w.]+\.(?:md|mmd)")
_STEP = "topas-step"
_WAIT = "topas-wait"
_BLOCK = re.compile(r"\[CONTENT\](.*?)\[/CONTENT\]", re.S)


def content_example(prompt: str) -> dict[str, Any] | None:
    """The JSON format example of an ActionNode prompt (``[CONTENT]{...}[/CONTENT]``), if any."""
    for block in _BLOCK.findall(prompt):
        try:
            obj = json.loads(block)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj:
            return obj
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _commands(thought: str, tag: str, commands: list[dict[str, Any]]) -> str:
    body = json.dumps(commands, indent=4, ensure_ascii=False)
    return f"{thought}\n{tag}\n```json\n{body}\n```\n"


def _cmd(name: str, **args: Any) -> dict[str, Any]:
    return {"command_name": name, "args": args}


class TLScript:
    """Chooses each completion from the prompt (see the module docstring)."""

    def __init__(self, files: int = 2, doc_sentences: int = 30) -> None:
        self.files = [f"src/part_{i}.py" for i in range(1, files)] + ["src/main.py"]
        self.doc_sentences = doc_sentences
        self.calls = 0

    # -- dispatch ----------------------------------------------------------------------------
    def reply(self, messages: list[dict[str, Any]]) -> str:
        self.calls += 1
        texts = [(str(m.get("role", "")), _text(m.get("content"))) for m in messages]
        system = "\n".join(t for r, t in texts if r == "system")
        last = texts[-1][1] if texts else ""
        memory = "\n".join(t for r, t in texts if r != "system")  # examples live in the system
        role = _ROLE.search(system)
        if "QUICK" in last and "TASK" in last and "SEARCH" in last:
            return f"The user asks for a piece of software to be built (call {self.calls}).\n" \
                "Response Category: TASK."  # fmt: skip
        if "command_name" in last and role is not None:
            profile, name = role.group(1), role.group(2)
            step = sum(f"{_STEP} {name} " in t for r, t in texts if r == "assistant")
            return self._think(profile, name, step, system, memory)
        if re.search(r"natural language", last, re.I) and len(last) < 4000:
            return "English"
        if (example := content_example(last)) is not None:
            return self._content(example)
        if role is None and (path := self._coding_file(last)) is not None:
            return self._code(path)
        return self._summary()

    def _coding_file(self, prompt: str) -> str | None:
        """The scripted code file a code-writing prompt is about: the one named last (the plan
        status lists them all; the file to write comes after it)."""
        at = {f: prompt.rfind(f.rsplit("/", 1)[-1]) for f in self.files}
        best = max(at, key=lambda f: at[f])
        return best if at[best] >= 0 else None

    # -- thinks --------------------------------------------------------------------------------
    def _think(self, profile: str, name: str, step: int, system: str, memory: str) -> str:
        tag = f"{_STEP} {name} {step} (call {self.calls})"
        if profile == "Team Leader":
            return self._leader(name, tag, system, memory)
        if profile == "Engineer":
            return self._engineer(name, tag, step, memory)
        docs = DOCS.get(profile, [])
        if profile == "Project Manager" and step == 0:
            return self._project_manager(name, tag, memory)
        if step < len(docs):
            path = docs[step]
            cmds = [_cmd("Editor.write", path=path, content=self._doc(profile, path))]
            if step == len(docs) - 1:
                cmds.append(_cmd("RoleZero.reply_to_human", content=self._report(name, docs)))
            return _commands(f"As the {profile}, I now write {path}.", tag, cmds)
        return self._end(f"My documents ({', '.join(docs)}) are written; I stop here.", tag)

    def _leader(self, name: str, tag: str, system: str, memory: str) -> str:
        found = {p: n for n, p in _MEMBER.findall(system)}
        members = [(p, found[p]) for p in PIPELINE if p in found and found[p] != name]
        if not members:
            return self._end("There is no team member to assign work to.", tag)
        names = {n for _, n in members}
        k = len({m for m in _FROM.findall(memory) if m in names})  # members that reported
        own = memory.count(f"{_STEP} {name} ")
        found_req = _REQUIREMENT.search(memory)
        requirement = found_req.group(1).strip() if found_req else "the request"
        if own > k:  # already acted on the latest news: wait (a reply that is no step)
            wait = f"{_WAIT} {name} (call {self.calls})"
            return self._end("I am waiting for the current member's report.", wait)
        cmds: list[dict[str, Any]] = []
        if k == 0:
            for i, (profile, member) in enumerate(members):
                cmds.append(_cmd(
                    "Plan.append_task", task_id=str(i + 1),
                    dependent_task_ids=[str(i)] if i else [],
                    instruction=self._instruction(profile, requirement), assignee=member,
                ))  # fmt: skip
            thought = (
                f"The requirement is software development: {requirement}. I plan "
                f"{len(members)} tasks, one per member, and start with {members[0][1]}."
            )
        else:
            cmds.append(_cmd("Plan.finish_current_task"))
            thought = f"{members[k - 1][1]} has reported back; task {k} is finished."
        if k < len(members):
            profile, member = members[k]
            cmds.append(_cmd(
                "TeamLeader.publish_team_message",
                content=self._instruction(profile, requirement), send_to=member,
            ))  # fmt: skip
            told = f"I asked {member} ({profile}) to take task {k + 1}."
            cmds.append(_cmd("RoleZero.reply_to_human", content=told))
            return _commands(thought + f" Next: {member}.", tag, cmds)
        cmds.append(_cmd("RoleZero.reply_to_human",
                         content=f"All {k} tasks for '{requirement}' are finished."))  # fmt: skip
        cmds.append(_cmd("end"))
        return _commands(thought + " Every task is finished; I end.", tag, cmds)

    def _engineer(self, name: str, tag: str, step: int, memory: str) -> str:
        n = len(self.files)
        if step == 0:
            docs = list(dict.fromkeys(_DOC.findall(memory)))
            if docs:
                cmds = [_cmd("Editor.read", path=d) for d in docs]
                return _commands(f"I first read {', '.join(docs)}.", tag, cmds)
            step = 1  # nothing to read: plan at once
        if step == 1:
            cmds = [
                _cmd("Plan.append_task", task_id=str(i + 1),
                     dependent_task_ids=[str(i)] if i else [],
                     instruction=f"Write {f}, part {i + 1} of the program.", assignee=name)
                for i, f in enumerate(self.files)
            ]  # fmt: skip
            return _commands(f"I plan {n} files: {', '.join(self.files)}.", tag, cmds)
        i = step - 2
        if i < n:
            cmds = [_cmd("Plan.finish_current_task")] if i else []
            cmds.append(_cmd("Engineer2.write_new_code", path=self.files[i],
                             file_description=f"part {i + 1} of the program"))  # fmt: skip
            return _commands(f"Next I write {self.files[i]}.", tag, cmds)
        cmds = [
            _cmd("Plan.finish_current_task"),
            _cmd("RoleZero.reply_to_human", content=f"Wrote {', '.join(self.files)}."),
            _cmd("end"),
        ]
        return _commands("All files are written.", tag, cmds)

    def _project_manager(self, name: str, tag: str, memory: str) -> str:
        """One think (the role's react loop is 1): its WriteTasks tool writes the schedule."""
        found_req = _REQUIREMENT.search(memory)
        requirement = found_req.group(1).strip() if found_req else "the request"
        cmds = [
            _cmd("WriteTasks", user_requirement=requirement,
                 design_filename=f"{WORKSPACE}/docs/system_design.md",
                 output_pathname="docs/project_schedule.json"),
            _cmd("RoleZero.reply_to_human",
                 content=self._report(name, DOCS["Project Manager"])),
        ]  # fmt: skip
        return _commands("I write the task list with WriteTasks from the design.", tag, cmds)

    @staticmethod
    def _end(thought: str, tag: str) -> str:
        return _commands(thought, tag, [_cmd("end")])

    # -- contents ------------------------------------------------------------------------------
    def _instruction(self, profile: str, requirement: str) -> str:
        own = DOCS.get(profile, [])
        reads = [d for p in PIPELINE[: PIPELINE.index(profile)] for d in DOCS.get(p, [])]
        parts = [f"Requirement: {requirement}. Language: Python."]
        if reads:
            parts.append(f"Read {', '.join(reads)} first.")
        if own:
            parts.append(f"Write {', '.join(own)}.")
        if profile == "Engineer":
            parts.append(f"Write the code files {', '.join(self.files)}.")
        parts.append(  # a real leader's instructions restate the requirement at length
            "Keep every module small and documented, use the standard library only, cover the "
            "rules of the requirement one by one, and report back with the paths of everything "
            "you wrote once your part is complete."
        )
        return " ".join(parts)

    def _doc(self, profile: str, path: str) -> str:
        lines = [f"# {profile}: {path} (call {self.calls})", ""]
        lines += [
            f"{i + 1}. Item {i + 1} of {path} written by call {self.calls}: the program keeps "
            f"state {i} consistent and checks the rule numbered {i * 7 + self.calls}."
            for i in range(self.doc_sentences)
        ]
        return "\n".join(lines) + "\n"

    def _report(self, name: str, docs: list[str]) -> str:
        return f"{name} wrote {', '.join(docs)} (call {self.calls})."

    def _code(self, path: str) -> str:
        n = self.calls
        body = "\n".join(f"    value_{n}_{i} = compute_step({i}, {n})" for i in range(12))
        return (
            f"```python\n# {path}: generated by call {n}\n"
            f"def compute_step(i, n):\n    return i * n\n\n\ndef run_{n}():\n{body}\n"
            f"    return value_{n}_0\n```\n"
        )

    def _content(self, example: dict[str, Any]) -> str:
        """An ActionNode reply (WriteTasks): the prompt's example with our file list."""
        out = dict(example)
        names = [f.rsplit("/", 1)[-1] for f in self.files]
        for key in ("File list", "Task list"):
            if key in out:
                out[key] = list(names)
        if "Logic Analysis" in out:
            out["Logic Analysis"] = [[f, f"implements part {i + 1} (call {self.calls})"]
                                     for i, f in enumerate(names)]  # fmt: skip
        for key in ("Required packages", "Required Other language third-party packages",
                    "Required Python packages"):  # fmt: skip
            if key in out:
                out[key] = []
        return "[CONTENT]\n" + json.dumps(out, indent=2) + "\n[/CONTENT]"

    def _summary(self) -> str:
        return (
            f"Summary of call {self.calls}: the assigned work is complete, the deliverables are "
            f"written in the workspace, and no further action is needed (summary {self.calls})."
        )
