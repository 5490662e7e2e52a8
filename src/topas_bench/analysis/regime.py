"""The regime map (issue 21): where TOPAS's lever pays, per workload, over KV budget x load x
output length (`results/regime-map.toml`; docs/evaluation.md, "Regime map: how to run it").

`regime_table` reads one row per run (`protocol.COMPACT`: a report's `runs`, or the committed
`runs.csv.gz`) and has one row per TOPAS group of every workload whose runs span >= 2 KV
budgets and >= 2 loads (or rates): the cell's setting (output scale, KV budget in tokens and
as a multiple of the agent-prefix working set, `units`, load and rate), TOPAS's mean and
p99 JCT margin over the best other scheduler of the group (the lowest seed-averaged value of
any scheduler that is neither TOPAS nor one of its variants, each in its tuned form where the
group has one: `protocol.representatives`), TOPAS's margin over each of its ablations present
(e.g. ``vs_topas-no-pins_mean``; positive: the lever helps), and the mechanism of TOPAS and of
the best other scheduler averaged over the seeds: decode batch size and distinct agents per
decode batch (weighted by decode steps), prefix hit rate and preemptions per run.

Every margin is paired over seeds (`verdict.paired`) and judged within its family, the whole
map (every workload's cells): TOPAS against the best other, per metric (`verdict_mean`,
`verdict_p99`), and TOPAS against each ablation on mean JCT (`verdict_vs_<ablation>`), each
family Holm-corrected (`verdict.verdicts`). `residency` is the no-pins verdict in words:
``pays`` (TOPAS beats topas-no-pins), ``hurts`` or ``tie``.

`regime_margin` draws one figure per workload: a heat map of TOPAS's margin per (KV multiple,
load) cell, one row of panels per output scale, mean JCT left and p99 right, the cells
where residency pays outlined. `regime_markdown` is the mechanism table.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from topas_bench.analysis.curves import x_axis
from topas_bench.analysis.plotting import PAGE_WIDTH_IN, suptitle
from topas_bench.analysis.protocol import GROUP_KEY, is_family, representatives, with_variants
from topas_bench.analysis.verdict import METRICS as VERDICT_METRICS
from topas_bench.analysis.verdict import Paired, paired, verdicts
from topas_bench.schedulers.registry import ABLATIONS

METRICS = tuple((col, m) for m, col in VERDICT_METRICS.items())
#: The ablation whose loss to TOPAS means "residency pays" (no residency choice at all).
NO_PINS = "topas-no-pins"
#: The mechanism columns, per run (`protocol.COMPACT`), averaged over a cell's seeds.
MECHANISM = {"decode_batch": "decode_batch", "agents_per_batch": "agents_per_batch",
             "hit_rate": "prefix_hit_rate", "preemptions": "preemptions"}  # fmt: skip


def _grid_workloads(runs: pd.DataFrame, focus: str) -> list[str]:
    """Workloads whose focus runs span >= 2 KV budgets and >= 2 loads (or rates)."""
    t = runs[runs["scheduler_name"] == focus]
    return [str(w) for w, d in t.groupby("workload", sort=False)
            if d["kv_budget_tokens"].nunique() >= 2 and d["rate_per_s"].nunique() >= 2]  # fmt: skip


def _values(g: pd.DataFrame, label: str) -> pd.DataFrame:
    return g[g["scheduler"] == label].set_index("seed")


def regime_table(runs: pd.DataFrame, focus: str = "topas") -> pd.DataFrame:
    """One row per focus group of every workload with a grid (module docstring)."""
    if runs.empty:
        return pd.DataFrame()
    runs = with_variants(runs, None)
    keep = _grid_workloads(runs, focus)
    rows: list[dict[str, Any]] = []
    families: dict[str, list[tuple[int, Paired]]] = {}
    for key, g in runs[runs["workload"].isin(keep)].groupby(GROUP_KEY, sort=False):
        reps = representatives(g)
        if focus not in reps:
            continue
        mine = _values(g, reps[focus])
        first = mine.iloc[0]
        row: dict[str, Any] = {
            **dict(zip(GROUP_KEY, key, strict=True)), "output_scale": float(first["output_scale"]),
            "kv_budget_tokens": int(first["kv_budget_tokens"]),
            "kv_multiple": float(first["kv_multiple"]), "load": float(first["load"]),
            "rate_per_s": float(first["rate_per_s"]),
            "seeds": ",".join(str(int(s)) for s in sorted(mine.index)),
        }  # fmt: skip
        others = {n: lab for n, lab in reps.items() if not is_family(n, focus)}
        i = len(rows)
        for col, m in METRICS:
            means = {n: float(_values(g, lab)[col].mean()) for n, lab in others.items()}
            if not means:
                continue
            best = min(means, key=lambda n: (means[n], n))
            c = _paired(mine, _values(g, others[best]), col)
            row[f"best_other_{m}"] = best
            row[f"margin_{m}"], row[f"margin_{m}_lo"], row[f"margin_{m}_hi"] = c.margin, c.lo, c.hi
            families.setdefault(f"verdict_{m}", []).append((i, c))
        for abl in ABLATIONS:
            if abl not in reps:
                continue
            theirs = _values(g, reps[abl])
            for col, m in METRICS:
                c = _paired(mine, theirs, col)
                row[f"vs_{abl}_{m}"], row[f"vs_{abl}_{m}_lo"] = c.margin, c.lo
                row[f"vs_{abl}_{m}_hi"] = c.hi
            families.setdefault(f"verdict_vs_{abl}", []).append(
                (i, _paired(mine, theirs, "mean_jct_s"))
            )
        best_name = row.get("best_other_mean")
        best_runs = _values(g, others[best_name]) if best_name else None
        for who, frame in (("topas", mine), ("best", best_runs)):
            for name, col in MECHANISM.items():
                row[f"{who}_{name}"] = float(frame[col].mean()) if frame is not None else math.nan
        rows.append(row)
    table = pd.DataFrame(rows)
    for column, cells in families.items():
        judged = verdicts([c for _, c in cells])
        table[column] = "tie"
        for (i, _), (_, word) in zip(cells, judged, strict=True):
            table.loc[i, column] = word
    if table.empty:
        return table
    pins = table.get(f"verdict_vs_{NO_PINS}")
    words = {"win": "pays", "loss": "hurts"}
    table["residency"] = pins.map(lambda v: words.get(str(v), "tie")) if pins is not None else ""
    table["residency_pays"] = table["residency"] == "pays"
    return table


def _paired(mine: pd.DataFrame, theirs: pd.DataFrame, col: str) -> Paired:
    seeds = sorted(set(mine.index) & set(theirs.index))
    return paired(mine.loc[seeds, col].to_numpy(), theirs.loc[seeds, col].to_numpy())


def _pct(v: Any, lo: Any, hi: Any, word: Any = "") -> str:
    if not isinstance(v, float) or math.isnan(v):
        return "-"
    text = f"{100 * v:+.1f}% [{100 * lo:+.0f}, {100 * hi:+.0f}]"
    return f"**{text} {word}**" if word in ("win", "loss") else text


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
                "TOPAS mean": _pct(r["margin_mean"], r["margin_mean_lo"], r["margin_mean_hi"],
                                   r["verdict_mean"]),
                "TOPAS p99": _pct(r["margin_p99"], r["margin_p99_lo"], r["margin_p99_hi"],
                                  r["verdict_p99"]),
                "vs no-pins": _pct(*(r.get(f"vs_{NO_PINS}_mean{s}", math.nan)
                                     for s in ("", "_lo", "_hi"))),
                "residency": "" if r["residency"] == "tie" else r["residency"],
                "batch T/B": f"{r['topas_decode_batch']:.1f}/{r['best_decode_batch']:.1f}",
                "agents T/B": f"{r['topas_agents_per_batch']:.2f}/"
                              f"{r['best_agents_per_batch']:.2f}",
                "hit T/B": f"{100 * r['topas_hit_rate']:.0f}/{100 * r['best_hit_rate']:.0f}%",
                "preempt T/B": f"{r['topas_preemptions']:.0f}/{r['best_preemptions']:.0f}",
            })  # fmt: skip
        parts.append(f"## {workload}\n\n" + str(pd.DataFrame(lines).to_markdown(index=False)))
    n = len(table)
    head = (
        "# Regime map\n\nTOPAS's JCT margin over the best other scheduler (not TOPAS or one "
        "of its variants, each in its tuned form where it has one; 95% paired bootstrap over "
        "seeds), in bold with its verdict where it wins or loses after a Holm correction over "
        f"the map's {n} cells per metric; its margin over `topas-no-pins` on mean JCT "
        f"(residency pays or hurts: the same correction over the {n} cells), and the "
        "mechanism, TOPAS / the best other on mean JCT: decode batch size and distinct agents "
        "per decode batch (decode-step weighted), prefix hit rate, preemptions per run. KV: "
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
    fig, axes = plt.subplots(len(scales), 2, squeeze=False,
                             figsize=(PAGE_WIDTH_IN,
                                      len(scales) * (0.62 * len(budgets) + 0.9) + 2.4))  # fmt: skip
    vals = w[[f"margin_{m}" for _, m in METRICS]].to_numpy(dtype=float) * 100
    lim = max(5.0, float(np.nanmax(np.abs(vals)))) if np.isfinite(vals).any() else 5.0
    image = None
    for i, x in enumerate(scales):
        d = w[w["output_scale"] == x]
        for j, (_, m) in enumerate(METRICS):
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
                crosses = r.get(f"verdict_{m}", "tie") == "tie"
                ax.text(b, a, text, ha="center", va="center", fontsize=8,
                        color="white" if abs(v) > 0.55 * lim else "black",
                        fontstyle="italic" if crosses else "normal")  # fmt: skip
                if r["residency_pays"]:
                    ax.add_patch(plt.Rectangle((b - 0.48, a - 0.48), 0.96, 0.96, fill=False,
                                               edgecolor="black", linewidth=2.2))  # fmt: skip
            for a, b in zip(*np.nonzero(np.isnan(z)), strict=True):
                ax.text(b, a, "not run", ha="center", va="center", fontsize=8, color="gray")
            ax.set_xticks(range(len(loads)), [f"{v:.4g}" for v in loads], fontsize=8)
            ax.set_yticks(range(len(budgets)), labels if j == 0 else [""] * len(budgets),
                          fontsize=8)  # fmt: skip
            ax.set_title(f"outputs x{x:g}: {m} JCT", fontsize=9)
            ax.grid(False)
    fig.supxlabel(xlabel, fontsize=8)
    fig.supylabel(ylabel, fontsize=8)
    if image is not None:
        bar = fig.colorbar(image, ax=axes, shrink=0.6)
        bar.set_label("TOPAS margin over best other (%)", fontsize=8)
        bar.ax.tick_params(labelsize=8)
    first = w.iloc[0]
    suptitle(fig, f"{first['workload']}: regime map. TOPAS's JCT margin over the best other "
             f"scheduler (blue: TOPAS faster), 95% interval over seeds {first['seeds']}, italic "
             "where it is a tie after Holm's correction over the map; outlined: residency pays "
             "(TOPAS beats topas-no-pins on mean JCT, corrected likewise)", fontsize=9)  # fmt: skip
    return fig


__all__ = ["regime_margin", "regime_markdown", "regime_table"]
