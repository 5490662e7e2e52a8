"""Generated docs (issue 29, part 5): every results table of docs/evaluation.md and README's
TOPAS section is rebuilt from committed result files, and a number edited by hand fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from topas_bench.analysis.docgen import BLOCKS, DOCS, blocks, render
from topas_bench.errors import TopasError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("doc", DOCS)
def test_committed_docs_are_what_the_result_files_give(doc: str) -> None:
    text = (ROOT / doc).read_text()
    assert text == render(text, ROOT), f"{doc} is stale: run python scripts/gen_docs.py"


def test_the_evaluation_and_readme_carry_generated_tables() -> None:
    found = {d: [b.name for b in blocks((ROOT / d).read_text())] for d in DOCS}
    assert {"headline", "levers", "tuning", "preemption", "regime-summary"} <= set(
        found["docs/evaluation.md"]
    )
    assert "headline" in found["README.md"]


def test_a_number_edited_by_hand_fails_the_check(tmp_path: Path) -> None:
    text = (ROOT / "docs/evaluation.md").read_text()
    b = blocks(text)[0]
    body = text[b.start : b.end]
    digit = next(i for i, ch in enumerate(body) if ch.isdigit())
    edited = body[:digit] + str((int(body[digit]) + 1) % 10) + body[digit + 1 :]
    doc = text[: b.start] + edited + text[b.end :]
    assert render(doc, ROOT) == text  # the generator puts the true number back
    copy = tmp_path / "evaluation.md"
    copy.write_text(doc)
    check = [sys.executable, str(ROOT / "scripts/gen_docs.py"), "--check", str(copy)]
    res = subprocess.run(check, capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 1 and "stale" in res.stderr
    fix = subprocess.run([*check[:2], str(copy)], capture_output=True, text=True, cwd=ROOT)
    assert fix.returncode == 0 and copy.read_text() == text


def test_malformed_blocks_are_named() -> None:
    with pytest.raises(TopasError, match="no <!-- /generated -->"):
        blocks("<!-- generated: headline dir=x -->\n| a |\n")
    with pytest.raises(TopasError, match="unknown generated block 'nope'"):
        render("<!-- generated: nope -->\n<!-- /generated -->\n", ROOT)
    with pytest.raises(TopasError, match=r"runs\.csv\.gz: missing"):
        render("<!-- generated: headline dir=results/none -->\n<!-- /generated -->\n", ROOT)
    assert set(BLOCKS) >= {"headline", "versus", "levers", "tuning", "mechanism"}
