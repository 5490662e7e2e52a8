"""Seaborn figures of a results tree, each written as PNG and SVG (DESIGN section 8).

- `jct_cdf_<workload>`: JCT CDF per scheduler (tasks pooled over seeds), one panel per group;
- `jct_bars`: mean and p99 JCT per scheduler with the report's 95% bootstrap intervals, for
  each workload's main group (the one with the most schedulers, then the load nearest 0.8);
- `jct_vs_load`: mean and p99 JCT against load, for workloads run at two or more loads;
- `timeline_<workload>`: resident agent prefixes and KV use over time of one run (TOPAS and
  the best baseline on the same sample);
- `ablation`: TOPAS's ablations' JCT relative to TOPAS, where the tree has them.

Every number comes from the report rows or the run files; nothing is recomputed differently.
Output is deterministic (fixed SVG ids, no timestamps) so regenerated figures diff cleanly.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from topas_bench.analysis.collect import Collection
from topas_bench.analysis.report import Report
from topas_bench.errors import TopasError
from topas_bench.results import read_table
from topas_bench.schedulers.registry import ABLATIONS, BASELINES

MAIN = (*BASELINES, "topas")


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        sns = _sns()
    except ImportError:
        raise TopasError(
            "figures need matplotlib and seaborn: pip install 'topas-bench[figures]'"
        ) from None
    sns.set_theme(style="whitegrid", context="paper")
    plt.rcParams.update({"svg.hashsalt": "topas-bench", "svg.fonttype": "none"})
    return plt


def write_figures(coll: Collection, rep: Report, out: Path) -> list[Path]:
    """Every figure the tree supports, into `out`; returns the files written."""
    plt = _plt()
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []

    def save(fig: Any, name: str, layout: bool = True) -> None:
        if layout:  # a seaborn grid lays itself out around its legend
            fig.tight_layout()
        for ext, meta in (("png", {"Software": None}), ("svg", {"Date": None})):
            path = out / f"{name}.{ext}"
            fig.savefig(path, dpi=110, metadata=meta)
            written.append(path)
        plt.close(fig)

    main = _main_groups(rep.rows)
    palette = _palette(rep.rows["scheduler"].unique())
    for workload, groups in rep.rows.groupby("workload", sort=False):
        save(_cdf(plt, coll, groups, palette), f"jct_cdf_{workload}")
    save(_bars(plt, main, palette), "jct_bars")
    curves = _load_curves(rep.rows)
    if not curves.empty:
        save(_vs_load(plt, curves, palette), "jct_vs_load")
    for _, row in main.drop_duplicates("workload").iterrows():
        fig = _timeline(plt, coll, rep.rows, row)
        if fig is not None:
            save(fig, f"timeline_{row['workload']}")
    abl = _ablations(rep.rows, main)
    if not abl.empty:
        save(_ablation_bars(plt, abl), "ablation", layout=False)
    return written


def _sns() -> Any:
    return importlib.import_module("seaborn")  # untyped; imported only for figures


def _palette(labels: Any) -> dict[str, Any]:
    sns = _sns()
    names = sorted(labels, key=lambda s: (s not in MAIN, MAIN.index(s) if s in MAIN else 0, s))
    return dict(zip(names, sns.color_palette("tab10", len(names)), strict=True))


def _main_groups(rows: pd.DataFrame) -> pd.DataFrame:
    """Per workload, the rows of its main group."""
    picks = []
    for _, w in rows.groupby("workload", sort=False):
        sizes = w.groupby("group", sort=False).agg(n=("scheduler", "size"), load=("load", "first"))
        sizes["dist"] = (sizes["load"].fillna(0.8) - 0.8).abs()
        best = sizes.sort_values(["n", "dist"], ascending=[False, True]).index[0]
        picks.append(w[w["group"] == best])
    return pd.concat(picks) if picks else pd.DataFrame()


def _cdf(plt: Any, coll: Collection, rows: pd.DataFrame, palette: dict[str, Any]) -> Any:
    groups = list(rows.groupby("group", sort=False))
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups), 3.4), squeeze=False)
    for ax, (gkey, g) in zip(axes[0], groups, strict=True):
        runs = coll.runs[(coll.runs["group"] == gkey) & coll.runs["scheduler"].isin(MAIN)]
        runs = runs.sort_values("scheduler", key=lambda c: c.map(MAIN.index), kind="stable")
        for sched, r in runs.groupby("scheduler", sort=False):
            seeds = g[g["scheduler"] == sched]["seeds"]
            keep = {int(s) for s in str(seeds.iloc[0]).split(",")} if len(seeds) else set()
            paths = r[r["seed"].isin(keep)]["path"]
            jct = np.concatenate([coll.jct[p] for p in paths])
            x = np.sort(jct)
            ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=sched,
                    color=palette[str(sched)])  # fmt: skip
        ax.set(title=g.iloc[0]["group_label"].split(", a")[0], xlabel="JCT (s)",
               ylabel="fraction of tasks")  # fmt: skip
        ax.legend(fontsize=7)
    fig.suptitle(f"{rows.iloc[0]['workload']}: JCT CDF (tasks of all seeds)")
    return fig


def _bars(plt: Any, main: pd.DataFrame, palette: dict[str, Any]) -> Any:
    rows = main[main["scheduler"].isin(MAIN)]
    workloads = list(dict.fromkeys(rows["workload"]))
    fig, axes = plt.subplots(2, len(workloads), figsize=(3.2 * len(workloads), 5.6), squeeze=False)
    for j, w in enumerate(workloads):
        d = rows[rows["workload"] == w]
        for i, (col, name) in enumerate((("mean_jct_s", "mean"), ("p99_jct_s", "p99"))):
            ax = axes[i][j]
            y = d[col].to_numpy()
            err = np.vstack([y - d[f"{col}_lo"].to_numpy(), d[f"{col}_hi"].to_numpy() - y])
            colors = [palette[s] for s in d["scheduler"]]
            ax.bar(d["scheduler"], y, yerr=err, color=colors, capsize=3)
            ax.set(title=f"{w}: {name} JCT" if i == 0 else f"{name} JCT", ylabel="s")
            ax.tick_params(axis="x", rotation=60, labelsize=7)
    fig.suptitle("JCT per scheduler (95% bootstrap interval over seeds)")
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
    fig, axes = plt.subplots(2, len(workloads), figsize=(4 * len(workloads), 6), squeeze=False)
    for j, w in enumerate(workloads):
        d = rows[rows["workload"] == w]
        for i, col in enumerate(("mean_jct_s", "p99_jct_s")):
            ax = axes[i][j]
            for sched, s in d.groupby("scheduler", sort=False):
                s = s.sort_values("load")
                ax.plot(s["load"], s[col], marker="o", label=sched, color=palette[str(sched)])
                ax.fill_between(s["load"], s[f"{col}_lo"], s[f"{col}_hi"], alpha=0.08,
                                color=palette[str(sched)])  # fmt: skip
            ax.set(title=f"{w}: {col.split('_')[0]} JCT", xlabel="load (x capacity)", ylabel="s")
            ax.legend(fontsize=7)
    fig.suptitle("JCT against load")
    return fig


def _runs_of(coll: Collection, group: str, scheduler: str) -> pd.DataFrame:
    r = coll.runs
    return r[(r["group"] == group) & (r["scheduler"] == scheduler)].sort_values("seed")


def _timeline(plt: Any, coll: Collection, rows: pd.DataFrame, row: pd.Series) -> Any | None:
    group = rows[rows["group"] == row["group"]]
    best = str(group.iloc[0]["best_baseline_mean"])
    shown = [s for s in ("topas", best) if s and (group["scheduler"] == s).any()]
    if not shown:
        return None
    seed = int(str(group.iloc[0]["seeds"]).split(",")[0])
    fig, axes = plt.subplots(2, len(shown), figsize=(6 * len(shown), 5.5), squeeze=False,
                             sharex="col", gridspec_kw={"height_ratios": [1, 1.3]})  # fmt: skip
    for j, sched in enumerate(shown):
        runs = _runs_of(coll, str(row["group"]), sched)
        run_dir = Path(runs[runs["seed"] == seed]["path"].iloc[0])
        tl = read_table(run_dir, "timeline")
        _residency(axes[0][j], tl)
        axes[0][j].set(title=f"{sched}: resident agent prefixes (seed {seed})")
        _kv(axes[1][j], tl, int(row["kv_budget_tokens"]))
    fig.suptitle(f"{row['workload']} ({row['group_label']})")
    return fig


def _residency(ax: Any, tl: pd.DataFrame) -> None:
    agents = sorted({a for s in tl["resident_agents"] for a in str(s).split("|") if a})
    start, end = tl["t_s"].to_numpy(), (tl["t_s"] + tl["duration_s"]).to_numpy()
    for i, agent in enumerate(agents):
        on = tl["resident_agents"].map(lambda s, a=agent: a in str(s).split("|")).to_numpy()
        ax.broken_barh(_spans(on, start, end), (i - 0.4, 0.8), color="tab:blue", rasterized=True)
    ax.set_yticks(range(len(agents)), agents, fontsize=7)


def _spans(on: np.ndarray, start: np.ndarray, end: np.ndarray) -> list[tuple[float, float]]:
    """Merged (start, width) intervals where `on` holds: few rectangles, small SVGs."""
    spans: list[tuple[float, float]] = []
    i = 0
    while i < on.size:
        if on[i]:
            j = i
            while j + 1 < on.size and on[j + 1]:
                j += 1
            spans.append((float(start[i]), float(end[j] - start[i])))
            i = j
        i += 1
    return spans


def _kv(ax: Any, tl: pd.DataFrame, budget: int) -> None:
    t = tl["t_s"].to_numpy()
    cache, private = tl["kv_cache_tokens"].to_numpy(), tl["kv_private_tokens"].to_numpy()
    ax.stackplot(t, cache, private, step="post", labels=["prefix cache", "running requests"],
                 alpha=0.8, rasterized=True)  # fmt: skip
    ax.axhline(budget, color="black", linewidth=0.8, linestyle="--", label="KV budget")
    ax.set(xlabel="time (s)", ylabel="KV tokens")
    ax.legend(fontsize=7, loc="lower right")


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


def _ablation_bars(plt: Any, abl: pd.DataFrame) -> Any:
    sns = _sns()
    rel: list[dict[str, Any]] = []
    for w, d in abl.groupby("workload", sort=False):
        top = d[d["scheduler"] == "topas"].iloc[0]
        for _, r in d.iterrows():
            for col, name in (("mean_jct_s", "mean"), ("p99_jct_s", "p99")):
                rel.append({"workload": w, "scheduler": r["scheduler"], "metric": name,
                            "relative JCT": r[col] / top[col]})  # fmt: skip
    df = pd.DataFrame(rel)
    g = sns.catplot(data=df, kind="bar", x="workload", y="relative JCT", hue="scheduler",
                    col="metric", height=3.6, aspect=1.4, errorbar=None)  # fmt: skip
    lo, hi = float(df["relative JCT"].min()), float(df["relative JCT"].max())
    pad = max(0.02, (hi - lo) * 0.15)
    for ax in g.axes.flat:
        ax.set_ylim(min(lo, 1.0) - pad, max(hi, 1.0) + pad)  # the differences, not the bulk
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.tick_params(axis="x", rotation=30)
    g.figure.suptitle("TOPAS ablations: JCT relative to topas (lower is better)")
    g.tight_layout()
    return g.figure
