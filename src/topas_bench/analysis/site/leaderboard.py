"""Leaderboards: every scheduler of one setting ranked on one metric, each against the leader.

For each setting (group) and metric of a source's per-run table (`runs.csv.gz`), every
scheduler stands once: TOPAS in its representative form (tuned where it has one), every other
scheduler in the better of its tuned and default forms on that metric (`protocol.forms`, as
the protocol's `versus` table picks it); TOPAS's ablations are levers, not entries. The leader
is the best mean over the seeds (lowest JCT, highest goodput). Each other entry is one paired
cell against the leader (`verdict.paired`, over the seeds both ran): the leader's margin over
it (1 - leader / entry for JCT, 1 - entry / leader for goodput: positive, the leader is
ahead), its 95% interval and a bootstrap p-value.

Verdicts: a cell with TOPAS in it (TOPAS leads, or TOPAS trails another leader) takes the
protocol's own verdict for that pair (`protocol.versus`: the same pair, seeds and resamples,
Holm-corrected over every TOPAS cell of the source), so a leaderboard never contradicts the
evaluation's tables. The other cells (another leader against a third scheduler) are one Holm
family per source; goodput, which the protocol does not judge, is one family of its own. An
entry is `loss` (behind the leader beyond the corrected interval) or `tie` (not told apart).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from topas_bench.analysis.protocol import GROUP_KEY, forms, is_family, pct, representatives
from topas_bench.analysis.verdict import Paired, paired, verdicts

FOCUS = "topas"
#: metric -> (per-run column, lower is better, label, unit)
METRICS: dict[str, tuple[str, bool, str, str]] = {
    "mean": ("mean_jct_s", True, "mean JCT", "s"),
    "p99": ("p99_jct_s", True, "p99 JCT", "s"),
    "goodput": ("goodput_tps", False, "goodput", "tasks/s"),
}
COLUMNS = [
    *GROUP_KEY, "metric", "rank", "scheduler", "form", "label", "value", "value_lo", "value_hi",
    "n_seeds", "leader", "margin", "lo", "hi", "p", "p_holm", "verdict", "focus_margin",
    "focus_lo", "focus_hi",
]  # fmt: skip


@dataclass(frozen=True)
class Entry:
    name: str
    label: str
    form: str
    values: pd.Series  # by seed


def _entries(g: pd.DataFrame, col: str, lower: bool) -> list[Entry]:
    reps = representatives(g)
    out = []
    for name in reps:
        if is_family(name, FOCUS) and name != FOCUS:
            continue
        candidates = (reps[name],) if name == FOCUS else forms(g, name)
        means = {c: float(g[g["scheduler"] == c][col].mean()) for c in candidates}
        label = min(means, key=lambda c: ((means[c] if lower else -means[c]), c))
        d = g[g["scheduler"] == label]
        out.append(Entry(name, label, str(d["variant"].iloc[0]), d.set_index("seed")[col]))
    return out


def _interval(ci: pd.DataFrame, at: tuple[Any, ...], col: str) -> tuple[float, float]:
    """The report's interval of `col` for one (workload, group label, scheduler label)."""
    if at not in ci.index or f"{col}_lo" not in ci:
        return np.nan, np.nan
    return float(ci.at[at, f"{col}_lo"]), float(ci.at[at, f"{col}_hi"])  # type: ignore[arg-type]


def leaderboards(
    runs: pd.DataFrame,
    rows: pd.DataFrame,
    protocol_table: pd.DataFrame,
    groups: set[str] | None = None,
) -> pd.DataFrame:
    """One row per (setting, metric, scheduler) of `runs` (a report's `runs.csv.gz`, with its
    `variant` column): `COLUMNS`; the interval of each value is the report's (`rows`, per
    setting and scheduler label: a bootstrap over seeds), TOPAS's verdicts the protocol's
    (`protocol_table`: the report's `versus` table, verdicts.csv). `groups`: only these
    group labels. Empty for an empty table."""
    if runs.empty or "variant" not in runs:
        return pd.DataFrame(columns=COLUMNS)
    records: list[dict[str, Any]] = []
    families: dict[str, list[tuple[int, Paired]]] = {"jct": [], "goodput": []}
    protocol = _protocol(protocol_table)
    ci = rows.set_index(["workload", "group_label", "scheduler"])
    for key, g in runs.groupby(GROUP_KEY, sort=False):
        if groups is not None and key[2] not in groups:
            continue
        for metric, (col, lower, _, _) in METRICS.items():
            entries = _entries(g, col, lower)
            order = sorted(entries, key=lambda e: ((e.values.mean() if lower
                                                    else -e.values.mean()), e.name))  # fmt: skip
            leader = order[0]
            for rank, e in enumerate(order, start=1):
                seeds = sorted(set(e.values.index) & set(leader.values.index))
                at = (key[0], key[2], e.label)
                lo, hi = _interval(ci, at, col)
                rec: dict[str, Any] = {
                    **dict(zip(GROUP_KEY, key, strict=True)), "metric": metric, "rank": rank,
                    "scheduler": e.name, "form": e.form, "label": e.label,
                    "value": float(e.values.mean()), "value_lo": lo, "value_hi": hi,
                    "n_seeds": len(e.values), "leader": leader.name,
                    "margin": np.nan, "lo": np.nan, "hi": np.nan, "p": np.nan,
                    "p_holm": np.nan, "verdict": "leader" if e is leader else "tie",
                    "focus_margin": np.nan, "focus_lo": np.nan, "focus_hi": np.nan,
                }  # fmt: skip
                if e is not leader:
                    a = leader.values.loc[seeds].to_numpy(dtype=float)
                    b = e.values.loc[seeds].to_numpy(dtype=float)
                    # the leader's margin over the entry, positive: the leader is ahead
                    c = paired(a, b) if lower else paired(b, a)
                    rec |= {"margin": c.margin, "lo": c.lo, "hi": c.hi, "p": c.p}
                    if e.name == FOCUS:  # the protocol's own cell: TOPAS against the leader
                        f = paired(b, a) if lower else paired(a, b)
                        rec |= {"focus_margin": f.margin, "focus_lo": f.lo, "focus_hi": f.hi}
                    pair = (*key, metric, leader.name if e.name == FOCUS else e.name)
                    if FOCUS in (leader.name, e.name) and pair in protocol:
                        p_adj, word = protocol[pair]
                        rec["p_holm"] = p_adj
                        rec["verdict"] = "tie" if word == "tie" else "loss"
                    else:
                        families["jct" if lower else "goodput"].append((len(records), c))
                records.append(rec)
    for cells in families.values():
        judged = verdicts([c for _, c in cells])
        for (i, c), (p_adj, word) in zip(cells, judged, strict=True):
            records[i]["p_holm"] = p_adj
            # the leader has the best mean, so a verdict is never a win over it
            records[i]["verdict"] = "loss" if word != "tie" and c.margin > 0 else "tie"
    return pd.DataFrame(records, columns=COLUMNS)


def _protocol(table: pd.DataFrame) -> dict[tuple[Any, ...], tuple[float, str]]:
    """The protocol's verdict of TOPAS against each other scheduler, by (group key, metric,
    other's name): (Holm-adjusted p, win / tie / loss)."""
    if table.empty or "other_name" not in table:
        return {}
    cols = [*GROUP_KEY, "metric", "other_name"]
    return {tuple(k): (float(p), str(v))
            for k, p, v in zip(table[cols].itertuples(index=False), table["p_holm"],
                               table["verdict"], strict=True)}  # fmt: skip


def sentence(board: pd.DataFrame, metric: str) -> str:
    """One sentence: who leads one setting on `metric`, and TOPAS's standing against it."""
    b = board[board["metric"] == metric].sort_values("rank")
    if b.empty:
        return ""
    label, unit = METRICS[metric][2:]
    lead = b.iloc[0]
    n = len(b) - 1
    value = _value(float(lead["value"]), unit)
    if lead["scheduler"] == FOCUS:
        if n == 0:
            return f"TOPAS alone: {label} {value}."
        wins = int((b["verdict"] == "loss").sum())
        second = b.iloc[1]
        tied = "a tie" if second["verdict"] == "tie" else "a win for TOPAS"
        standing = (f"ahead of all {n} others beyond the interval" if wins == n else
                    f"ahead of {wins} of the {n} others beyond the interval, tied with "
                    f"{n - wins}")  # fmt: skip
        return (f"TOPAS leads on {label} ({value}), {standing}; the runner-up, "
                f"{second['scheduler']}, trails by {_pct(second)} ({tied}).")  # fmt: skip
    topas = b[b["scheduler"] == FOCUS]
    if topas.empty:
        return f"{lead['scheduler']} leads on {label} ({value}); TOPAS did not run here."
    t = topas.iloc[0]
    word = "a loss for TOPAS" if t["verdict"] == "loss" else "a tie"
    return (
        f"{lead['scheduler']} leads on {label} ({value}); TOPAS ranks {int(t['rank'])} of "
        f"{n + 1}, its margin over {lead['scheduler']} "
        f"{_pct(t, 'focus_')} ({word})."
    )


def _value(v: float, unit: str) -> str:
    return f"{v:,.1f} s" if unit == "s" else f"{v:.4f} {unit}"


def _pct(r: pd.Series, prefix: str = "") -> str:
    m = r[f"{prefix}margin"]
    return "n/a" if pd.isna(m) else pct(float(m), float(r[f"{prefix}lo"]), float(r[f"{prefix}hi"]))
