"""Summary tables of a results tree: one row per (group, scheduler), as Markdown and CSV.

A group is every identity field except scheduler and seed (workload, its parameters, rate,
preset, KV budget, engine settings, task count). Within a group each statistic is computed per
run from its files, then averaged over seeds, with a 95% percentile-bootstrap interval over
seeds (`bootstrap`, seeded, deterministic). Only the seeds every scheduler of the group has
are used, so schedulers are compared on the same samples; a group whose schedulers have
different seeds gets a note.

Reductions are `1 - scheduler / best baseline`, the best baseline chosen per metric (mean and
p99 JCT) as the lowest among `BASELINES` in the group, with a paired bootstrap interval. The
paper's reductions (DESIGN section 5, TOPAS vs the best baseline) stand beside TOPAS's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench.analysis.bootstrap import mean_ci, reduction_ci
from topas_bench.analysis.collect import Collection
from topas_bench.schedulers.registry import BASELINES, SCHEDULERS
from topas_bench.workloads.registry import WORKLOADS

#: TOPAS's mean / p99 JCT reduction vs the best baseline in the paper (DESIGN section 5).
PAPER_REDUCTIONS: dict[str, tuple[float, float]] = {
    "chain3": (0.275, 0.317),
    "dag4": (0.398, 0.494),
    "dag10-wide": (0.277, 0.308),
    "metagpt-sop": (0.098, 0.045),
    "metagpt-tl": (0.220, 0.266),
}
JCT = ("mean_jct_s", "p50_jct_s", "p90_jct_s", "p99_jct_s")
OTHER = ("throughput_tps", "prefix_hit_rate", "preemptions", "decision_p50_ms", "decision_p99_ms")
COMPARED = {"mean": "mean_jct_s", "p99": "p99_jct_s"}
GROUP_COLUMNS = (
    "group", "group_label", "workload", "preset", "kv_budget_tokens", "rate_per_s", "load",
    "num_tasks",
)  # fmt: skip


@dataclass
class Report:
    root: Path
    rows: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def build_report(coll: Collection) -> Report:
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    for _, g in _ordered_groups(coll.runs):
        seeds = _common_seeds(g)
        if any(set(s) != set(seeds) for s in g.groupby("scheduler")["seed"].apply(list)):
            have = "; ".join(
                f"{name}: {_seed_list(s)}" for name, s in g.groupby("scheduler")["seed"]
            )
            how = (
                f"compared on the common seeds {_seed_list(seeds)}"
                if seeds
                else "no seed is common to all, so each row uses its own and nothing is compared"
            )
            notes.append(
                f"{g.iloc[0]['workload']} ({g.iloc[0]['group_label']}): schedulers have "
                f"different seeds ({have}); {how}"
            )
        if seeds:
            g = g[g["seed"].isin(seeds)]
        rows += _group_rows(g.sort_values("seed"), compared=bool(seeds))
    return Report(coll.root, pd.DataFrame(rows), notes, list(coll.problems))


def _ordered_groups(runs: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    order = {w: i for i, w in enumerate(WORKLOADS.names())}
    groups = list(runs.groupby("group", sort=False))

    def key(item: tuple[Any, pd.DataFrame]) -> tuple[Any, ...]:
        r = item[1].iloc[0]
        return (order.get(r["workload"], len(order)), r["workload"], r["preset"],
                r["kv_budget_tokens"], r["num_tasks"], r["rate_per_s"], item[0])  # fmt: skip

    return [(str(k), g) for k, g in sorted(groups, key=key)]


def _common_seeds(g: pd.DataFrame) -> list[int]:
    sets = [set(s) for _, s in g.groupby("scheduler")["seed"]]
    return sorted(set.intersection(*sets))


def _seed_list(seeds: Any) -> str:
    return ",".join(str(int(s)) for s in sorted(seeds)) or "none"


def _scheduler_order(label: str) -> tuple[int, str]:
    names = SCHEDULERS.names()
    base = label.split("[", 1)[0]
    return (names.index(base) if base in names else len(names), label)


def _group_rows(g: pd.DataFrame, compared: bool) -> list[dict[str, Any]]:
    first = g.iloc[0]
    per: dict[str, pd.DataFrame] = {str(s): d for s, d in g.groupby("scheduler")}
    labels = sorted(per, key=_scheduler_order)
    baselines = [s for s in labels if per[s].iloc[0]["scheduler_name"] in BASELINES]
    best: dict[str, str] = {}  # metric -> best baseline (none when nothing is compared)
    for m, col in COMPARED.items():
        means = {s: float(per[s][col].to_numpy().mean()) for s in baselines if compared}
        if means:
            best[m] = min(means, key=lambda s: (means[s], s))
    paper = PAPER_REDUCTIONS.get(str(first["workload"]))
    out = []
    for s in labels:
        d = per[s]
        row: dict[str, Any] = {c: first[c] for c in GROUP_COLUMNS}
        row |= {"scheduler": s, "seeds": _seed_list(d["seed"]), "n_seeds": len(d)}
        for col in JCT:
            row[col], row[f"{col}_lo"], row[f"{col}_hi"] = mean_ci(d[col].to_numpy())
        for col in OTHER:
            row[col] = float(d[col].mean())
        for m, col in COMPARED.items():
            ref = best.get(m)
            row[f"best_baseline_{m}"] = ref or ""
            r = (math.nan,) * 3
            if ref is not None and s not in baselines:
                r = reduction_ci(d[col].to_numpy(), per[ref][col].to_numpy())
            row[f"reduction_{m}"], row[f"reduction_{m}_lo"], row[f"reduction_{m}_hi"] = r
            is_topas = d.iloc[0]["scheduler_name"] == "topas" and s == "topas"
            row[f"paper_reduction_{m}"] = (
                paper[0 if m == "mean" else 1] if paper and is_topas else math.nan
            )
        out.append(row)
    return out


# -- rendering ---------------------------------------------------------------------------------


def _ci(row: pd.Series, col: str, fmt: str = "{:.1f}") -> str:
    v, lo, hi = row[col], row[f"{col}_lo"], row[f"{col}_hi"]
    if _nan(v):
        return "-"
    if row["n_seeds"] < 2:
        return fmt.format(v)
    return f"{fmt.format(v)} [{fmt.format(lo)}, {fmt.format(hi)}]"


def _pct(v: Any) -> str:
    return "-" if _nan(v) else f"{100 * v:.1f}%"


def _nan(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def _reduction(row: pd.Series, m: str) -> str:
    v = row[f"reduction_{m}"]
    if _nan(v):
        return "-"
    if row["n_seeds"] < 2:
        return _pct(v)
    return f"{_pct(v)} [{_pct(row[f'reduction_{m}_lo'])}, {_pct(row[f'reduction_{m}_hi'])}]"


def to_markdown(rep: Report) -> str:
    lines = [
        "# topas-bench report",
        "",
        f"Results: `{rep.root}`: {rep.rows.groupby('group').ngroups} groups, "
        f"{len(rep.rows)} scheduler rows; {len(rep.problems)} run director"
        f"{'y' if len(rep.problems) == 1 else 'ies'} left out.",
        "",
        "JCT in seconds: the mean over seeds of each run's statistic, with a 95% bootstrap "
        "interval over seeds in brackets (10,000 resamples, seed 0). Reductions: "
        "1 - scheduler / best baseline, the best baseline chosen per metric among "
        f"{', '.join(BASELINES)}; positive = better than the best baseline.",
        "",
    ]
    lines += _summary(rep.rows)
    for workload, w in rep.rows.groupby("workload", sort=False):
        lines += [f"## {workload}", ""]
        for _, g in w.groupby("group", sort=False):
            lines += _group_table(g)
    if rep.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in rep.notes] + [""]
    if rep.problems:
        lines += ["## Left out", ""] + [f"- {p}" for p in rep.problems] + [""]
    return "\n".join(lines)


def _summary(rows: pd.DataFrame) -> list[str]:
    t = rows[rows["scheduler"] == "topas"]
    if t.empty:
        return []
    out = [
        "## TOPAS vs the best baseline",
        "",
        "| workload | setting | mean: best baseline | mean: reduction | paper | "
        "p99: best baseline | p99: reduction | paper |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for _, r in t.iterrows():
        out.append(
            f"| {r['workload']} | {r['group_label']} | {r['best_baseline_mean'] or '-'} | "
            f"{_reduction(r, 'mean')} | {_pct(r['paper_reduction_mean'])} | "
            f"{r['best_baseline_p99'] or '-'} | {_reduction(r, 'p99')} | "
            f"{_pct(r['paper_reduction_p99'])} |"
        )
    return [*out, ""]


def _group_table(g: pd.DataFrame) -> list[str]:
    first = g.iloc[0]
    seeds = first["seeds"]
    out = [
        f"### {first['group_label']}, seeds {seeds}",
        "",
        "| scheduler | mean JCT | p50 | p90 | p99 | tasks/s | prefix hit | preempt | "
        "decision p50 / p99 ms | mean vs best | p99 vs best |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in g.iterrows():
        dec = "-" if _nan(r["decision_p50_ms"]) else (
            f"{r['decision_p50_ms']:.3f} / {r['decision_p99_ms']:.3f}"
        )  # fmt: skip
        out.append(
            f"| {r['scheduler']} | {_ci(r, 'mean_jct_s')} | {_ci(r, 'p50_jct_s')} | "
            f"{_ci(r, 'p90_jct_s')} | {_ci(r, 'p99_jct_s')} | {r['throughput_tps']:.4f} | "
            f"{_pct(r['prefix_hit_rate'])} | {r['preemptions']:.0f} | {dec} | "
            f"{_reduction(r, 'mean')} | {_reduction(r, 'p99')} |"
        )
    if first["best_baseline_mean"]:
        out.append("")
        out.append(
            f"Best baseline: mean JCT `{first['best_baseline_mean']}`, "
            f"p99 JCT `{first['best_baseline_p99']}`."
        )
    return [*out, ""]


def write_report(rep: Report, out: Path) -> list[Path]:
    """`out/report.md` and `out/report.csv` (one row per group and scheduler)."""
    out.mkdir(parents=True, exist_ok=True)
    md, csv = out / "report.md", out / "report.csv"
    md.write_text(to_markdown(rep) + "\n")
    rep.rows.drop(columns=["group"]).to_csv(csv, index=False, float_format="%.6g")
    return [md, csv]
