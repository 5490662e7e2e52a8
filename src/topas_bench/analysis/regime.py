"""The regime map (issue 21): where TOPAS's lever pays, per workload, over KV budget x load x
output length (`results/regime-map.toml`; docs/evaluation.md, "Regime map: how to run it").

`regime_table` has one row per TOPAS group of every workload whose tree holds a load x
KV-budget grid for TOPAS (`curves.regime_grids`): the cell's setting (output scale, KV budget
in tokens and as a multiple of the agent-prefix working set, `sweep.units`, load and rate),
TOPAS's mean and p99 JCT margin over the best other scheduler of the group (any scheduler that
is neither TOPAS nor one of its ablations: the report's `reduction_any_*`, paired 95%
bootstrap over seeds), TOPAS's reduction against each of its ablations present (e.g.
``vs_topas-no-pins_mean``; positive: the lever helps), `residency_pays` (TOPAS beats
`topas-no-pins` on mean JCT beyond the interval: its low end is above 0), and the mechanism of
TOPAS and of the best other scheduler, averaged over the group's seeds: decode batch size and
distinct agents per decode batch (weighted by decode steps, from `timeline.parquet`), the share
of prompt tokens served from cache and preemptions per run.

`regime_margin` draws one figure per workload: a heat map of TOPAS's margin per (KV multiple,
load) cell, one column of panels per output scale, mean JCT above and p99 below, the cells
where residency pays outlined. `regime_markdown` is the mechanism table.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pandas as pd

from topas_bench.analysis.bootstrap import reduction_ci
from topas_bench.analysis.collect import Collection
from topas_bench.analysis.curves import regime_grids, x_axis
from topas_bench.analysis.plotting import suptitle
from topas_bench.errors import TopasError
from topas_bench.schedulers.registry import ABLATIONS
from topas_bench.workloads.registry import OUTPUT_SCALE

METRICS = (("mean_jct_s", "mean"), ("p99_jct_s", "p99"))
#: The ablation whose loss to TOPAS means "residency pays" (no residency choice at all).
NO_PINS = "topas-no-pins"
MECHANISM = ("decode_batch", "agents_per_batch", "hit_rate", "preemptions")
TIMELINE = ["kind", "steps", "batch", "batch_agents"]
REQUESTS = ["cached_tokens", "prompt_tokens", "preemptions"]


def regime_table(coll: Collection, rows: pd.DataFrame) -> pd.DataFrame:
    """One row per TOPAS group of every workload with a grid (module docstring)."""
    out: list[dict[str, Any]] = []
    runs = coll.runs
    for workload, wrows in rows.groupby("workload", sort=False):
        if not regime_grids(wrows):
            continue
        for group, g in wrows.groupby("group", sort=False):
            topas = g[g["scheduler"] == "topas"]
            if topas.empty:
                continue
            out.append(_cell(str(workload), topas.iloc[0], g, runs[runs["group"] == group]))
    return pd.DataFrame(out)


def _cell(workload: str, t: pd.Series, g: pd.DataFrame, runs: pd.DataFrame) -> dict[str, Any]:
    try:  # a run tree's group is its identity as JSON; a report's rows may carry none
        ident = json.loads(str(t["group"]))
    except ValueError:
        ident = {"workload": workload}
    if not isinstance(ident, dict):
        ident = {"workload": workload}
    params = dict(ident.get("workload_params", {}))
    budget = int(t["kv_budget_tokens"])
    row: dict[str, Any] = {
        "workload": workload, "group": t["group"], "output_scale": float(params.get(OUTPUT_SCALE,
        1.0)), "kv_budget_tokens": budget, "kv_multiple": _multiple(ident, budget),
        "load": t["load"], "rate_per_s": t["rate_per_s"], "seeds": t["seeds"],
    }  # fmt: skip
    for _, m in METRICS:
        row[f"best_other_{m}"] = t[f"best_any_{m}"]
        for s in ("", "_lo", "_hi"):
            row[f"margin_{m}{s}"] = t[f"reduction_any_{m}{s}"]
    seeds = [int(s) for s in str(t["seeds"]).split(",") if s not in ("", "none")]
    here = runs[runs["seed"].isin(seeds)]
    mine = here[here["scheduler"] == "topas"].sort_values("seed")
    for abl in ABLATIONS:
        theirs = here[here["scheduler"] == abl].sort_values("seed")
        if sorted(theirs["seed"]) != sorted(mine["seed"]) or theirs.empty:
            continue
        for col, m in METRICS:
            r = reduction_ci(mine[col].to_numpy(), theirs[col].to_numpy())
            row[f"vs_{abl}_{m}"], row[f"vs_{abl}_{m}_lo"], row[f"vs_{abl}_{m}_hi"] = r
    lo = row.get(f"vs_{NO_PINS}_mean_lo", math.nan)
    row["residency_pays"] = bool(lo > 0) if not math.isnan(lo) else False
    best = str(t["best_any_mean"])
    for who, name in (("topas", "topas"), ("best", best)):
        mech = _mechanism(here[here["scheduler"] == name])
        row |= {f"{who}_{k}": v for k, v in mech.items()}
    return row


def _multiple(ident: dict[str, Any], budget: int) -> float:
    """The budget as a multiple of the workload's working set (NaN when it cannot be read,
    e.g. a trace file that is gone)."""
    from topas_bench.sweep.units import working_set

    try:
        ws = working_set(str(ident["workload"]), dict(ident.get("workload_params", {})))
    except (TopasError, KeyError, OSError):
        return math.nan
    return ws.multiple_of(budget)


def _mechanism(runs: pd.DataFrame) -> dict[str, float]:
    """Per run, then averaged: decode batch size and distinct agents per decode batch
    (weighted by decode steps), prompt tokens served from cache, preemptions."""
    acc = []
    for path in runs["path"]:
        try:
            t = pd.read_parquet(f"{path}/timeline.parquet", columns=TIMELINE)
            r = pd.read_parquet(f"{path}/requests.parquet", columns=REQUESTS)
        except (OSError, ValueError, KeyError):
            continue
        dec = t[t["kind"] == "decode"]
        steps = float(dec["steps"].sum())
        prompt = float(r["prompt_tokens"].sum())
        acc.append((
            float((dec["batch"] * dec["steps"]).sum()) / steps if steps else math.nan,
            float((dec["batch_agents"] * dec["steps"]).sum()) / steps if steps else math.nan,
            float(r["cached_tokens"].sum()) / prompt if prompt else math.nan,
            float(r["preemptions"].sum()),
        ))  # fmt: skip
    if not acc:
        return dict.fromkeys(MECHANISM, math.nan)
    return dict(zip(MECHANISM, np.nanmean(np.array(acc), axis=0).tolist(), strict=True))


def _pct(v: Any, lo: Any, hi: Any) -> str:
    if not isinstance(v, float) or math.isnan(v):
        return "-"
    return f"{100 * v:+.1f}% [{100 * lo:+.0f}, {100 * hi:+.0f}]"


def _x(r: pd.Series) -> str:
    m = r["kv_multiple"]
    return (
        f"x{m:.2f} ({int(r['kv_budget_tokens']):,})"
        if not math.isnan(m)
        else (f"{int(r['kv_budget_tokens']):,}")
    )


def regime_markdown(table: pd.DataFrame) -> str:
    """The regime table as Markdown: per cell, TOPAS's margins, the residency check and the
    mechanism of TOPAS against the best other scheduler."""
    if table.empty:
        return "No regime grid (TOPAS at >= 2 loads x >= 2 KV budgets) in this tree.\n"
    parts = []
    for workload, w in table.groupby("workload", sort=False):
        lines = []
        order = ["output_scale", "kv_budget_tokens", "load", "rate_per_s"]
        for _, r in w.sort_values(order).iterrows():
            lines.append({
                "out": f"x{r['output_scale']:g}", "KV (x W, tokens)": _x(r),
                "load": f"{r['load']:g}", "rate /s": f"{r['rate_per_s']:.4g}",
                "best other": r["best_other_mean"],
                "TOPAS mean": _pct(r["margin_mean"], r["margin_mean_lo"], r["margin_mean_hi"]),
                "TOPAS p99": _pct(r["margin_p99"], r["margin_p99_lo"], r["margin_p99_hi"]),
                "vs no-pins": _pct(*(r.get(f"vs_{NO_PINS}_mean{s}", math.nan)
                                     for s in ("", "_lo", "_hi"))),
                "pays": "yes" if r["residency_pays"] else "",
                "batch T/B": f"{r['topas_decode_batch']:.1f}/{r['best_decode_batch']:.1f}",
                "agents T/B": f"{r['topas_agents_per_batch']:.2f}/"
                              f"{r['best_agents_per_batch']:.2f}",
                "hit T/B": f"{100 * r['topas_hit_rate']:.0f}/{100 * r['best_hit_rate']:.0f}%",
                "preempt T/B": f"{r['topas_preemptions']:.0f}/{r['best_preemptions']:.0f}",
            })  # fmt: skip
        parts.append(f"## {workload}\n\n" + str(pd.DataFrame(lines).to_markdown(index=False)))
    head = (
        "# Regime map\n\nTOPAS's JCT margin over the best other scheduler (not TOPAS or an "
        "ablation; 95% paired bootstrap over seeds), its reduction against `topas-no-pins` "
        "(residency pays: the interval's low end above 0), and the mechanism, TOPAS / the "
        "best other on mean JCT: decode batch size and distinct agents per decode batch "
        "(decode-step weighted), prompt tokens served from cache, preemptions per run. KV: "
        "the budget as a multiple of the agent-prefix working set W (sum of prefixes), "
        "budget = ceil(m x W) + one call's need.\n\n"
    )
    return head + "\n\n".join(parts) + "\n"


def regime_margin(plt: Any, w: pd.DataFrame) -> Any:
    """One workload's heat maps (module docstring)."""
    scales = sorted(w["output_scale"].unique())
    # rows are budget levels: the multiple of W, which is the same across output scales while
    # the tokens are not (one call's need grows with the outputs); the tokens when any multiple
    # is unknown (one kind of level per figure, so the labels are all of one kind)
    multiples = bool(w["kv_multiple"].notna().all())
    w = w.assign(level=w["kv_multiple"].round(3) if multiples else w["kv_budget_tokens"])
    budgets = sorted(w["level"].unique())
    labels = [f"x{y:.2f}" if multiples else f"{int(y):,}" for y in budgets]
    ylabel = "KV budget (x W; tokens in the cell)" if multiples else "KV budget (tokens)"
    col_x, xlabel = x_axis(w)  # load, or the rate when a cell has no load
    if col_x == "load":  # FCFS's, or the best of the sweep's `load_reference`
        xlabel = "load (x the reference schedulers' best saturation rate)"
    loads = sorted(w[col_x].unique())
    fig, axes = plt.subplots(2, len(scales), squeeze=False,
                             figsize=(max(7.0, 2.2 * len(loads) * len(scales) + 3.0),
                                      2 * (0.9 * len(budgets) + 1.6)))  # fmt: skip
    vals = w[[f"margin_{m}" for _, m in METRICS]].to_numpy(dtype=float) * 100
    lim = max(5.0, float(np.nanmax(np.abs(vals)))) if np.isfinite(vals).any() else 5.0
    image = None
    for j, x in enumerate(scales):
        d = w[w["output_scale"] == x]
        for i, (_, m) in enumerate(METRICS):
            ax = axes[i][j]
            z = np.full((len(budgets), len(loads)), np.nan)
            for _, r in d.iterrows():
                a, b = budgets.index(r["level"]), loads.index(r[col_x])
                z[a, b] = 100 * r[f"margin_{m}"]
            image = ax.imshow(z, cmap="RdBu", vmin=-lim, vmax=lim, aspect="auto", origin="lower")
            for _, r in d.iterrows():
                a, b = budgets.index(r["level"]), loads.index(r[col_x])
                v, lo, hi = (100 * r[f"margin_{m}{s}"] for s in ("", "_lo", "_hi"))
                text = "-" if math.isnan(v) else f"{v:+.1f}%\n[{lo:+.0f}, {hi:+.0f}]"
                text += f"\n{int(r['kv_budget_tokens']):,} tok"
                crosses = not (lo > 0 or hi < 0)
                ax.text(b, a, text, ha="center", va="center", fontsize=8,
                        color="white" if abs(v) > 0.55 * lim else "black",
                        fontstyle="italic" if crosses else "normal")  # fmt: skip
                if r["residency_pays"]:
                    ax.add_patch(plt.Rectangle((b - 0.48, a - 0.48), 0.96, 0.96, fill=False,
                                               edgecolor="black", linewidth=2.2))  # fmt: skip
            for a, b in zip(*np.nonzero(np.isnan(z)), strict=True):
                ax.text(b, a, "not run", ha="center", va="center", fontsize=8, color="gray")
            ax.set_xticks(range(len(loads)), [f"{x:.4g}" for x in loads])
            ax.set_yticks(range(len(budgets)), labels if j == 0 else [""] * len(budgets),
                          fontsize=8)  # fmt: skip
            ax.set(ylabel=ylabel if j == 0 else "",
                   title=f"outputs x{x:g}: {m} JCT")  # fmt: skip
            ax.grid(False)
    fig.supxlabel(xlabel, fontsize=9)
    if image is not None:
        fig.colorbar(image, ax=axes, label="TOPAS margin over best other (%)", shrink=0.8)
    first = w.iloc[0]
    suptitle(fig, f"{first['workload']}: regime map. TOPAS's JCT margin over the best other "
             f"scheduler (blue: TOPAS faster), 95% interval over seeds {first['seeds']}, italic "
             "where it includes 0; outlined: residency pays (TOPAS beats topas-no-pins on mean "
             "JCT beyond the interval)")  # fmt: skip
    return fig


__all__ = ["regime_margin", "regime_markdown", "regime_table"]
