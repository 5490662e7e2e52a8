"""docs/metagpt-facts.md and the MetaGPT generators' defaults say the same figures."""

from __future__ import annotations

import re
from pathlib import Path

from topas_bench.workloads.metagpt import SopParams, TlParams
from topas_bench.workloads.metagpt_sop_full import SopFullParams
from topas_bench.workloads.metagpt_tl_full import TlFullParams

DOC = Path(__file__).resolve().parents[1] / "docs" / "metagpt-facts.md"


def table(section: str) -> dict[str, list[str]]:
    """The first Markdown table under the `## ` heading starting with `section`: first cell ->
    the other cells."""
    text = DOC.read_text().split(f"\n## {section}", 1)[1].split("\n## ", 1)[0]
    rows = [x.strip("|").split("|") for x in text.splitlines() if x.startswith("|")]
    return {r[0].strip(): [c.strip() for c in r[1:]] for r in rows[2:]}


def ints(cell: str) -> list[int]:
    return [int(x.replace(",", "")) for x in re.findall(r"\d[\d,]*", cell)]


def test_sop_table_is_the_generators_figures() -> None:
    sop, full = table("MetaGPT-SOP"), SopFullParams()
    expect = {
        "ProductManager / WritePRD": (full.pm_system_tokens, [full.prd_template_tokens]),
        "Architect / WriteDesign": (full.architect_system_tokens, [full.design_template_tokens]),
        "ProjectManager / WriteTasks": (
            full.project_manager_system_tokens, [full.tasks_template_tokens],
        ),
        "Engineer / WriteCode": (
            full.engineer_system_tokens, [full.code_header_tokens, full.code_template_tokens],
        ),
        "Engineer / review": (
            full.engineer_system_tokens, [full.review_header_tokens, full.review_template_tokens],
        ),
        "Engineer / rewrite": (full.engineer_system_tokens, [full.rewrite_template_tokens]),
        "QaEngineer / WriteTest": (
            full.qa_system_tokens, [full.test_header_tokens + full.test_template_tokens],
        ),
        "QaEngineer / RunCode": (
            full.qa_system_tokens, [full.run_header_tokens + full.run_template_tokens],
        ),
    }  # fmt: skip
    assert set(sop) == set(expect)
    for row, (system, template) in expect.items():
        assert ints(sop[row][0]) == [system], row
        assert ints(sop[row][1]) == template, row
    p = SopParams()
    prefixes = (p.pm_prefix_tokens, p.architect_prefix_tokens, p.project_manager_prefix_tokens,
                p.engineer_prefix_tokens, p.qa_prefix_tokens)  # fmt: skip
    assert (
        "prefixes of\n`metagpt-sop`: {}, {}, {}, {} (49 + 100 + 226) and {} tokens".format(
            *prefixes
        )
        in DOC.read_text()
    )


def test_tl_table_is_the_generators_figures() -> None:
    tl, full, short = table("MetaGPT-TL"), TlFullParams(), TlParams()
    expect = {
        "TeamLeader (Mike)": ("tl", short.tl_prefix_tokens),
        "ProductManager (Alice)": ("pm", short.pm_prefix_tokens),
        "Architect (Bob)": ("architect", short.architect_prefix_tokens),
        "Engineer2 (Alex)": ("engineer", short.engineer_prefix_tokens),
    }
    for row, (role, prefix) in expect.items():
        cells = [ints(c)[0] for c in tl[row]]
        assert cells[0] == getattr(full, f"{role}_system_tokens") == prefix, row
        assert cells[1] == getattr(full, f"{role}_info_tokens"), row
        assert cells[-1] == getattr(full, f"{role}_before_timestamp_tokens"), row
    assert full.command_tokens == short.command_tokens == 368
    assert "a fixed 368-token command prompt" in DOC.read_text()
