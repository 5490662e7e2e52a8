"""Generated tables of the docs: every results table of docs/evaluation.md and README's TOPAS
section is computed here from committed result files, so that a number edited by hand fails a
test (tests/test_docgen.py) and `python scripts/gen_docs.py` rewrites them.

A generated block in a Markdown file:

    <!-- generated: NAME key=value key=value -->
    (anything: replaced by the table)
    <!-- /generated -->

NAME is one of `BLOCKS`; the keys are its arguments, paths relative to the repository root
(e.g. ``dir=results/paper-regime``, a report directory holding `runs.csv.gz`, the compact
per-run table `topas-bench report` writes, `render.RUNS_FILE`). Every table is a function of
those files and of the code's fixed facts (the paper's figures, the registry), nothing else:
no run tree, no clock, no randomness beyond the seeded bootstrap.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from topas_bench.analysis.docgen.history_tables import (
    calibration,
    changes,
    changes_regime,
    demand,
    regime_summary,
)
from topas_bench.analysis.docgen.protocol_tables import (
    capability,
    headline,
    lever_table,
    mechanism,
    peers,
    per_seed,
    preemption,
    summary,
    tuning,
    versus_matrix,
)
from topas_bench.errors import TopasError

BEGIN = re.compile(r"<!-- generated: (?P<name>[a-z0-9-]+)(?P<args>(?: [a-z_]+=\S+)*) -->")
END = "<!-- /generated -->"
#: The files whose generated blocks a check covers (tests/test_docgen.py).
DOCS = ("README.md", "docs/evaluation.md")


@dataclass(frozen=True)
class Block:
    name: str
    args: dict[str, str]
    start: int  # index of the first character after the opening marker's line
    end: int  # index of the closing marker


def blocks(text: str) -> list[Block]:
    out = []
    for m in BEGIN.finditer(text):
        start = text.index("\n", m.end()) + 1 if "\n" in text[m.end() :] else len(text)
        end = text.find(END, start)
        if end < 0:
            raise TopasError(f"generated block {m.group('name')!r} has no {END}")
        args = dict(a.split("=", 1) for a in m.group("args").split())
        out.append(Block(m.group("name"), args, start, end))
    return out


def render(text: str, root: Path) -> str:
    """`text` with every generated block recomputed."""
    parts, last = [], 0
    for b in blocks(text):
        fn = BLOCKS.get(b.name)
        if fn is None:
            raise TopasError(f"unknown generated block {b.name!r} (known: {', '.join(BLOCKS)})")
        parts += [text[last : b.start], fn(root, **b.args).rstrip("\n") + "\n"]
        last = b.end
    return "".join(parts) + text[last:]


BLOCKS: dict[str, Callable[..., str]] = {
    "summary": summary,
    "capability": capability,
    "changes": changes,
    "changes-regime": changes_regime,
    "headline": headline,
    "versus": versus_matrix,
    "levers": lever_table,
    "preemption": preemption,
    "tuning": tuning,
    "mechanism": mechanism,
    "per-seed": per_seed,
    "regime-summary": regime_summary,
    "calibration": calibration,
    "demand": demand,
    "peers": peers,
}
