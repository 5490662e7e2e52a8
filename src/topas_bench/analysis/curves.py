"""Figures over several settings of one workload, or over every task of a group:

- `vs_load`: mean and p99 JCT and goodput against load (or rate, when the runs have no load),
  one column per setting (workload, KV budget, tasks, preset, engine, parameters);
- `cdf`: the JCT CDF per scheduler, tasks of every seed pooled; schedulers whose JCTs are
  identical (spf and parrot on a chain, continuum and parrot) share one line and one legend
  entry, instead of one hiding the other;
- `regime_map`: where TOPAS wins: its mean and p99 JCT reduction vs the best baseline on each
  cell of a load (or rate) x KV-budget grid, with the 95% interval. It appears wherever a
  results tree holds such a grid (the evaluation's dag4 and metagpt-tl; the regime experiment).
"""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
import pandas as pd

from topas_bench.analysis.collect import Collection
from topas_bench.analysis.plotting import (
    PAGE_WIDTH_IN,
    among,
    engine_of,
    leaders,
    left_out_note,
    legend_below,
    scheduler_of,
    short,
    split_label,
    styles,
    suptitle,
)

METRICS = (("mean_jct_s", "mean"), ("p99_jct_s", "p99"))
#: The most panels a CDF figure (two to a row), and rows a load-curve figure, draws: a large
#: grid (the regime map's 225 settings per workload) would otherwise be unreadable.
MAX_CDF_PANELS = 6
MAX_LOAD_ROWS = 8


def _without(label: str, prefixes: tuple[str, ...]) -> str:
    return ", ".join(p for p in split_label(label) if not p.startswith(prefixes))


def _setting_key(rows: pd.DataFrame, drop: tuple[str, ...]) -> pd.Series:
    engine = rows["engine"].fillna("") if "engine" in rows else ""
    rest = rows["group_label"].map(lambda s: _without(str(s), drop))
    return rows["workload"].astype(str) + " | " + rest + " | " + engine


def x_axis(rows: pd.DataFrame) -> tuple[str, str]:
    """(column, label) of the x axis: load when every row has one, else the rate."""
    if rows["load"].notna().all():
        return "load", "load (x measured capacity)"
    return "rate_per_s", "rate (tasks/s)"


def load_settings(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(title, rows) per setting run at two or more loads or rates."""
    if rows.empty:
        return []
    key = _setting_key(rows, ("load ", "rate "))
    out = []
    for k, d in rows.groupby(key, sort=False):
        if d["rate_per_s"].nunique() >= 2:
            w, rest, engine = str(k).split(" | ")
            out.append((f"{w}\n{rest}" + (f", engine {engine}" if engine else ""), d))
    return out


def vs_load(
    plt: Any, settings: list[tuple[str, pd.DataFrame]], palette: dict[str, Any], slo: str
) -> Any:
    """One row per setting (its name above it): mean JCT, p99 JCT and goodput against load (or
    rate); the first `MAX_LOAD_ROWS` settings, the title saying how many were left out."""
    left_out = max(0, len(settings) - MAX_LOAD_ROWS)
    settings = settings[:MAX_LOAD_ROWS]
    panels = [("mean_jct_s", "mean JCT (s)"), ("p99_jct_s", "p99 JCT (s)")]
    if any(d["goodput_tps"].notna().any() for _, d in settings):
        panels.append(("goodput_tps", "goodput (tasks/s)"))
    fig = plt.figure(figsize=(PAGE_WIDTH_IN, 2.9 * len(settings) + 1.6))
    rows = fig.subfigures(len(settings), 1, squeeze=False)[:, 0]
    names = list(dict.fromkeys(s for _, d in settings for s in d["scheduler"]))
    style = styles(names, palette)
    for sub, (title, d) in zip(rows, settings, strict=True):
        axes = sub.subplots(1, len(panels), squeeze=False)[0]
        col_x, xlabel = x_axis(d)
        xs = np.sort(d[col_x].unique())
        step = float(np.diff(xs).min()) if len(xs) > 1 else 0.1
        scheds = list(dict.fromkeys(d["scheduler"]))
        for ax, (col, label) in zip(axes, panels, strict=True):
            for k, (sched, s) in enumerate(d.groupby("scheduler", sort=False)):
                s = s.sort_values(col_x)
                # dodge each scheduler a little along x so that the intervals do not overlap
                x = s[col_x].to_numpy(dtype=float) + (k - (len(scheds) - 1) / 2) * step * 0.05
                y = s[col].to_numpy(dtype=float)
                lo, hi = s[f"{col}_lo"].to_numpy(dtype=float), s[f"{col}_hi"].to_numpy(dtype=float)
                yerr = np.nan_to_num(np.vstack([y - lo, hi - y]).clip(min=0))
                ax.errorbar(x, y, yerr=yerr, markersize=4, capsize=2, label=short(str(sched)),
                            **style[str(sched)])  # fmt: skip
            ax.set_title(label, fontsize=9)
            ax.set_xticks(xs, [f"{x:.3g}" for x in xs], fontsize=8)
            ax.tick_params(axis="y", labelsize=8)
        sub.supxlabel(xlabel, fontsize=8)
        suptitle(sub, title.replace("\n", ": "), fontsize=9)
    legend_below(fig, [ax for sub in rows for ax in sub.axes])
    n = sorted({int(x) for _, d in settings for x in d["n_seeds"]})
    suptitle(fig, "JCT and goodput against load, one row per setting\nerror bars: 95% "
             f"percentile-bootstrap interval over {'/'.join(map(str, n))} seeds; goodput: "
             f"tasks/s that met the SLO, {slo}"
             + (f"; the first {MAX_LOAD_ROWS} settings, {left_out} more not drawn"
                if left_out else ""))  # fmt: skip
    return fig


def identical_groups(arrays: dict[str, np.ndarray]) -> list[list[str]]:
    """Schedulers whose pooled JCTs are equal, in `arrays`' order (first of each group)."""
    groups: list[list[str]] = []
    for name, x in arrays.items():
        for g in groups:
            other = arrays[g[0]]
            if other.shape == x.shape and np.allclose(other, x, rtol=0, atol=1e-9):
                g.append(name)
                break
        else:
            groups.append([name])
    return groups


def cdf(
    plt: Any, coll: Collection, rows: pd.DataFrame, palette: dict[str, Any], shown: tuple[str, ...]
) -> Any:
    """The JCT CDF per scheduler, one panel per group (the first `MAX_CDF_PANELS`), two to a
    row; in each at most `MAX_SERIES` schedulers of `shown` (TOPAS and the best on mean JCT
    there), the others named in the title."""

    def rank(label: str, topas_first: bool) -> tuple[bool, int, str]:
        """TOPAS's settings first (the legend) or last (drawn on top), the others in `shown`'s
        order, a scheduler's tuned setting after its default."""
        name = scheduler_of(label)
        return (name == "topas") is not topas_first, shown.index(name), label

    groups = list(rows.groupby("group", sort=False))
    left_out = max(0, len(groups) - MAX_CDF_PANELS)
    groups = groups[:MAX_CDF_PANELS]
    dropped: list[str] = []
    cols = min(2, len(groups))
    nrows = -(-len(groups) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(PAGE_WIDTH_IN, 4.4 * nrows + 1.4),
                             squeeze=False)  # fmt: skip
    identical = False
    for ax, (gkey, g) in zip(axes.flat, groups, strict=False):
        keep, left = leaders(g[among(g["scheduler"], shown)])
        dropped += [s for s in left if s not in dropped]
        style = styles(sorted(keep, key=lambda s: rank(s, True)), palette)
        runs = coll.runs[(coll.runs["group"] == gkey) & coll.runs["scheduler"].isin(keep)]
        order = sorted(runs["scheduler"].unique(), key=lambda s: rank(s, False))
        arrays = {}
        for sched in order:
            seeds = g[g["scheduler"] == sched]["seeds"]
            keep_seeds = {int(s) for s in str(seeds.iloc[0]).split(",")} if len(seeds) else set()
            r = runs[(runs["scheduler"] == sched) & runs["seed"].isin(keep_seeds)]
            arrays[sched] = np.sort(np.concatenate([coll.jct[p] for p in r["path"]]))
        for same in identical_groups(arrays):
            x = arrays[same[0]]
            label = " = ".join(short(x) for x in same)
            label = textwrap.fill(label + (" (identical JCTs)" if len(same) > 1 else ""), 40)
            identical |= len(same) > 1
            st = style[same[0]]
            ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=label,
                    color=st["color"], linestyle=st["linestyle"], linewidth=st["linewidth"],
                    zorder=st["zorder"])  # fmt: skip
        ax.set_xlabel("JCT (s)", fontsize=8)
        ax.set_ylabel("fraction of tasks", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.set_title(textwrap.fill(str(g.iloc[0]["group_label"]), 44), fontsize=8)
        # below the panel, outside the data (constrained layout makes room)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), frameon=False)
    for ax in list(axes.flat)[len(groups) :]:
        ax.set_visible(False)
    note = "; schedulers with identical JCTs share one line" if identical else ""
    if left_out:
        note += f"; the first {MAX_CDF_PANELS} settings, {left_out} more not drawn"
    if dropped:
        note += f"; {left_out_note(dropped)}"
    engines = ", ".join(sorted({engine_of(r) for _, r in rows.iterrows()}))
    suptitle(fig, f"{rows.iloc[0]['workload']}: JCT CDF (tasks of every seed pooled), "
             f"{engines}{note}", fontsize=9)  # fmt: skip
    return fig


def regime_grids(rows: pd.DataFrame) -> list[pd.DataFrame]:
    """TOPAS's rows of each setting run at >= 2 loads (or rates) and >= 2 KV budgets."""
    t = rows[rows["scheduler"] == "topas"]
    if t.empty:
        return []
    key = _setting_key(t, ("load ", "rate ", "KV "))
    return [d for _, d in t.groupby(key, sort=False)
            if d["rate_per_s"].nunique() >= 2 and d["kv_budget_tokens"].nunique() >= 2]  # fmt: skip


def _cell(r: pd.Series, m: str) -> str:
    v, lo, hi = (100 * r[f"reduction_{m}{s}"] for s in ("", "_lo", "_hi"))
    return f"{v:+.1f}%\n[{lo:+.0f}, {hi:+.0f}]\nvs {r[f'best_baseline_{m}']}"


def regime_map(plt: Any, grid: pd.DataFrame) -> Any:
    """Heat maps of TOPAS's mean (above) and p99 (below) JCT reduction vs the best baseline
    over the grid."""
    col_x, xlabel = x_axis(grid)
    xs, ys = np.sort(grid[col_x].unique()), np.sort(grid["kv_budget_tokens"].unique())
    fig, axes = plt.subplots(2, 1, figsize=(PAGE_WIDTH_IN, 2 * (0.75 * len(ys) + 1.2) + 1.6))
    vals = grid[[f"reduction_{m}" for _, m in METRICS]].to_numpy(dtype=float) * 100
    lim = max(5.0, float(np.nanmax(np.abs(vals))))
    for ax, (_, m) in zip(axes, METRICS, strict=True):
        z = np.full((len(ys), len(xs)), np.nan)
        for _, r in grid.iterrows():
            i = int(np.searchsorted(ys, r["kv_budget_tokens"]))
            j = int(np.searchsorted(xs, r[col_x]))
            z[i, j] = 100 * r[f"reduction_{m}"]
            crosses = r[f"reduction_{m}_lo"] <= 0 <= r[f"reduction_{m}_hi"]
            dark = abs(z[i, j]) > 0.55 * lim
            ax.text(j, i, _cell(r, m), ha="center", va="center", fontsize=8,
                    color="white" if dark else "black",
                    fontstyle="italic" if crosses else "normal")  # fmt: skip
        image = ax.imshow(z, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto", origin="lower")
        for i, j in zip(*np.nonzero(np.isnan(z)), strict=True):
            ax.text(j, i, "not run", ha="center", va="center", fontsize=8, color="gray")
        ax.set_xticks(range(len(xs)), [f"{x:.4g}" for x in xs], fontsize=8)
        ax.set_yticks(range(len(ys)), [f"{int(y):,}" for y in ys], fontsize=8)
        ax.set_ylabel("KV budget (tokens)", fontsize=8)
        ax.set_title(f"{m} JCT", fontsize=9)
        ax.grid(False)
        bar = fig.colorbar(image, ax=ax, shrink=0.9)
        bar.set_label("TOPAS reduction (%)", fontsize=8)
        bar.ax.tick_params(labelsize=8)
    axes[-1].set_xlabel(xlabel, fontsize=8)
    first = grid.iloc[0]
    rest = _without(str(first["group_label"]), ("load ", "rate ", "KV "))
    engine = first.get("engine") if isinstance(first.get("engine"), str) else "not recorded"
    suptitle(fig, f"{first['workload']}: where TOPAS wins. Its JCT reduction vs the best "
             f"baseline per cell (blue: TOPAS faster), 95% interval over seeds {first['seeds']} "
             f"in brackets, italic where it includes 0; {rest}, engine {engine}",
             fontsize=9)  # fmt: skip
    return fig
