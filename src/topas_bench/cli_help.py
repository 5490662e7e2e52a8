"""Help texts that wrap as paragraphs at any terminal width.

Typer's rich help (0.29) keeps a docstring's single line breaks after its first paragraph, and
keeps them in the first paragraph shown in a group's command list: a docstring wrapped at 100
columns prints broken mid-sentence in a narrower or wider terminal. The root group joins the
lines of every prose paragraph of every command's and parameter's help once, when typer builds
it; rich then wraps them to the terminal. Indented lines (examples), bullets (`- `) and
paragraphs marked with click's `\\b` keep their line breaks.
"""

from __future__ import annotations

import inspect
from typing import Any

from typer.core import TyperGroup

_BULLETS = ("- ", "* ")


def reflow(text: str) -> str:
    """`text` with each prose paragraph on one line; paragraphs stay apart (blank lines)."""
    return "\n\n".join(_paragraph(p) for p in inspect.cleandoc(text).split("\n\n"))


def _paragraph(p: str) -> str:
    if p.startswith("\b"):
        return p
    lines: list[str] = []
    for line in p.split("\n"):
        if lines and _continues(lines[-1], line):
            lines[-1] = f"{lines[-1].rstrip()} {line.strip()}"
        else:
            lines.append(line)
    return "\n".join(lines)


def _continues(prev: str, line: str) -> bool:
    """Whether `line` goes on `prev`'s sentence: prose after prose, or a bullet's indented tail."""
    if not line.strip() or line.lstrip().startswith(_BULLETS):
        return False
    if prev.startswith(_BULLETS):
        return line.startswith("  ")
    return not line[0].isspace() and not prev[0].isspace()


def reflow_tree(command: Any) -> None:
    """Reflow the help of `command` (a click command: typer 0.29 vendors its own click, so this
    is duck-typed), its parameters and, in a group, every subcommand."""
    if command.help:
        command.help = reflow(command.help)
    for param in command.params:
        text = getattr(param, "help", None)
        if text:
            param.help = reflow(text)
    for sub in getattr(command, "commands", {}).values():
        reflow_tree(sub)


class ReflowGroup(TyperGroup):
    """The root group: reflows the whole tree's help as typer builds it (`Typer(cls=...)`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        reflow_tree(self)


__all__ = ["ReflowGroup", "reflow", "reflow_tree"]
