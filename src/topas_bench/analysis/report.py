"""Summary tables of a results tree: one row per (group, scheduler), as Markdown and CSV.

A group is every identity field except scheduler and seed (workload, its parameters, rate,
preset, KV budget, engine settings, task count). Within a group each statistic is computed per
run from its files, then averaged over seeds, with a 95% percentile-bootstrap interval over
seeds (`bootstrap`, seeded, deterministic). Only the seeds every scheduler of the group has
are used, so schedulers are compared on the same samples; a group whose schedulers have
different seeds gets a note.

Reductions are `1 - scheduler / best baseline`, the best baseline chosen per metric (mean and
p99 JCT) as the lowest among `BASELINES` in the group, with a paired bootstrap interval; every
row has one (the best baseline's own is 0). Beside it, `reduction_any` is the same against the
best of every scheduler in the group that is not TOPAS or an ablation of it (the paper's
baselines and the peers it left out: `best_any`). The paper's reductions (docs/design.md section
5, TOPAS vs the best baseline) stand beside TOPAS's only for runs made in the paper's setting
(`paper_setting`). Request-level metrics (TTFT, TPOT, ITL, queueing, latency, goodput under the
collection's SLO) and per-stage latencies come with every group (`metrics`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench.analysis.bootstrap import mean_ci, reduction_ci
from topas_bench.analysis.collect import LENGTH_KEYS, Collection
from topas_bench.analysis.metrics import Slo
from topas_bench.analysis.protocol import (
    COMPACT,
    GROUP_KEY,
    Tuned,
    levers,
    tuning_table,
    versus,
    with_variants,
)
from topas_bench.errors import TopasError
from topas_bench.schedulers.registry import ABLATIONS, BASELINES, SCHEDULERS
from topas_bench.workloads.registry import DEFAULT_LOAD, OUTPUT_SCALE, WORKLOADS

#: TOPAS's mean / p99 JCT reduction vs the best baseline in the paper (docs/design.md section 5).
PAPER_REDUCTIONS: dict[str, tuple[float, float]] = {
    "chain3": (0.275, 0.317),
    "dag4": (0.398, 0.494),
    "dag10-wide": (0.277, 0.308),
    "metagpt-sop": (0.098, 0.045),
    "metagpt-tl": (0.220, 0.266),
}
#: The setting our runs stand for the paper's in: its GPU and model at the derived KV budget,
#: the workload's default parameters and rate (load 0.8), the simulator's default engine.
PAPER_PRESET, PAPER_KV_BUDGET = "a100-qwen32b", 18_692
JCT = ("mean_jct_s", "p50_jct_s", "p90_jct_s", "p99_jct_s")
WITH_CI = (*JCT, "goodput_tps", "ttft_p99_s")
REQUESTS = (
    "ttft_mean_s", "tpot_mean_ms", "tpot_p99_ms", "itl_mean_ms", "queue_mean_s",
    "queue_p99_s", "latency_mean_s", "latency_p99_s", "request_tps", "output_tok_s",
)  # fmt: skip
OTHER = (
    "throughput_tps", "slo_attainment", "prefix_hit_rate", "preemptions", "decision_p50_ms",
    "decision_p99_ms", *REQUESTS,
)  # fmt: skip
COMPARED = {"mean": "mean_jct_s", "p99": "p99_jct_s"}
GROUP_COLUMNS = (
    "group", "group_label", "workload", "engine", "preset", "kv_budget_tokens", "rate_per_s",
    "load", "num_tasks", "max_tokens",
)  # fmt: skip
STAGE_COLUMNS = ("calls", "mean_latency_s", "p99_latency_s", "mean_queue_s", "mean_ttft_s")


@dataclass
class Report:
    root: Path
    rows: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: per group, scheduler and stage kind: `STAGE_COLUMNS` averaged over the compared seeds
    stages: pd.DataFrame = field(default_factory=pd.DataFrame)
    slo: Slo = field(default_factory=Slo)
    #: the protocol (`protocol`): the focus against every other scheduler, against each of its
    #: ablations, and each tuned scheduler against its defaults; one row per group, pair, metric
    focus: str = "topas"
    verdicts: pd.DataFrame = field(default_factory=pd.DataFrame)
    levers: pd.DataFrame = field(default_factory=pd.DataFrame)
    tuning: pd.DataFrame = field(default_factory=pd.DataFrame)
    #: one row per run compared (`protocol.COMPACT`'s columns): what the tables are made of
    runs: pd.DataFrame = field(default_factory=pd.DataFrame)


def paper_setting(group_key: str, load: float) -> bool:
    """Whether a group (its identity JSON, `collect.WITHIN_GROUP` left out, and its load) was
    run in the paper's setting, so that the paper's reductions may stand beside it: load 0.8,
    or without a load the workload's default rate. Either length setting (`max_tokens`, which
    the paper does not state) counts; the group's label says which one it used."""
    g = json.loads(group_key)
    name = g["workload"]
    if name not in PAPER_REDUCTIONS or name not in WORKLOADS:
        return False
    if math.isnan(load):
        at_default = math.isclose(g["rate_per_s"], WORKLOADS.get(name).default_rate_per_s)
    else:
        at_default = math.isclose(load, DEFAULT_LOAD)
    return bool(
        at_default and g.get("engine", "sim") == "sim" and g["preset"] == PAPER_PRESET
        and g["kv_budget_tokens"] == PAPER_KV_BUDGET
        and not {k: v for k, v in g["workload_params"].items() if k not in LENGTH_KEYS}
        and not g["engine_params"]
    )  # fmt: skip


def build_report(coll: Collection, focus: str = "topas", tuned: Tuned | None = None) -> Report:
    """The summary rows per group and scheduler, and the protocol's tables for `focus` (its
    ablations: the registered ones present; `tuned`: what marks a run as a tuned variant)."""
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    kept: list[pd.DataFrame] = []
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
        kept.append(g)
        rows += _group_rows(g.sort_values("seed"), compared=bool(seeds))
    runs = pd.concat(kept) if kept else coll.runs
    compact = compact_runs(runs, tuned)
    return Report(
        coll.root, pd.DataFrame(rows), notes, list(coll.problems), _stage_rows(runs, coll.stages),
        coll.slo, focus, versus(compact, focus, tuned), levers(compact, ABLATIONS, focus, tuned),
        tuning_table(compact, tuned), compact,
    )  # fmt: skip


def compact_runs(runs: pd.DataFrame, tuned: Tuned | None = None) -> pd.DataFrame:
    """`protocol.COMPACT`'s columns of a collection's runs; the output scale and the KV
    budget as a multiple of the working set are read from each group's identity, the variant
    (default, tuned, custom) from `tuned`."""
    if runs.empty:
        return pd.DataFrame(columns=list(COMPACT))
    extra: dict[str, tuple[float, float]] = {}
    for key in runs["group"].unique():
        ident = json.loads(str(key))
        params = ident.get("workload_params", {})
        budget = int(ident.get("kv_budget_tokens", 0))
        extra[str(key)] = (float(params.get(OUTPUT_SCALE, 1.0)), kv_multiple(ident, budget))
    scale = runs["group"].map(lambda k: extra[str(k)][0])
    multiple = runs["group"].map(lambda k: extra[str(k)][1])
    out = with_variants(runs.assign(output_scale=scale, kv_multiple=multiple), tuned)
    return out[list(COMPACT)].sort_values([*GROUP_KEY, "scheduler", "seed"]).reset_index(drop=True)


def kv_multiple(ident: dict[str, Any], budget: int) -> float:
    """A KV budget as a multiple of its workload's agent-prefix working set (`units`);
    NaN when the workload cannot be read (e.g. a trace file that is gone)."""
    from topas_bench.units import working_set

    try:
        ws = working_set(str(ident["workload"]), dict(ident.get("workload_params", {})))
    except (TopasError, KeyError, OSError):
        return math.nan
    return ws.multiple_of(budget)


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


def scheduler_order(label: str) -> tuple[int, str]:
    names = SCHEDULERS.names()
    base = label.split("[", 1)[0]
    return (names.index(base) if base in names else len(names), label)


def _group_rows(g: pd.DataFrame, compared: bool) -> list[dict[str, Any]]:
    first = g.iloc[0]
    per: dict[str, pd.DataFrame] = {str(s): d for s, d in g.groupby("scheduler")}
    labels = sorted(per, key=scheduler_order)
    baselines = [s for s in labels if per[s].iloc[0]["scheduler_name"] in BASELINES]
    others = [s for s in labels if not str(per[s].iloc[0]["scheduler_name"]).startswith("topas")]
    best: dict[str, str] = {}  # metric -> best baseline (none when nothing is compared)
    best_any: dict[str, str] = {}  # metric -> best non-TOPAS scheduler
    for m, col in COMPARED.items():
        means = {s: float(per[s][col].to_numpy().mean()) for s in others if compared}
        base = {s: v for s, v in means.items() if s in baselines}
        if base:
            best[m] = min(base, key=lambda s: (base[s], s))
        if means:
            best_any[m] = min(means, key=lambda s: (means[s], s))
    in_setting = paper_setting(first["group"], float(first["load"]))
    paper = PAPER_REDUCTIONS.get(str(first["workload"])) if in_setting else None
    out = []
    for s in labels:
        d = per[s]
        row: dict[str, Any] = {c: first[c] for c in GROUP_COLUMNS}
        row |= {"scheduler": s, "seeds": _seed_list(d["seed"]), "n_seeds": len(d),
                "code": "; ".join(sorted(set(d["code"])))}  # fmt: skip
        for col in WITH_CI:
            row[col], row[f"{col}_lo"], row[f"{col}_hi"] = mean_ci(d[col].to_numpy())
        for col in OTHER:
            row[col] = float(d[col].mean())
        for m, col in COMPARED.items():
            ref = best.get(m)
            row[f"best_baseline_{m}"] = ref or ""
            r = (math.nan,) * 3
            if ref is not None:
                r = reduction_ci(d[col].to_numpy(), per[ref][col].to_numpy())
            row[f"reduction_{m}"], row[f"reduction_{m}_lo"], row[f"reduction_{m}_hi"] = r
            ref_any = best_any.get(m)
            row[f"best_any_{m}"] = ref_any or ""
            r = (math.nan,) * 3
            if ref_any is not None:
                r = reduction_ci(d[col].to_numpy(), per[ref_any][col].to_numpy())
            row[f"reduction_any_{m}"], row[f"reduction_any_{m}_lo"] = r[0], r[1]
            row[f"reduction_any_{m}_hi"] = r[2]
            is_topas = d.iloc[0]["scheduler_name"] == "topas" and s == "topas"
            row[f"paper_reduction_{m}"] = (
                paper[0 if m == "mean" else 1] if paper and is_topas else math.nan
            )
        out.append(row)
    return out


def _stage_rows(runs: pd.DataFrame, stages: pd.DataFrame) -> pd.DataFrame:
    if stages.empty or runs.empty:
        return pd.DataFrame(columns=["group", "scheduler", "kind", *STAGE_COLUMNS])
    joined = stages.merge(runs[["path", "group", "scheduler"]], on="path")
    return (
        joined.groupby(["group", "scheduler", "kind"], sort=False)[list(STAGE_COLUMNS)]
        .mean()
        .reset_index()
    )
