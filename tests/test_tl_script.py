"""The TL responder script's reply choice, without MetaGPT: stand-in prompts carry only the
markers `TLScript` keys on (role line, team list, ``[Message] from`` lines, ``command_name``)."""

from __future__ import annotations

import json
import re
from typing import Any

from topas_bench.recorder.tl_script import TLScript

REQ = "Write a 2048 game"
TEAM = (
    "Mike: Team Leader, plans\nAlice: Product Manager, writes PRDs\nBob: Architect, designs\n"
    "Eve: Project Manager, schedules\nAlex: Engineer, codes\n"
)
ASK = 'Reply with a JSON array of {"command_name": ..., "args": ...}.'


def _system(profile: str, name: str, extra: str = "") -> dict[str, str]:
    article = "an" if profile[0] in "AEIOU" else "a"
    return {"role": "system", "content": f"You are {article} {profile}, named {name}.\n{extra}"}


def _commands(reply: str) -> list[dict[str, Any]]:
    (block,) = re.findall(r"```json\n(.*?)\n```", reply, re.S)
    cmds = json.loads(block)
    assert isinstance(cmds, list)
    return cmds


def _names(reply: str) -> list[str]:
    return [c["command_name"] for c in _commands(reply)]


class Think:
    """A role's memory as RoleZero builds it: system, messages and our replies, then the ask."""

    def __init__(self, script: TLScript, profile: str, name: str, system_extra: str = "") -> None:
        self.script, self.system = script, _system(profile, name, system_extra)
        self.memory: list[dict[str, str]] = []

    def hear(self, text: str) -> None:
        self.memory.append({"role": "user", "content": text})

    def think(self) -> str:
        reply = self.script.reply([self.system, *self.memory, {"role": "user", "content": ASK}])
        self.memory.append({"role": "assistant", "content": reply})
        return reply


def test_classification_language_and_summary() -> None:
    s = TLScript()
    quick = s.reply([{"role": "user", "content": "Classify: QUICK, SEARCH, TASK or AMBIGUOUS"}])
    assert quick.rstrip().endswith("TASK.")
    assert s.reply([{"role": "user", "content": "Which natural language is this?"}]) == "English"
    summary = s.reply([{"role": "user", "content": "Summarise what you did."}])
    assert "summary 3" in summary  # numbered: no two completions are equal


def test_team_leader_hands_tasks_out_one_member_at_a_time() -> None:
    s = TLScript(files=2)
    tl = Think(s, "Team Leader", "Mike", TEAM)
    tl.hear(f"[Message] from User to Mike: {REQ}")
    first = _commands(tl.think())
    plan = [c for c in first if c["command_name"] == "Plan.append_task"]
    assert [c["args"]["assignee"] for c in plan] == ["Alice", "Bob", "Eve", "Alex"]
    assert [c["args"]["dependent_task_ids"] for c in plan] == [[], ["1"], ["2"], ["3"]]
    assert all(REQ in c["args"]["instruction"] for c in plan)
    publish = [c for c in first if c["command_name"] == "TeamLeader.publish_team_message"]
    assert [c["args"]["send_to"] for c in publish] == ["Alice"]
    assert _names(tl.think()) == ["end"]  # no report yet: waits
    handovers = [("Alice", "Product Manager", "Bob"), ("Bob", "Architect", "Eve"),
                 ("Eve", "Project Manager", "Alex")]  # fmt: skip
    for member, profile, nxt in handovers:
        tl.hear(f"[Message] from {member}({profile}) to Mike: done")
        cmds = _commands(tl.think())
        assert cmds[0]["command_name"] == "Plan.finish_current_task"
        assert cmds[1]["args"]["send_to"] == nxt
    tl.hear("[Message] from Alex(Engineer) to Mike: done")
    assert _names(tl.think()) == ["Plan.finish_current_task", "RoleZero.reply_to_human", "end"]


def test_team_leader_without_members_ends() -> None:
    tl = Think(TLScript(), "Team Leader", "Mike", "Mike: Team Leader, alone\n")
    tl.hear(f"[Message] from User to Mike: {REQ}")
    assert _names(tl.think()) == ["end"]


def test_document_writers_write_then_end() -> None:
    s = TLScript(doc_sentences=3)
    bob = Think(s, "Architect", "Bob")
    bob.hear(f"[Message] from Mike to Bob: {REQ}; read docs/prd.md")
    writes = [_commands(bob.think()), _commands(bob.think())]
    assert [w[0]["args"]["path"] for w in writes] == ["docs/system_design.md",
                                                      "docs/class_diagram.mmd"]  # fmt: skip
    assert writes[0][0]["command_name"] == "Editor.write"
    assert "Item 3 of docs/system_design.md" in writes[0][0]["args"]["content"]
    assert _names(bob.think()) == ["end"]
    eve = Think(s, "Project Manager", "Eve")
    eve.hear(f"[Message] from User to Mike: {REQ}")
    (tasks, reply) = _commands(eve.think())  # one think: its react loop is 1
    assert tasks["command_name"] == "WriteTasks"
    assert tasks["args"]["user_requirement"] == REQ
    assert tasks["args"]["design_filename"].endswith("docs/system_design.md")
    assert reply["command_name"] == "RoleZero.reply_to_human"


def test_engineer_reads_plans_writes_each_file_and_ends() -> None:
    s = TLScript(files=2)
    alex = Think(s, "Engineer", "Alex")
    alex.hear("[Message] from Mike to Alex: read docs/prd.md, docs/system_design.md first")
    reads = _commands(alex.think())
    assert [c["args"]["path"] for c in reads] == ["docs/prd.md", "docs/system_design.md"]
    plan = _commands(alex.think())
    assert [c["command_name"] for c in plan] == ["Plan.append_task"] * 2
    first, second = _commands(alex.think()), _commands(alex.think())
    args = {"path": "src/part_1.py", "file_description": "part 1 of the program"}
    assert first == [{"command_name": "Engineer2.write_new_code", "args": args}]
    assert [c["command_name"] for c in second] == ["Plan.finish_current_task",
                                                   "Engineer2.write_new_code"]  # fmt: skip
    assert second[1]["args"]["path"] == "src/main.py"
    assert _names(alex.think()) == ["Plan.finish_current_task", "RoleZero.reply_to_human", "end"]


def test_code_prompt_gets_the_file_named_last() -> None:
    s = TLScript(files=2)
    prompt = "Plan: write src/part_1.py, then src/main.py.\nNow: /w/src/part_1.py\nWrite part_1.py"
    code = s.reply([{"role": "system", "content": "You write code."},
                    {"role": "user", "content": prompt}])  # fmt: skip
    assert code.startswith("```python\n# src/part_1.py") and code.rstrip().endswith("```")
    code = s.reply([{"role": "user", "content": prompt.replace("part_1.py", "X") + " main.py"}])
    assert code.startswith("```python\n# src/main.py")


def test_action_node_prompt_gets_the_example_with_our_files() -> None:
    s = TLScript(files=3)
    example = {"Task list": ["game.py"], "Required packages": ["numpy"],
               "Logic Analysis": [["game.py", "x"]], "Full API spec": ""}  # fmt: skip
    reply = s.reply([{"role": "user", "content": f"[CONTENT]\n{json.dumps(example)}\n[/CONTENT]"}])
    body = json.loads(reply.removeprefix("[CONTENT]").removesuffix("[/CONTENT]"))
    assert body["Task list"] == ["part_1.py", "part_2.py", "main.py"]
    assert body["Required packages"] == [] and body["Full API spec"] == ""
    assert [f for f, _ in body["Logic Analysis"]] == body["Task list"]


def test_replies_are_distinct() -> None:
    s = TLScript()
    alex = Think(s, "Engineer", "Alex")
    replies = [alex.think() for _ in range(6)]
    assert len(set(replies)) == len(replies)
