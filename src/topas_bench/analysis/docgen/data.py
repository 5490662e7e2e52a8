"""The data every generated table reads: a report directory's per-run table, and the
small formats the tables share."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench.analysis.render import RUNS_FILE
from topas_bench.errors import TopasError


@cache
def _runs(path: Path) -> pd.DataFrame:
    f = path / RUNS_FILE
    if not f.is_file():
        raise TopasError(f"{f}: missing (write it with `topas-bench report RUNS --out {path}`)")
    runs = pd.read_csv(f, keep_default_na=False, na_values=[""])
    runs["scheduler_params"] = runs["scheduler_params"].fillna("{}").astype(str)
    return runs


def runs_of(root: Path, directory: str) -> pd.DataFrame:
    return _runs((root / directory).resolve())


def workload_order(names: list[str]) -> list[str]:
    order = {w: i for i, w in enumerate(("chain3", "dag4", "dag10-wide", "metagpt-sop",
                                         "metagpt-tl"))}  # fmt: skip
    return sorted(names, key=lambda w: (order.get(w, len(order)), w))


def md_table(records: list[dict[str, Any]]) -> str:
    if not records:
        return "(no rows)\n"
    return str(pd.DataFrame(records).to_markdown(index=False, disable_numparse=True)) + "\n"


def seeds_text(runs: pd.DataFrame) -> str:
    s = sorted(int(x) for x in runs["seed"].unique())
    if s == list(range(s[0], s[-1] + 1)) and len(s) > 2:
        return f"{s[0]}-{s[-1]}"
    return ",".join(str(x) for x in s)


def label_of(name: str, rows: pd.DataFrame) -> str:
    """A scheduler's label in a table: its name, and the form that stood for it where that
    was its tuned one (per metric: the better of its forms)."""
    forms = sorted(set(rows["other_variant"])) if "other_variant" in rows else []
    return f"{name} ({'/'.join(forms)})" if forms and forms != ["default"] else name


# -- blocks -----------------------------------------------------------------------------------
