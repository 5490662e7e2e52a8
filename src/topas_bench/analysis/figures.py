"""Figures of a results tree, each written as PNG and SVG (docs/design.md section 8). Every figure
says its setting (load or rate, KV budget, tasks, preset, engine) and, where it shows one
setting of several, which ones it leaves out; each fits the page (`plotting.PAGE_WIDTH_IN`, no
text under 8 pt or overlapping another: `plotting.layout_problems`, checked with `strict`),
and a panel draws at most `plotting.MAX_SERIES` schedulers, naming the others.

- `jct_relative`: mean and p99 JCT of each scheduler divided by the best baseline's, per
  workload's main group (the one with the most schedulers, then the load nearest 0.8), with
  paired 95% bootstrap intervals over the seeds (labelled with their number);
- `jct_relative_all`: the same for TOPAS and every scheduler that is not one of its ablations,
  divided by the best of them all (the paper's baselines and the peers), when the tree has
  peers: TOPAS, the best baseline and the leaders on mean JCT;
- `jct_vs_load`: mean and p99 JCT and goodput against load (or rate), one column per workload
  and setting (`curves`);
- `ablation`: what each lever is worth (`lever_figure`): the report's levers table, TOPAS's
  paired margin over each ablation per workload, in percent around zero with its paired
  bootstrap interval;
- `requests`: p99 TTFT, mean TPOT, mean queueing delay and goodput (its SLO named) per
  scheduler;
- `jct_cdf_<workload>`: JCT CDF per scheduler (tasks pooled over seeds), one panel per group,
  two to a row (at most `curves.MAX_CDF_PANELS`; `jct_vs_load` at most `curves.MAX_LOAD_ROWS`
  rows);
  schedulers with identical JCTs share one line and one legend entry (`curves`);
- `stage_latency_<workload>`: mean latency per stage kind and scheduler (main group);
- `timeline_<workload>`: TOPAS against the best baselines over one run (`timeline`);
- `regime_<workload>`: with a load x KV-budget grid, TOPAS's reduction per cell (`curves`);
- `regime_margin_<workload>` (and `regime.csv`, `regime.md`): with such a grid, TOPAS's margin
  over the best other scheduler per (output scale, KV multiple, load) cell, the cells where
  residency pays outlined, and the mechanism per cell (`regime`);
- `cluster_jct_vs_replicas` (and `cluster.csv`): for trees with simulated clusters, mean JCT
  against replicas per router x scheduler (`cluster`).

Every number comes from the report rows or the run files; nothing is recomputed differently.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from topas_bench.analysis.bootstrap import LEVEL, N_BOOT
from topas_bench.analysis.cluster import cluster_figure, cluster_table
from topas_bench.analysis.collect import Collection
from topas_bench.analysis.curves import cdf, load_settings, regime_grids, regime_map, vs_load
from topas_bench.analysis.levers import lever_figure
from topas_bench.analysis.plotting import (
    PAGE_WIDTH_IN,
    among,
    common_setting,
    layout_problems,
    leaders,
    left_out_note,
    legend_below,
    palette_for,
    pyplot,
    save,
    setting_title,
    short,
    styles,
    suptitle,
)
from topas_bench.analysis.regime import regime_margin, regime_markdown, regime_table
from topas_bench.analysis.report import Report, scheduler_order
from topas_bench.analysis.timeline import timeline_figure
from topas_bench.errors import TopasError
from topas_bench.schedulers.registry import ABLATIONS, BASELINES, PEERS, SCHEDULERS

MAIN = (*BASELINES, "topas")
#: `jct_relative_all`: every scheduler but TOPAS's ablations.
EVERY = tuple(s for s in SCHEDULERS.names() if s not in ABLATIONS)
METRICS = (("mean_jct_s", "mean"), ("p99_jct_s", "p99"))
FORMATS = ("png", "svg")

__all__ = ["EVERY", "MAIN", "palette_for", "pyplot", "write_figures"]


def write_figures(coll: Collection, rep: Report, out: Path, strict: bool = False) -> list[Path]:
    """Every figure the tree supports, into `out`; returns the files written. `strict`: fail
    (naming each figure and problem) where a figure is unreadable at page width
    (`plotting.layout_problems`)."""
    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    problems: list[str] = []

    def keep(fig: Any, name: str) -> None:
        if strict:
            problems.extend(f"{name}: {p}" for p in layout_problems(fig))
        written.extend(save(plt, fig, out, name, FORMATS))

    rows = rep.rows
    main = main_groups(rows)
    palette = palette_for(rows["scheduler"].unique())
    keep(relative(plt, main, palette, rows), "jct_relative")
    if among(main["scheduler"], PEERS).any():
        keep(relative(plt, main, palette, rows, against="any_"), "jct_relative_all")
    curves = load_settings(rows[among(rows["scheduler"], MAIN)])
    if curves:
        keep(vs_load(plt, curves, palette, rep.slo.describe()), "jct_vs_load")
    abl = ablations(rows, main)
    if (fig := lever_figure(plt, rep.levers, abl)) is not None:
        keep(fig, "ablation")
    if (fig := requests_figure(plt, main, palette, rep.slo.describe())) is not None:
        keep(fig, "requests")
    for workload, groups in rows.groupby("workload", sort=False):
        keep(cdf(plt, coll, groups, palette, EVERY), f"jct_cdf_{workload}")
        for grid in regime_grids(groups):
            keep(regime_map(plt, grid), f"regime_{workload}")
            break
    table = regime_table(rep.runs)
    if not table.empty:
        for workload, w in table.groupby("workload", sort=False):
            keep(regime_margin(plt, w), f"regime_margin_{workload}")
        table.to_csv(out / "regime.csv", index=False, float_format="%.6g")
        (out / "regime.md").write_text(regime_markdown(table))
        written += [out / "regime.csv", out / "regime.md"]
    for _, row in main.drop_duplicates("workload").iterrows():
        stages = rep.stages[rep.stages["group"] == row["group"]]
        if not stages.empty:
            keep(stage_bars(plt, stages, row, palette), f"stage_latency_{row['workload']}")
        fig = timeline_figure(plt, coll, rows, str(row["group"]), palette)
        if fig is not None:
            keep(fig, f"timeline_{row['workload']}")
    clusters = cluster_table(coll, rep)  # docs/cluster.md: JCT against replicas per router
    if not clusters.empty:
        keep(cluster_figure(plt, clusters, palette), "cluster_jct_vs_replicas")
        clusters.to_csv(out / "cluster.csv", index=False, float_format="%.6g")
        written.append(out / "cluster.csv")
    if problems:
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        raise TopasError("figures unreadable at page width: " + "; ".join(problems[:10]) + more)
    return written


def main_groups(rows: pd.DataFrame) -> pd.DataFrame:
    """Per workload, the rows of its main group: the most schedulers, then the load nearest
    0.8, then the middle rate."""
    picks = []
    for _, w in rows.groupby("workload", sort=False):
        sizes = w.groupby("group", sort=False).agg(n=("scheduler", "size"), load=("load", "first"),
                                                   rate=("rate_per_s", "first"))  # fmt: skip
        sizes["dist"] = (sizes["load"].fillna(0.8) - 0.8).abs()
        sizes["rate_dist"] = (sizes["rate"] - sizes["rate"].median()).abs()
        order = sizes.sort_values(["n", "dist", "rate_dist"], ascending=[False, True, True])
        picks.append(w[w["group"] == order.index[0]])
    return pd.concat(picks) if picks else pd.DataFrame(columns=rows.columns)


def seeds_note(rows: pd.DataFrame) -> str:
    n = sorted({int(x) for x in rows["n_seeds"]})
    seeds = "/".join(str(x) for x in n)
    return (
        f"error bars: {100 * LEVEL:.0f}% percentile-bootstrap interval over {seeds} seeds "
        f"({N_BOOT:,} resamples)"
    )


def err(y: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    spread: np.ndarray = np.nan_to_num(np.vstack([y - lo, hi - y]).clip(min=0))
    return spread


def _left_out(rows: pd.DataFrame, main: pd.DataFrame) -> str:
    """Which settings of each workload a one-group-per-workload figure does not show (named
    up to three, else counted)."""
    notes = []
    for w, g in rows[~rows["group"].isin(set(main["group"]))].groupby("workload", sort=False):
        _, own = common_setting(rows[rows["workload"] == w])
        labels = [own[str(k)] for k in dict.fromkeys(g["group"])]
        notes.append(f"{w}: " + ("; ".join(labels) if len(labels) <= 3
                                 else f"{len(labels)} other settings"))  # fmt: skip
    return ("Not shown (other settings): " + " | ".join(notes)) if notes else ""


def _dropped(left: dict[str, list[str]]) -> list[str]:
    """Schedulers left out per workload, each once: with its workloads where not all."""
    every = len(left)
    by: dict[str, list[str]] = {}
    for w, names in left.items():
        for s in names:
            by.setdefault(s, []).append(w)
    return [s if len(ws) == every else f"{s} ({', '.join(ws)})" for s, ws in by.items()]


def relative(
    plt: Any, main: pd.DataFrame, palette: dict[str, Any], rows: pd.DataFrame, against: str = ""
) -> Any:
    """Each scheduler's JCT over the best baseline's (`against=""`: the paper's schedulers) or
    over the best of all (`"any_"`: every scheduler but TOPAS's ablations, at most
    `MAX_SERIES` per workload: TOPAS, the best baseline and the leaders on mean JCT), one row
    of panels (mean, p99) per workload with the schedulers down the side; `rows` (every
    group) names the settings left out."""
    shown = main[among(main["scheduler"], EVERY if against else MAIN)]
    what = "best of all" if against else "best baseline"
    workloads = list(dict.fromkeys(shown["workload"]))
    picks, left = {}, {}
    for w in workloads:
        d = shown[shown["workload"] == w]
        keep, left[w] = leaders(d, always=("topas", str(d.iloc[0]["best_baseline_mean"])))
        picks[w] = d[d["scheduler"].isin(keep)]
    tall = [0.3 * len(d) + 1.9 for d in picks.values()]
    fig = plt.figure(figsize=(PAGE_WIDTH_IN, sum(tall) + 2.0))
    subs = fig.subfigures(len(workloads), 1, squeeze=False, height_ratios=tall)[:, 0]
    shared, own = common_setting(shown)
    style = styles(list(dict.fromkeys(s for d in picks.values() for s in d["scheduler"])), palette)
    for sub, w in zip(subs, workloads, strict=True):
        d = picks[w].iloc[::-1]  # the first scheduler at the top
        label = own[str(d.iloc[0]["group"])]
        suptitle(sub, w + (f": {label}" if label != "-" else ""), fontsize=9)
        for ax, (_, m) in zip(sub.subplots(1, 2), METRICS, strict=True):
            y = 1.0 - d[f"reduction_{against}{m}"].to_numpy(dtype=float)
            lo = 1.0 - d[f"reduction_{against}{m}_hi"].to_numpy(dtype=float)
            hi = 1.0 - d[f"reduction_{against}{m}_lo"].to_numpy(dtype=float)
            # points, not bars: a ratio's axis need not start at zero, a bar's must
            spread = err(y, lo, hi)
            for k, sched in enumerate(d["scheduler"]):
                st = style[sched]
                ax.errorbar([y[k]], [k], xerr=spread[:, k : k + 1], fmt=st["marker"],
                            markersize=6, capsize=3, color=st["color"])  # fmt: skip
            names = [short(x) for x in d["scheduler"]]
            ax.set_yticks(range(len(d)), names if m == "mean" else [])
            ax.tick_params(labelsize=8)
            ax.axvline(1.0, color="black", linewidth=0.8)
            _ratio_axis(ax, hi)
            best = d.iloc[0][f"best_{against or 'baseline_'}{m}"]
            ax.set_title(f"{m} JCT / {what}'s ({short(str(best))})", fontsize=8)
            ax.set_xlabel(f"JCT / the {what}'s (< 1: faster)", fontsize=8)
    note = left_out_note(_dropped(left))
    text = f"JCT relative to the {what} per workload; {shared}\n{seeds_note(shown)}"
    suptitle(fig, text + (f"\n{note}" if note else "") + "\n" + _left_out(rows, main), fontsize=9)
    return fig


def _ratio_axis(ax: Any, highs: np.ndarray) -> None:
    """A log x axis when some ratio is above 3 (one slow scheduler must not flatten the
    rest), with plain ticks."""
    top = float(np.nanmax(highs)) if np.isfinite(highs).any() else 1.0
    if top <= 3:
        return
    from matplotlib.ticker import FixedLocator, NullLocator, ScalarFormatter

    ax.set_xscale("log")
    ticks = [t for t in (0.5, 1, 2, 3, 5, 10, 20, 50) if t <= top * 1.2]
    ax.xaxis.set_major_locator(FixedLocator(ticks))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_locator(NullLocator())


def ablations(rows: pd.DataFrame, main: pd.DataFrame) -> pd.DataFrame:
    """Per workload, one group with topas and an ablation: its main group when it has them."""
    main_groups_ = set(main["group"])
    picks = []
    for _, w in rows[rows["scheduler"].isin(("topas", *ABLATIONS))].groupby("workload", sort=False):
        ok = [k for k, g in w.groupby("group", sort=False)
              if (g["scheduler"] == "topas").any() and len(g) > 1]  # fmt: skip
        if ok:
            chosen = next((k for k in ok if k in main_groups_), ok[0])
            picks.append(w[w["group"] == chosen])
    return pd.concat(picks) if picks else pd.DataFrame()


def grouped_bars(
    ax: Any, d: pd.DataFrame, cats: list[str], col: str, palette: dict[str, Any], ci: bool
) -> None:
    """Horizontal bars of `col` per category (down the side, the first at the top) and
    scheduler (colour), from zero, with intervals; labels stay horizontal at any count."""
    scheds = sorted(dict.fromkeys(d["scheduler"]), key=scheduler_order)
    style = styles(scheds, palette)
    height = 0.8 / max(1, len(scheds))
    for k, s in enumerate(scheds):
        e = d[d["scheduler"] == s].set_index("cat").reindex(cats)
        x = e[col].to_numpy(dtype=float)
        y = np.arange(len(cats)) + (k - (len(scheds) - 1) / 2) * height
        xerr = err(x, e[f"{col}_lo"].to_numpy(), e[f"{col}_hi"].to_numpy()) if ci else None
        ax.barh(y, x, height, xerr=xerr, capsize=2, label=short(s), color=style[s]["color"])
    ax.set_yticks(range(len(cats)), cats, fontsize=8)
    ax.set_ylim(len(cats) - 0.5, -0.5)
    ax.set_xlim(left=0)
    ax.tick_params(axis="x", labelsize=8)


def requests_figure(plt: Any, main: pd.DataFrame, palette: dict[str, Any], slo: str) -> Any | None:
    panels = [
        ("ttft_p99_s", "p99 TTFT (s)", True), ("tpot_mean_ms", "mean TPOT (ms)", False),
        ("queue_mean_s", "mean queueing delay (s)", False),
        ("goodput_tps", "goodput (tasks/s)", True),
    ]  # fmt: skip
    d = main[among(main["scheduler"], MAIN)]
    _, own = common_setting(d)
    d = d.assign(cat=[_cat(w, own[str(g)]) for w, g in zip(d["workload"], d["group"],
                                                            strict=True)])  # fmt: skip
    panels = [p for p in panels if p[0] in d and d[p[0]].notna().any()]  # older runs lack some
    if not panels:
        return None
    cats = list(dict.fromkeys(d["cat"]))
    nrows = -(-len(panels) // 2)
    tall = 0.13 * len(cats) * max(1, d["scheduler"].nunique()) + 1.0
    fig, axes = plt.subplots(nrows, min(2, len(panels)), figsize=(PAGE_WIDTH_IN,
                             nrows * tall + 2.0), squeeze=False, sharey=True)  # fmt: skip
    for ax, (col, label, ci) in zip(axes.flat, panels, strict=False):
        scaled = d.copy()
        if col == "goodput_tps":  # per workload relative to its best scheduler: rates differ
            top = scaled.groupby("cat")[col].transform("max")
            for c in (col, f"{col}_lo", f"{col}_hi"):
                scaled[c] = scaled[c] / top
            label = "goodput / the best's (SLO: see title)"
        grouped_bars(ax, scaled, cats, col, palette, ci)
        ax.set_xlabel(label, fontsize=8)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    legend_below(fig, [axes[0][0]])
    shared, _ = common_setting(d)
    note = seeds_note(d).replace("error bars", "error bars (p99 TTFT, goodput)")
    suptitle(fig, f"Calls and goodput per scheduler (main setting of each workload); {shared}\n"
             f"goodput: tasks/s that met the SLO, {slo}\n{note}", fontsize=9)  # fmt: skip
    return fig


def stage_bars(plt: Any, stages: pd.DataFrame, row: pd.Series, palette: dict[str, Any]) -> Any:
    d = stages[among(stages["scheduler"], MAIN)].assign(cat=lambda x: x["kind"])
    cats = list(dict.fromkeys(d["cat"]))
    tall = 0.13 * len(cats) * max(1, d["scheduler"].nunique()) + 2.4
    fig, ax = plt.subplots(figsize=(PAGE_WIDTH_IN, tall))
    grouped_bars(ax, d, cats, "mean_latency_s", palette, ci=False)
    ax.set_xlabel("mean latency (s), send to finish", fontsize=8)
    ax.set_ylabel("stage kind", fontsize=8)
    legend_below(fig, [ax])
    suptitle(fig, f"{row['workload']}: latency per stage kind, mean over seeds "
             f"{row['seeds']}; {setting_title(row)}", fontsize=9)  # fmt: skip
    return fig


def _cat(workload: str, own: str) -> str:
    """A bar group's label: the workload, and its own setting where it has one."""
    return workload if own == "-" else f"{workload}\n{textwrap.fill(own, 28)}"
