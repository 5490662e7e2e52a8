"""Cluster results: JCT against replicas for every router x scheduler (docs/cluster.md).

`cluster_table` has one row per (workload, router, replicas, scheduler) of a tree's cluster
groups (runs with `replicas` in their engine parameters), from the report's rows (means over
seeds with 95% bootstrap intervals, reductions against the best baseline) and the runs' own
per-replica summaries (`run.json`'s `cluster.per_replica`): the busiest replica's share of the
requests and the spread of busy fractions, averaged over seeds. `cluster_figure` draws mean
JCT against replicas, one panel per router with a line per scheduler, and a last panel with
TOPAS's mean-JCT reduction against the best baseline per router.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from topas_bench.analysis.collect import Collection
from topas_bench.analysis.plotting import PAGE_WIDTH_IN, suptitle
from topas_bench.analysis.report import Report, scheduler_order
from topas_bench.results import read_meta

ROUTER_ORDER = ("round-robin", "least-load", "cache-aware", "agent-affinity", "workflow-aware")
COLUMNS = (
    "workload", "router", "replicas", "scheduler", "n_seeds", "mean_jct_s", "mean_jct_s_lo",
    "mean_jct_s_hi", "p99_jct_s", "p99_jct_s_lo", "p99_jct_s_hi", "best_baseline_mean",
    "reduction_mean", "reduction_mean_lo", "reduction_mean_hi", "reduction_p99",
    "prefix_hit_rate", "busiest_share", "busy_min", "busy_max",
)  # fmt: skip


def _cluster_of(group: str) -> dict[str, Any] | None:
    params = json.loads(group).get("engine_params", {})
    return params if "replicas" in params and "router" in params else None


def _spread(path: str) -> dict[str, float]:
    rows = read_meta(Path(path)).get("cluster", {}).get("per_replica", [])
    reqs = [float(r["requests"]) for r in rows]
    busy = [float(r["busy_fraction"]) for r in rows if r["busy_fraction"] == r["busy_fraction"]]
    return {
        "busiest_share": max(reqs) / sum(reqs) if reqs and sum(reqs) else np.nan,
        "busy_min": min(busy) if busy else np.nan,
        "busy_max": max(busy) if busy else np.nan,
    }


def cluster_table(coll: Collection, rep: Report) -> pd.DataFrame:
    rows = rep.rows
    if rows.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    clusters = rows["group"].map(_cluster_of)
    picked = rows[clusters.notna()]
    if picked.empty:
        return pd.DataFrame(columns=list(COLUMNS))
    runs = coll.runs[coll.runs["group"].isin(set(picked["group"]))]
    spread = pd.DataFrame([{"group": g, "scheduler": s, **_spread(p)}
                           for g, s, p in runs[["group", "scheduler", "path"]].itertuples(
                               index=False)])  # fmt: skip
    spread = spread.groupby(["group", "scheduler"], as_index=False).mean()
    out = picked.merge(spread, on=["group", "scheduler"], how="left")
    setting = {g: _cluster_of(g) or {} for g in out["group"].unique()}
    out["router"] = out["group"].map(lambda g: str(setting[g]["router"]))
    out["replicas"] = out["group"].map(lambda g: int(setting[g]["replicas"]))
    out["_r"] = out["router"].map(lambda r: ROUTER_ORDER.index(r) if r in ROUTER_ORDER else 99)
    out["_s"] = out["scheduler"].map(scheduler_order)
    out = out.sort_values(["workload", "_r", "router", "replicas", "_s"]).reset_index(drop=True)
    return out[list(COLUMNS)]


def cluster_figure(plt: Any, table: pd.DataFrame, palette: dict[str, Any]) -> Any:
    """Mean JCT against replicas per router (one panel each), TOPAS's reduction in the last."""
    routers = list(dict.fromkeys(table["router"]))
    workload = ", ".join(dict.fromkeys(table["workload"]))
    cols = min(2, len(routers) + 1)
    nrows = -(-(len(routers) + 1) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(PAGE_WIDTH_IN, 3.4 * nrows + 0.8),
                             squeeze=False)  # fmt: skip
    flat = list(axes.flat)
    top = float(table["mean_jct_s_hi"].max()) * 1.05
    ticks = sorted(table["replicas"].unique())
    for ax, router in zip(flat, routers, strict=False):
        t = table[table["router"] == router]
        for s, d in t.groupby("scheduler", sort=False):
            d = d.sort_values("replicas")
            y = d["mean_jct_s"].to_numpy()
            err = np.vstack([y - d["mean_jct_s_lo"].to_numpy(), d["mean_jct_s_hi"].to_numpy() - y])
            width = 1.6 if s == "topas" else 1.0
            ax.errorbar(d["replicas"], y, yerr=err, label=s, color=palette.get(s), marker="o",
                        markersize=3.5, linewidth=width, capsize=2)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(x) for x in ticks])
        ax.set_ylim(0, top)
        ax.set_title(f"router {router}", fontsize=10)
        ax.set_xlabel("replicas")
        ax.set_ylabel("mean JCT (s)")
    red = flat[len(routers)]
    topas = table[table["scheduler"] == "topas"]
    for router in routers:
        d = topas[topas["router"] == router].sort_values("replicas")
        if d.empty:
            continue
        y = 100 * d["reduction_mean"].to_numpy()
        err = 100 * np.vstack([d["reduction_mean"] - d["reduction_mean_lo"],
                               d["reduction_mean_hi"] - d["reduction_mean"]])  # fmt: skip
        red.errorbar(d["replicas"], y, yerr=err, label=router, marker="o", markersize=3.5,
                     capsize=2)  # fmt: skip
    red.axhline(0, color="black", linewidth=0.8)
    red.set_xscale("log", base=2)
    red.set_xticks(ticks, [str(x) for x in ticks])
    red.set_title("TOPAS vs the best baseline", fontsize=10)
    red.set_xlabel("replicas")
    red.set_ylabel("mean JCT reduction (%)")
    red.legend(fontsize=8)
    for ax in flat[len(routers) + 1 :]:
        ax.set_visible(False)
    flat[0].legend(fontsize=8, loc="upper left")
    seeds = int(table["n_seeds"].min())
    suptitle(
        fig,
        f"{workload}: cluster mean JCT against replicas (95% bootstrap intervals over {seeds} "
        f"seed{'s' * (seeds != 1)})",
        fontsize=10,
    )
    return fig
