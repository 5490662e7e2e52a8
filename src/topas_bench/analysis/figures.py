"""Figures of a results tree, each written as PNG and SVG (docs/design.md section 8).

- `jct_relative`: mean and p99 JCT of each scheduler divided by the best baseline's, per
  workload's main group (the one with the most schedulers, then the load nearest 0.8), with
  paired 95% bootstrap intervals over the seeds (labelled with their number);
- `jct_relative_all`: the same for TOPAS and every scheduler that is not one of its ablations,
  divided by the best of them all (the paper's baselines and the peers), when the tree has
  peers;
- `jct_vs_load`: mean and p99 JCT and goodput against load, one panel per workload and metric;
- `ablation`: TOPAS and its ablations, mean and p99 JCT in seconds from zero, with intervals;
- `requests`: p99 TTFT, mean TPOT, mean queueing delay and goodput per scheduler;
- `jct_cdf_<workload>`: JCT CDF per scheduler (tasks pooled over seeds), one panel per group;
- `stage_latency_<workload>`: mean latency per stage kind and scheduler (main group);
- `timeline_<workload>`: TOPAS against Parrot over one run (`timeline`);
- `cluster_jct_vs_replicas` (and `cluster.csv`): for trees with simulated clusters, mean JCT
  against replicas per router x scheduler (`cluster`).

Every number comes from the report rows or the run files; nothing is recomputed differently.
Output is deterministic (fixed SVG ids, no timestamps) so regenerated figures diff cleanly.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from topas_bench.analysis.bootstrap import LEVEL, N_BOOT
from topas_bench.analysis.cluster import cluster_figure, cluster_table
from topas_bench.analysis.collect import Collection
from topas_bench.analysis.report import Report, scheduler_order
from topas_bench.analysis.timeline import timeline_figure
from topas_bench.errors import TopasError
from topas_bench.schedulers.registry import ABLATIONS, BASELINES, PEERS, SCHEDULERS

MAIN = (*BASELINES, "topas")
#: `jct_relative_all`: every scheduler but TOPAS's ablations.
EVERY = tuple(s for s in SCHEDULERS.names() if s not in ABLATIONS)
METRICS = (("mean_jct_s", "mean"), ("p99_jct_s", "p99"))


def pyplot() -> Any:
    """matplotlib's pyplot, headless, with the figures' theme (a one-line error without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        sns = _sns()
    except ImportError:
        raise TopasError(
            "figures need matplotlib and seaborn: pip install 'topas-bench[figures]'"
        ) from None
    sns.set_theme(style="whitegrid", context="notebook")
    plt.rcParams.update({"svg.hashsalt": "topas-bench", "svg.fonttype": "none"})
    return plt


def _sns() -> Any:
    return importlib.import_module("seaborn")  # untyped; imported only for figures


def write_figures(coll: Collection, rep: Report, out: Path) -> list[Path]:
    """Every figure the tree supports, into `out`; returns the files written."""
    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        for ext, meta in (("png", {"Software": None}), ("svg", {"Date": None})):
            path = out / f"{name}.{ext}"
            fig.savefig(path, dpi=120, metadata=meta)
            written.append(path)
        plt.close(fig)

    main = _main_groups(rep.rows)
    palette = palette_for(rep.rows["scheduler"].unique())
    save(_relative(plt, main, palette), "jct_relative")
    if main["scheduler"].isin(PEERS).any():
        save(_relative(plt, main, palette, against="any_"), "jct_relative_all")
    curves = _load_curves(rep.rows)
    if not curves.empty:
        save(_vs_load(plt, curves, palette), "jct_vs_load")
    abl = _ablations(rep.rows, main)
    if not abl.empty:
        save(_ablation_bars(plt, abl, palette), "ablation")
    if (fig := _requests(plt, main, palette)) is not None:
        save(fig, "requests")
    for workload, groups in rep.rows.groupby("workload", sort=False):
        save(_cdf(plt, coll, groups, palette), f"jct_cdf_{workload}")
    for _, row in main.drop_duplicates("workload").iterrows():
        stages = rep.stages[rep.stages["group"] == row["group"]]
        if not stages.empty:
            save(_stage_bars(plt, stages, row, palette), f"stage_latency_{row['workload']}")
        fig = timeline_figure(plt, coll, rep.rows, str(row["group"]), palette)
        if fig is not None:
            save(fig, f"timeline_{row['workload']}")
    clusters = cluster_table(coll, rep)  # docs/cluster.md: JCT against replicas per router
    if not clusters.empty:
        save(cluster_figure(plt, clusters, palette), "cluster_jct_vs_replicas")
        clusters.to_csv(out / "cluster.csv", index=False, float_format="%.6g")
        written.append(out / "cluster.csv")
    return written


#: Fixed colours, so a scheduler looks the same in every figure; TOPAS stands out in red.
COLOURS = {
    "fcfs": "tab:gray", "lpm": "tab:orange", "spf": "tab:green", "parrot": "tab:blue",
    "autellix": "tab:purple", "topas": "tab:red",
}  # fmt: skip
OTHERS = (
    "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "black", "gold", "navy", "teal", "lime",
    "salmon", "darkgreen", "slateblue", "sienna", "orchid", "khaki", "steelblue",
)  # fmt: skip


def palette_for(labels: Any) -> dict[str, Any]:
    rest = sorted(s for s in labels if s not in COLOURS)
    return COLOURS | {s: OTHERS[i % len(OTHERS)] for i, s in enumerate(rest)}


def _main_groups(rows: pd.DataFrame) -> pd.DataFrame:
    """Per workload, the rows of its main group."""
    picks = []
    for _, w in rows.groupby("workload", sort=False):
        sizes = w.groupby("group", sort=False).agg(n=("scheduler", "size"), load=("load", "first"))
        sizes["dist"] = (sizes["load"].fillna(0.8) - 0.8).abs()
        best = sizes.sort_values(["n", "dist"], ascending=[False, True]).index[0]
        picks.append(w[w["group"] == best])
    return pd.concat(picks) if picks else pd.DataFrame()


def _seeds_note(rows: pd.DataFrame) -> str:
    n = sorted({int(x) for x in rows["n_seeds"]})
    seeds = "/".join(str(x) for x in n)
    return (
        f"error bars: {100 * LEVEL:.0f}% percentile-bootstrap interval over {seeds} seeds "
        f"({N_BOOT:,} resamples)"
    )


def _err(y: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    spread: np.ndarray = np.nan_to_num(np.vstack([y - lo, hi - y]).clip(min=0))
    return spread


def _relative(plt: Any, main: pd.DataFrame, palette: dict[str, Any], against: str = "") -> Any:
    """Each scheduler's JCT over the best baseline's (`against=""`: the paper's schedulers) or
    over the best of all (`"any_"`: every scheduler but TOPAS's ablations)."""
    rows = main[main["scheduler"].isin(EVERY if against else MAIN)]
    what = "best of all" if against else "best baseline"
    workloads = list(dict.fromkeys(rows["workload"]))
    width = max(3.4, 0.32 * rows.groupby("workload")["scheduler"].nunique().max())
    fig, axes = plt.subplots(2, len(workloads), figsize=(width * len(workloads), 7.2),
                             squeeze=False, sharey="row")  # fmt: skip
    for j, w in enumerate(workloads):
        d = rows[rows["workload"] == w]
        for i, (_, m) in enumerate(METRICS):
            ax = axes[i][j]
            y = 1.0 - d[f"reduction_{against}{m}"].to_numpy(dtype=float)
            lo = 1.0 - d[f"reduction_{against}{m}_hi"].to_numpy(dtype=float)
            hi = 1.0 - d[f"reduction_{against}{m}_lo"].to_numpy(dtype=float)
            # points, not bars: a ratio's axis need not start at zero, a bar's must
            spread = _err(y, lo, hi)
            for x, sched in enumerate(d["scheduler"]):
                ax.errorbar([x], [y[x]], yerr=spread[:, x : x + 1], fmt="o", markersize=7,
                            capsize=4, color=palette[sched])  # fmt: skip
            ax.set_xticks(range(len(d)), list(d["scheduler"]))
            ax.axhline(1.0, color="black", linewidth=0.8)
            best = d.iloc[0][f"best_{against or 'baseline_'}{m}"]
            ax.set_title(f"{w}\n{m} JCT ({what}: {best})" if i == 0 else
                         f"{m} JCT ({what}: {best})", fontsize=10)  # fmt: skip
            ax.tick_params(axis="x", rotation=60, labelsize=8)
            if j == 0:
                ax.set_ylabel(f"{m} JCT / {what}'s\n(< 1: faster than the {what})")
    fig.suptitle(f"JCT relative to the {what} per workload\n" + _seeds_note(rows),
                 fontsize=11)  # fmt: skip
    return fig


def _load_curves(rows: pd.DataFrame) -> pd.DataFrame:
    """Rows of workloads with two or more loads on otherwise equal settings."""
    r = rows[rows["load"].notna() & rows["scheduler"].isin(MAIN)]
    if r.empty:
        return r
    setting = ["workload", "preset", "kv_budget_tokens", "num_tasks"]
    n = r.groupby(setting)["load"].transform("nunique")
    return r[n >= 2]


def _vs_load(plt: Any, rows: pd.DataFrame, palette: dict[str, Any]) -> Any:
    workloads = list(dict.fromkeys(rows["workload"]))
    panels = [("mean_jct_s", "mean JCT (s)"), ("p99_jct_s", "p99 JCT (s)")]
    if rows["goodput_tps"].notna().any():
        panels.append(("goodput_tps", "goodput (tasks/s)"))
    fig, axes = plt.subplots(len(panels), len(workloads), squeeze=False,
                             figsize=(4.6 * len(workloads), 3.3 * len(panels)))  # fmt: skip
    scheds = list(dict.fromkeys(rows["scheduler"]))
    for j, w in enumerate(workloads):
        d = rows[rows["workload"] == w]
        loads = np.sort(d["load"].unique())
        step = float(np.diff(loads).min()) if len(loads) > 1 else 0.1
        for i, (col, label) in enumerate(panels):
            ax = axes[i][j]
            for k, (sched, s) in enumerate(d.groupby("scheduler", sort=False)):
                s = s.sort_values("load")
                # dodge each scheduler a little along x so that the intervals do not overlap
                x = s["load"].to_numpy() + (k - (len(scheds) - 1) / 2) * step * 0.06
                y = s[col].to_numpy(dtype=float)
                yerr = _err(y, s[f"{col}_lo"].to_numpy(), s[f"{col}_hi"].to_numpy())
                ax.errorbar(x, y, yerr=yerr, marker="o", markersize=4, capsize=2, linewidth=1.3,
                            label=sched, color=palette[str(sched)])  # fmt: skip
            ax.set_title(w if i == 0 else "", fontsize=10)
            ax.set(xlabel="load (x measured capacity)" if i == len(panels) - 1 else "",
                   ylabel=label if j == 0 else "", xticks=loads)  # fmt: skip
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("JCT and goodput against load\n" + _seeds_note(rows), fontsize=11)
    return fig


def _ablations(rows: pd.DataFrame, main: pd.DataFrame) -> pd.DataFrame:
    """Per workload, one group with topas and an ablation: its main group when it has them."""
    main_groups = set(main["group"])
    picks = []
    for _, w in rows[rows["scheduler"].isin(("topas", *ABLATIONS))].groupby("workload", sort=False):
        ok = [k for k, g in w.groupby("group", sort=False)
              if (g["scheduler"] == "topas").any() and len(g) > 1]  # fmt: skip
        if ok:
            chosen = next((k for k in ok if k in main_groups), ok[0])
            picks.append(w[w["group"] == chosen])
    return pd.concat(picks) if picks else pd.DataFrame()


def _grouped_bars(
    ax: Any, d: pd.DataFrame, cats: list[str], col: str, palette: dict[str, Any], ci: bool
) -> None:
    """Bars of `col` per category (x) and scheduler (colour), from zero, with intervals."""
    scheds = sorted(dict.fromkeys(d["scheduler"]), key=scheduler_order)
    width = 0.8 / max(1, len(scheds))
    for k, s in enumerate(scheds):
        e = d[d["scheduler"] == s].set_index("cat").reindex(cats)
        y = e[col].to_numpy(dtype=float)
        x = np.arange(len(cats)) + (k - (len(scheds) - 1) / 2) * width
        yerr = _err(y, e[f"{col}_lo"].to_numpy(), e[f"{col}_hi"].to_numpy()) if ci else None
        ax.bar(x, y, width, yerr=yerr, capsize=2, label=s, color=palette.get(s))
    ax.set_xticks(range(len(cats)), cats, rotation=20, fontsize=8)
    ax.set_ylim(bottom=0)


def _ablation_bars(plt: Any, abl: pd.DataFrame, palette: dict[str, Any]) -> Any:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.4), squeeze=False)
    d = abl.assign(cat=abl["workload"])
    cats = list(dict.fromkeys(d["cat"]))
    for ax, (col, m) in zip(axes[0], METRICS, strict=True):
        _grouped_bars(ax, d, cats, col, palette, ci=True)
        ax.set(title=f"{m} JCT", ylabel=f"{m} JCT (s)")
    axes[0][1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("TOPAS ablations (lower is better)\n" + _seeds_note(abl), fontsize=11)
    return fig


def _requests(plt: Any, main: pd.DataFrame, palette: dict[str, Any]) -> Any | None:
    panels = [
        ("ttft_p99_s", "p99 TTFT (s)", True), ("tpot_mean_ms", "mean TPOT (ms)", False),
        ("queue_mean_s", "mean queueing delay (s)", False),
        ("goodput_tps", "goodput (tasks/s)", True),
    ]  # fmt: skip
    d = main[main["scheduler"].isin(MAIN)].assign(cat=lambda x: x["workload"])
    panels = [p for p in panels if d[p[0]].notna().any()]  # older runs lack goodput
    if not panels:
        return None
    cats = list(dict.fromkeys(d["cat"]))
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8.0, 2.0 * len(cats)), 12),
                             squeeze=False)  # fmt: skip
    for ax, (col, label, ci) in zip(axes[:, 0], panels, strict=True):
        scaled = d.copy()
        if col == "goodput_tps":  # per workload relative to its best scheduler: rates differ
            top = scaled.groupby("cat")[col].transform("max")
            for c in (col, f"{col}_lo", f"{col}_hi"):
                scaled[c] = scaled[c] / top
            label = "goodput / the best's"
        _grouped_bars(ax, scaled, cats, col, palette, ci)
        ax.set_ylabel(label)
    axes[0][0].legend(fontsize=8, ncol=len(MAIN), loc="lower left", bbox_to_anchor=(0, 1.02))
    fig.suptitle("Calls and goodput per scheduler (main group of each workload)\n"
                 + _seeds_note(d).replace("error bars", "error bars (p99 TTFT, goodput)"),
                 fontsize=11)  # fmt: skip
    return fig


def _stage_bars(plt: Any, stages: pd.DataFrame, row: pd.Series, palette: dict[str, Any]) -> Any:
    d = stages[stages["scheduler"].isin(MAIN)].assign(cat=lambda x: x["kind"])
    cats = list(dict.fromkeys(d["cat"]))
    width = max(8.0, 0.3 * len(cats) * max(1, d["scheduler"].nunique()))
    fig, ax = plt.subplots(figsize=(width, 4.2))
    _grouped_bars(ax, d, cats, "mean_latency_s", palette, ci=False)
    ax.set(ylabel="mean latency (s), send to finish", xlabel="stage kind")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(f"{row['workload']}: latency per stage kind, mean over seeds "
                 f"({row['group_label']})", fontsize=10)  # fmt: skip
    return fig


def _cdf(plt: Any, coll: Collection, rows: pd.DataFrame, palette: dict[str, Any]) -> Any:
    groups = list(rows.groupby("group", sort=False))
    fig, axes = plt.subplots(1, len(groups), figsize=(6.4 * len(groups), 4.8), squeeze=False)
    for ax, (gkey, g) in zip(axes[0], groups, strict=True):
        runs = coll.runs[(coll.runs["group"] == gkey) & coll.runs["scheduler"].isin(MAIN)]
        runs = runs.sort_values("scheduler", key=lambda c: c.map(MAIN.index), kind="stable")
        for sched, r in runs.groupby("scheduler", sort=False):
            seeds = g[g["scheduler"] == sched]["seeds"]
            keep = {int(s) for s in str(seeds.iloc[0]).split(",")} if len(seeds) else set()
            paths = r[r["seed"].isin(keep)]["path"]
            x = np.sort(np.concatenate([coll.jct[p] for p in paths]))
            ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=sched,
                    color=palette[str(sched)], linewidth=1.6)  # fmt: skip
        ax.set(title=g.iloc[0]["group_label"].split(", a")[0], xlabel="JCT (s)",
               ylabel="fraction of tasks")  # fmt: skip
        ax.legend(fontsize=9, loc="lower right")
    fig.suptitle(f"{rows.iloc[0]['workload']}: JCT CDF (tasks of every seed pooled)")
    return fig
