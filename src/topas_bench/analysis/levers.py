"""The lever chart (`topas-bench figures`' `ablation`): what each of TOPAS's levers is worth per
workload, from the protocol's levers table (`protocol.levers`: TOPAS against each ablation, a
paired margin per seed set with its bootstrap interval and Holm verdict), drawn around zero so
that effects of a few points stay visible beside workloads whose JCTs differ tenfold."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from topas_bench.analysis.bootstrap import LEVEL, N_BOOT
from topas_bench.analysis.plotting import PAGE_WIDTH_IN, common_setting, legend_below, suptitle


def _seeds(rows: pd.DataFrame) -> str:
    n = "/".join(str(x) for x in sorted({int(x) for x in rows["n_seeds"]}))
    return (f"error bars: {100 * LEVEL:.0f}% paired percentile-bootstrap interval over {n} "
            f"seeds ({N_BOOT:,} resamples)")  # fmt: skip


def lever_figure(plt: Any, levers: pd.DataFrame, abl: pd.DataFrame) -> Any | None:
    """What each lever is worth per workload (the protocol's `levers` table, on the groups of
    `abl`, one per workload): TOPAS's paired margin over topas-no-X, 1 - JCT(TOPAS) /
    JCT(without the lever), in percent with its paired bootstrap interval, mean and p99, around
    zero (> 0: the lever helps); filled where the verdict is a win or loss. One panel per
    workload, two to a row; None when no group has a lever."""
    key = ["workload", "engine", "group_label"]
    if levers.empty or abl.empty:
        return None
    groups = abl.drop_duplicates("group")[[*key, "group"]]
    t = levers[levers["role"] == "ablation"].merge(groups, on=key)
    if t.empty:
        return None
    workloads = list(dict.fromkeys(t["workload"]))
    cols = min(2, len(workloads))
    nrows = -(-len(workloads) // cols)
    tall = nrows * (0.42 * max(t.groupby("workload")["other_name"].nunique()) + 1.4) + 1.8
    fig, axes = plt.subplots(nrows, cols, squeeze=False, figsize=(PAGE_WIDTH_IN, tall))
    _, own = common_setting(abl)
    marks = {"mean": ("o", "#0072B2", 0.14), "p99": ("s", "#E69F00", -0.14)}
    for ax, w in zip(axes.flat, workloads, strict=False):
        d = t[t["workload"] == w]
        names = list(dict.fromkeys(d["other_name"]))[::-1]
        for m, (marker, colour, dy) in marks.items():
            e = d[d["metric"] == m].set_index("other_name").reindex(names)
            y = 100 * e["margin"].to_numpy(dtype=float)
            lo, hi = 100 * e["lo"].to_numpy(dtype=float), 100 * e["hi"].to_numpy(dtype=float)
            spread = np.nan_to_num(np.vstack([y - lo, hi - y]).clip(min=0))
            for k, word in enumerate(e["verdict"]):
                face = colour if word in ("win", "loss") else "white"
                ax.errorbar([y[k]], [k + dy], xerr=spread[:, k : k + 1], fmt=marker,
                            color=colour, markerfacecolor=face, markersize=6, capsize=3,
                            label=f"{m} JCT")  # fmt: skip
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(names)), [n.removeprefix("topas-") for n in names], fontsize=8)
        ax.set_ylim(-0.6, len(names) - 0.4)
        right = ax.secondary_yaxis("right")
        e = d.pivot_table(index="other_name", columns="metric", values="margin").reindex(names)
        right.set_yticks(range(len(names)), [f"{100 * a:+.1f}% | {100 * b:+.1f}%"
                                             for a, b in zip(e["mean"], e["p99"], strict=True)],
                         fontsize=8)  # fmt: skip
        right.tick_params(length=0)
        label = own[str(d.iloc[0]["group"])]
        ax.set_title(w + (f"\n{label}" if label != "-" else ""), fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
        ax.set_xlabel("margin (%), > 0: the lever helps", fontsize=8)
    for ax in list(axes.flat)[len(workloads) :]:
        ax.set_visible(False)
    legend_below(fig, [axes.flat[0]])
    shared, _ = common_setting(abl)
    suptitle(fig, "What each of TOPAS's levers is worth: TOPAS against TOPAS without it "
             "(topas-no-X), paired margin 1 - JCT(TOPAS) / JCT(without), mean | p99 on the "
             f"right; {shared}\n{_seeds(abl)}; filled: a win or loss "
             "after Holm's correction over the levers table, hollow: a tie",
             fontsize=9)  # fmt: skip
    return fig
