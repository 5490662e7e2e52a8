"""The evaluation protocol's tables (docs/evaluation.md, "Protocol"): a focus scheduler against
every other, lever by lever, and each scheduler tuned against its defaults, each cell a paired
per-seed margin with a corrected verdict (`verdict`).

Everything here reads one row per run (a `collect.Collection`'s `runs`, or the compact
`runs.csv.gz` a report writes, `COMPACT`), so the tables of the docs are rebuilt from committed
files without the run trees. A group is the runs of one `GROUP_KEY`; within it, a scheduler
may have run with its defaults and with tuned parameters (`Tuned`, the file `topas-bench tune`
writes): its *representative* is the tuned variant where there is one, else its defaults.
The focus and its ablations run in their representative forms (chosen on the tuning seeds
alone, so that an ablation differs from the focus in exactly its lever); every other scheduler
in the better of its tuned and default forms per setting and metric (`versus`), which can only
flatter it; the defaults stay visible beside the tuned forms (`tuning_table`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import pandas as pd

from topas_bench.analysis.verdict import METRICS, Paired, paired, verdicts

#: Fields that name a group in a table of runs (every identity field but scheduler and seed
#: appears in the label; the engine does not).
GROUP_KEY = ["workload", "engine", "group_label"]
#: The per-run columns `runs.csv.gz` keeps: enough for every protocol table and the docs.
COMPACT = (
    *GROUP_KEY, "preset", "kv_budget_tokens", "rate_per_s", "load", "num_tasks", "max_tokens",
    "output_scale", "kv_multiple", "scheduler", "scheduler_name", "scheduler_params", "seed",
    "mean_jct_s", "p50_jct_s", "p90_jct_s", "p99_jct_s", "goodput_tps", "prefix_hit_rate",
    "preemptions", "queue_mean_s", "decode_batch", "agents_per_batch", "decision_p50_ms",
    "code", "variant",
)  # fmt: skip


class Tuned(Protocol):
    """Tuned parameters per scheduler (`tuned.load_tuned`'s `TunedSet`)."""

    def is_tuned(self, name: str, params: Mapping[str, Any]) -> bool: ...


def variant(name: str, params_json: str, tuned: Tuned | None) -> str:
    """`tuned` (its name's tuned setting, which may be its defaults where tuning kept them),
    `default` (no parameters, not tuned) or `custom` (other parameters)."""
    params = json.loads(params_json) if params_json else {}
    if tuned is not None and tuned.is_tuned(name, params):
        return "tuned"
    return "custom" if params else "default"


def with_variants(runs: pd.DataFrame, tuned: Tuned | None) -> pd.DataFrame:
    """`runs` with a `variant` column (`variant`); kept as it is when it has one already."""
    if "variant" in runs and tuned is None:
        return runs
    v = [
        variant(str(n), str(p), tuned)
        for n, p in zip(runs["scheduler_name"], runs["scheduler_params"], strict=True)
    ]
    return runs.assign(variant=v)


def representatives(g: pd.DataFrame) -> dict[str, str]:
    """Per scheduler name in a group (with `variant`): the label that stands for it."""
    rank = {"tuned": 0, "default": 1, "custom": 2}
    out: dict[str, str] = {}
    for name, d in g.groupby("scheduler_name", sort=False):
        best = min(zip(d["variant"], d["scheduler"], strict=True),
                   key=lambda vl: (rank[vl[0]], vl[1]))  # fmt: skip
        out[str(name)] = str(best[1])
    return out


def is_family(name: str, focus: str) -> bool:
    """Whether `name` is the focus or one of its variants (TOPAS's ablations for `topas`)."""
    return name == focus or (focus.startswith("topas") and name.startswith("topas"))


def _cell(g: pd.DataFrame, a: str, b: str, col: str) -> Paired:
    """Margin of label `a` over label `b` on `col`, over the seeds both have."""
    x = g[g["scheduler"] == a].set_index("seed")[col]
    y = g[g["scheduler"] == b].set_index("seed")[col]
    seeds = sorted(set(x.index) & set(y.index))
    return paired(x.loc[seeds].to_numpy(), y.loc[seeds].to_numpy())


def _groups(runs: pd.DataFrame) -> list[tuple[tuple[Any, ...], pd.DataFrame]]:
    return [(k, g) for k, g in runs.groupby(GROUP_KEY, sort=False)]


def _judge(rows: list[dict[str, Any]], cells: list[Paired]) -> pd.DataFrame:
    for row, (p_adj, word) in zip(rows, verdicts(cells), strict=True):
        row["p_holm"], row["verdict"] = p_adj, word
    return pd.DataFrame(rows)


Pick = Callable[[pd.DataFrame, dict[str, str]], list[tuple[str, tuple[str, ...], str, str]]]


def forms(g: pd.DataFrame, name: str) -> tuple[str, ...]:
    """The labels a scheduler ran under in a group, tuned and default forms (custom ones only
    where it has neither)."""
    d = g[g["scheduler_name"] == name]
    plain = d[d["variant"].isin(("tuned", "default"))]
    return tuple(sorted(set((plain if not plain.empty else d)["scheduler"])))


def _pair_rows(runs: pd.DataFrame, pick: Pick) -> pd.DataFrame:
    """Every pair `pick` names per group, for each metric, judged as one table. `pick` gives
    (focus label, the other's candidate labels, other name, role): of several candidates the
    one with the lower mean over the group's seeds on that metric stands for the other."""
    rows: list[dict[str, Any]] = []
    cells: list[Paired] = []
    for key, g in _groups(runs):
        reps = representatives(g)
        for focus_label, candidates, other_name, role in pick(g, reps):
            for metric, col in METRICS.items():
                means = {c: float(g[g["scheduler"] == c][col].mean()) for c in candidates}
                other_label = min(means, key=lambda c: (means[c], c))
                c = _cell(g, focus_label, other_label, col)
                fv = g[g["scheduler"] == focus_label][col].mean()
                ov = g[g["scheduler"] == other_label][col].mean()
                rows.append({
                    **dict(zip(GROUP_KEY, key, strict=True)), "focus": focus_label,
                    "other": other_label, "other_name": other_name, "role": role,
                    "other_variant": str(g[g["scheduler"] == other_label]["variant"].iloc[0]),
                    "metric": metric, "focus_value": float(fv), "other_value": float(ov),
                    "margin": c.margin, "lo": c.lo, "hi": c.hi, "p": c.p,
                    "n_seeds": c.n_seeds, "ahead": c.ahead,
                })  # fmt: skip
                cells.append(c)
    return _judge(rows, cells)


def versus(runs: pd.DataFrame, focus: str = "topas", tuned: Tuned | None = None) -> pd.DataFrame:
    """The focus against every other scheduler, per group and metric: one table, one Holm
    family. The focus runs in its representative form (tuned where it has one: chosen on the
    tuning seeds alone); another scheduler in the better of its tuned and default forms on
    that setting and metric, picked on the evaluation seeds themselves, which can only flatter
    it. Variants of the focus are left out (they are `levers`)."""
    runs = with_variants(runs, tuned)

    def pick(g: pd.DataFrame, reps: dict[str, str]) -> list[tuple[str, tuple[str, ...], str, str]]:
        if focus not in reps:
            return []
        return [(reps[focus], forms(g, name), name, "other") for name in reps
                if not is_family(name, focus)]  # fmt: skip

    return _pair_rows(runs, pick)


def levers(
    runs: pd.DataFrame, ablations: Sequence[str], focus: str = "topas", tuned: Tuned | None = None
) -> pd.DataFrame:
    """What each lever is worth: the focus against each ablation (the lever switched off),
    both in their representative form; margin > 0: the lever helps. One Holm family."""
    runs = with_variants(runs, tuned)

    def pick(g: pd.DataFrame, reps: dict[str, str]) -> list[tuple[str, tuple[str, ...], str, str]]:
        if focus not in reps:
            return []
        return [(reps[focus], (reps[a],), a, "ablation") for a in ablations if a in reps]

    return _pair_rows(runs, pick)


def tuning_table(runs: pd.DataFrame, tuned: Tuned | None) -> pd.DataFrame:
    """Each scheduler's tuned variant against its defaults (margin > 0: tuning helped), per
    group and metric. One Holm family."""
    runs = with_variants(runs, tuned)

    def pick(g: pd.DataFrame, reps: dict[str, str]) -> list[tuple[str, tuple[str, ...], str, str]]:
        out: list[tuple[str, tuple[str, ...], str, str]] = []
        for name, d in g.groupby("scheduler_name", sort=False):
            kinds = {str(v): str(s) for v, s in zip(d["variant"], d["scheduler"], strict=True)}
            if "tuned" in kinds and "default" in kinds:
                out.append((kinds["tuned"], (kinds["default"],), str(name), "tuning"))
        return out

    return _pair_rows(runs, pick)


def best_others(table: pd.DataFrame) -> pd.DataFrame:
    """Per group and metric of a `versus` table: the row of the strongest other scheduler
    (lowest mean over seeds; ties by name), with the group's wins / ties / losses counted."""
    out = []
    for _, g in table.groupby([*GROUP_KEY, "metric"], sort=False):
        best = g.sort_values(["other_value", "other"]).iloc[0].to_dict()
        counts = g["verdict"].value_counts()
        best |= {f"n_{w}": int(counts.get(w, 0)) for w in ("win", "tie", "loss")}
        best["n_others"] = len(g)
        out.append(best)
    return pd.DataFrame(out)


def pct(v: float, lo: float | None = None, hi: float | None = None, digits: int = 1) -> str:
    """``+12.3% [+8.1, +16.0]`` (or just the value)."""
    if v is None or not math.isfinite(v):
        return "-"
    text = f"{100 * v:+.{digits}f}%"
    if lo is not None and hi is not None and math.isfinite(lo) and math.isfinite(hi):
        text += f" [{100 * lo:+.{digits}f}, {100 * hi:+.{digits}f}]"
    return text


def cell_text(r: Mapping[str, Any] | pd.Series, bold_wins: bool = True) -> str:
    """A cell for Markdown: the margin, its interval and the verdict."""
    text = pct(r["margin"], r["lo"], r["hi"])
    word = str(r["verdict"])
    if word == "tie":
        return f"{text} tie"
    return f"**{text} {word}**" if bold_wins else f"{text} {word}"
