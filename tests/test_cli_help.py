"""Every command's --help wraps as paragraphs: no sentence broken by a line break in the source.

rich wraps a line only when its next word does not fit; a line followed, in the same paragraph
or table cell, by a word that would have fit on it was broken by a hard line break in the help
text (typer keeps docstrings' line breaks). The check renders every command of the app at two
widths and looks for exactly that.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import typer.main
from typer.testing import CliRunner

from topas_bench.cli import app
from topas_bench.cli_help import reflow

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
WIDTHS = (80, 120)
BORDER = "│"
ROW_START = 4  # a panel's row starts at column 1, or 4 after a required option's `*`


def commands() -> Iterator[tuple[str, ...]]:
    """The path of every command and group, the root's `()` first."""

    def walk(cmd: object, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        yield path
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            yield from walk(sub, (*path, name))

    yield from walk(typer.main.get_command(app), ())


def _indent(s: str) -> int:
    return len(s) - len(s.lstrip(" "))


def _starts_sentence_tail(word: str) -> bool:
    """A word that only continues a sentence: lowercase, or code, a bracket, an option."""
    return word[0].islower() or word[0] in "`(<" or word.startswith("--")


def hard_breaks(page: str, width: int) -> list[str]:
    """Lines of `page` (help rendered at `width`) broken before a word that would have fit."""
    found = []
    lines = [ANSI.sub("", x).rstrip() for x in page.splitlines()]
    para_indent, listing = 0, False
    for prev, line in zip(["", *lines], lines, strict=False):
        panel = line.startswith(BORDER) and prev.startswith(BORDER)
        if panel:
            # a panel's cell: between the borders, right padding 1; a continuation line is blank
            # up to the column it continues
            a, b = prev[1 : prev.rindex(BORDER)], line[1 : line.rindex(BORDER)]
            end = len(a) - 1
            col = _indent(b)
            if col <= ROW_START or not b.strip() or len(a) <= col:
                continue
            if a[col] == " " or a[col - 1] != " ":
                continue
        else:
            if not prev.strip():
                # typer dedents a paragraph's lines: `Examples:` and its lines share an indent
                para_indent, listing = _indent(line), line.endswith(":")
                continue
            if line[:1] in "╭╰" + BORDER or prev[:1] in "╭╰" + BORDER:
                continue
            a, b, end = prev, line, width - 1
            col = _indent(b)
            if listing or col != para_indent or _indent(a) != para_indent:
                continue  # examples and other indented blocks keep their lines
        tail, word = a[col:].rstrip(), b[col:].split(" ")[0]
        if (
            word
            and _starts_sentence_tail(word)
            and not tail.endswith(":")
            and col + len(tail) + 1 + len(word) <= end
        ):
            found.append(f"{prev.strip()!r} / {line.strip()!r}")
    return found


def render(path: tuple[str, ...], width: int) -> str:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(width)})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("width", WIDTHS)
def test_every_help_wraps_as_paragraphs(width: int) -> None:
    paths = list(commands())
    assert len(paths) > 25 and ("trace", "import") in paths  # the walk reached the subcommands
    broken = {
        " ".join(p) or "(root)": b for p in paths if (b := hard_breaks(render(p, width), width))
    }
    assert not broken, broken


def test_the_check_finds_a_hard_break() -> None:
    """Unreflowed help, as typer prints a docstring's own line breaks, fails the check."""
    para = "Every scheduler sees the same tasks. Results go to a\ndirectory; a finished cell"
    page = f"\n Run things.\n\n {para.replace(chr(10), chr(10) + ' ')} is reused.\n"
    assert hard_breaks(page, 120) == [
        "'Every scheduler sees the same tasks. Results go to a' / 'directory; a finished cell "
        "is reused.'"
    ]
    wrapped = "\n Run things.\n\n Every scheduler sees the same\n tasks.\n"
    assert hard_breaks(wrapped, 31) == []  # `tasks.` did not fit: rich's own wrap
    assert hard_breaks(wrapped, 40) != []
    cell = "│ --x   <int>  Number of tasks of the{}│\n│              run, per cell.{}│\n"
    assert hard_breaks(cell.format(" " * 8, " " * 16), 52) != []
    assert hard_breaks(cell.format(" " * 2, " " * 10), 46) == []  # `run,` did not fit


def test_reflow_keeps_examples_bullets_and_paragraphs() -> None:
    text = """First line
    goes on.

    - a bullet
      with a tail
    - another

    Examples:
      topas-bench run
      topas-bench run -w dag4
    """
    assert reflow(text) == (
        "First line goes on.\n\n- a bullet with a tail\n- another\n\n"
        "Examples:\n  topas-bench run\n  topas-bench run -w dag4"
    )
