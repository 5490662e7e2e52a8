"""The timeline figure: what TOPAS does differently from the best baselines over one run.

For one run of each scheduler (same workload sample and seed), panels that separate them
instead of drawing three near-identical lines on top of each other:

- tasks in the system (arrived, not finished), exact steps from `tasks.parquet`; the area
  between TOPAS and the best baseline is shaded: its integral is the difference in total JCT
  (Little's law), green where TOPAS holds fewer tasks, red where it holds more;
- calls waiting for admission (`waiting`, duration-weighted per time bin);
- preemptions so far (`decisions.parquet`): TOPAS preempts, the baselines do not;
- which agents' prefixes are resident on the GPU, one strip per scheduler (`resident_agents`:
  share of each time bin an agent's prefix was resident);
- KV tokens in use against the budget (labelled).

Bins average each iteration's value weighted by its duration, so tens of thousands of
iterations draw as readable lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from topas_bench.analysis.collect import Collection
from topas_bench.analysis.curves import identical_groups
from topas_bench.analysis.plotting import PAGE_WIDTH_IN, setting_title, short, suptitle
from topas_bench.results import read_table

BINS = 240
#: Set against TOPAS: the group's best baselines (mean, then p99), then Parrot (application
#: FCFS, the strongest baseline on MetaGPT-TL in the paper) and LPM (SGLang's cache-first
#: order); at most three schedulers in all.
FALLBACK = ("parrot", "lpm")
STYLES = ("-", "--", ":")
#: Share of the run the detail panels show.
WINDOW = 0.2


def binned(tl: pd.DataFrame, values: np.ndarray, edges: np.ndarray, state: bool) -> np.ndarray:
    """Duration-weighted mean of `values` per time bin, each iteration row counted in every bin
    it overlaps (a 30 s decode run spans many bins). Where nothing ran, a `state` (what the
    cache holds) keeps its last value and an activity (the batch) is 0."""
    order = np.argsort(tl["t_s"].to_numpy(dtype=float), kind="stable")
    start = tl["t_s"].to_numpy(dtype=float)[order]
    end = start + tl["duration_s"].to_numpy(dtype=float)[order]
    end = np.minimum(end, np.append(start[1:], np.inf))  # rows never overlap
    v = np.asarray(values, dtype=float)[order]
    # integrals from the first row on, piecewise linear through each row, flat across gaps
    xs = np.column_stack([start, end]).ravel()
    work = np.concatenate([[0.0], np.cumsum(v * (end - start))])
    busy = np.concatenate([[0.0], np.cumsum(end - start)])
    f = np.interp(edges, xs, np.column_stack([work[:-1], work[1:]]).ravel())
    w = np.interp(edges, xs, np.column_stack([busy[:-1], busy[1:]]).ravel())
    dw = np.diff(w)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(dw > 1e-12, np.diff(f) / dw, np.nan)
    if not state:
        return np.nan_to_num(means)
    filled: np.ndarray = pd.Series(means).ffill().fillna(0.0).to_numpy()
    return filled


def resident_agents_of(tl: pd.DataFrame) -> list[str]:
    names = {a for s in tl["resident_agents"] for a in str(s).split("|") if a}
    return sorted(names)


def residency(tl: pd.DataFrame, agents: list[str], edges: np.ndarray) -> np.ndarray:
    """agents x bins: the share of each bin in which the agent's prefix was resident."""
    sets = [set(str(s).split("|")) for s in tl["resident_agents"]]
    rows = [np.array([a in s for s in sets], dtype=float) for a in agents]
    return np.array([binned(tl, r, edges, state=True) for r in rows]).reshape(len(agents), -1)


def in_system(tasks: pd.DataFrame, times: np.ndarray) -> np.ndarray:
    """Tasks arrived by and not finished by each of `times`."""
    arrived = np.searchsorted(np.sort(tasks["arrival_s"].to_numpy(dtype=float)), times, "right")
    done = np.searchsorted(np.sort(tasks["finish_s"].to_numpy(dtype=float)), times, "right")
    out: np.ndarray = arrived - done
    return out


def shown_schedulers(g: pd.DataFrame) -> list[str]:
    """TOPAS and up to two others (`FALLBACK`): [] when the group has no TOPAS or nothing to
    set against it."""
    present = list(g["scheduler"])
    if "topas" not in present:
        return []
    first = g.iloc[0]
    wanted = [first.get("best_baseline_mean"), first.get("best_baseline_p99"), *FALLBACK]
    others = [s for s in dict.fromkeys(wanted) if isinstance(s, str) and s in present]
    return ["topas", *others[:2]] if others else []


def busiest_window(times: np.ndarray, gap: np.ndarray, share: float) -> tuple[float, float]:
    """The window of `share` of the run where the schedulers' tasks in the system differ most
    (`gap`: |difference| at each of `times`, evenly spaced)."""
    n = max(1, int(len(times) * share))
    sums = np.convolve(gap, np.ones(n), mode="valid")
    i = int(np.argmax(sums))  # first maximum: deterministic
    return float(times[i]), float(times[min(i + n, len(times) - 1)])


def timeline_figure(
    plt: Any, coll: Collection, rows: pd.DataFrame, group: str, palette: dict[str, Any]
) -> Any | None:
    """TOPAS against the group's best baselines on its first common seed: an overview of the
    whole run, then the window where they differ most; None when the group has no TOPAS,
    nothing to set against it, or runs without a timeline."""
    g = rows[rows["group"] == group]
    shown = shown_schedulers(g)
    if not shown:
        return None
    seed = int(str(g.iloc[0]["seeds"]).split(",")[0])
    runs = coll.runs
    data: dict[str, dict[str, pd.DataFrame]] = {}
    for s in shown:
        pick = runs[(runs["group"] == group) & (runs["scheduler"] == s) & (runs["seed"] == seed)]
        path = Path(pick["path"].iloc[0])
        data[s] = {t: read_table(path, t) for t in ("timeline", "tasks", "decisions")}
    if any(d["timeline"].empty for d in data.values()):
        return None
    # schedulers that ran the very same schedule draw as one line, named together
    finishes = {s: d["tasks"].sort_values("task_id")["finish_s"].to_numpy(dtype=float)
                for s, d in data.items()}  # fmt: skip
    same = identical_groups(finishes)
    names = {g[0]: " = ".join(short(s) for s in g) for g in same}  # `name[…]`: the report has it
    shown = [g[0] for g in same]
    if len(shown) == 1:
        return None  # one schedule: nothing to set against TOPAS
    run_start = min(float(d["tasks"]["arrival_s"].min()) for d in data.values())
    run_end = max(float(d["tasks"]["finish_s"].max()) for d in data.values())
    full = np.linspace(run_start, run_end, 8 * BINS)
    counts = {s: in_system(d["tasks"], full) for s, d in data.items()}
    base = shown[1]
    start, end = busiest_window(full, np.abs(counts["topas"] - counts[base]), WINDOW)
    label = {s: names[s] for s in shown}
    other = short(base)
    edges = np.linspace(start, end, BINS + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    agents = sorted({a for d in data.values() for a in resident_agents_of(d["timeline"])})
    strip_h = max(0.6, 0.16 * len(agents))
    heights = [1.3, 0.35, 2.0, 1.4, 1.2, *([strip_h] * len(shown)), 1.6]
    fig, axes = plt.subplots(len(heights), 1, figsize=(PAGE_WIDTH_IN, sum(heights) + 1.8),
                             gridspec_kw={"height_ratios": heights})  # fmt: skip
    style = {s: {"color": palette.get(s), "linestyle": STYLES[i], "linewidth": 1.8 - 0.3 * i}
             for i, s in enumerate(shown)}  # fmt: skip
    ax = axes[0]
    for s in reversed(shown):  # TOPAS drawn last, on top
        ax.step(full, counts[s], where="post", label=label[s], **style[s])
    ax.axvspan(start, end, color="gold", alpha=0.3, linewidth=0, label="window drawn below")
    ax.set_xlim(run_start, run_end)
    ax.set_ylabel("tasks in the\nsystem, whole run", fontsize=9)
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.02), ncol=len(shown) + 1, fontsize=8,
              frameon=False)  # fmt: skip
    axes[1].set_visible(False)  # a gap: the panels below share another time axis
    detail = axes[2:]
    for a in detail[1:]:
        a.sharex(detail[0])
    ax = detail[0]
    times = np.linspace(start, end, 4 * BINS)
    near = {s: in_system(d["tasks"], times) for s, d in data.items()}
    for s in reversed(shown):
        ax.step(times, near[s], where="post", **style[s])
    for where, colour, word in ((near[base] >= near["topas"], "tab:green", "fewer"),
                                (near[base] < near["topas"], "tab:red", "more")):  # fmt: skip
        ax.fill_between(times, near["topas"], near[base], where=where, step="post",
                        color=colour, alpha=0.3, linewidth=0,
                        label=f"topas holds {word} tasks than {other}")  # fmt: skip
    ax.set_xlim(start, end)
    ax.set_ylabel("tasks in the system\n(arrived, not finished)", fontsize=9)
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.02), ncol=2, fontsize=8, frameon=False)
    ax = detail[1]
    for s in reversed(shown):
        tl = data[s]["timeline"]
        w = binned(tl, tl["waiting"].to_numpy(dtype=float), edges, state=True)
        ax.step(centers, w, where="mid", **style[s])
    ax.set_ylim(bottom=0, top=max(1.0, ax.get_ylim()[1]))
    ax.set_ylabel("calls waiting\nfor admission", fontsize=9)
    ax = detail[2]
    most = 0.0
    for s in reversed(shown):
        dec = data[s]["decisions"]
        t = np.concatenate([[run_start], dec["t_s"].to_numpy(dtype=float), [run_end]])
        n = np.concatenate([[0], np.cumsum(dec["preempt"].to_numpy(dtype=float))])
        ax.step(t, np.append(n, n[-1]), where="post", **style[s])
        most = max(most, float(n[-1]))
    ax.set_ylim(-0.05 * max(1.0, most), 1.1 * max(1.0, most))
    if most == 0:
        ax.text(0.5, 0.5, "no preemptions in this run", transform=ax.transAxes, ha="center",
                fontsize=8, color="gray")  # fmt: skip
    ax.set_ylabel("preemptions\nsince the start", fontsize=9)
    for i, s in enumerate(shown):
        ax = detail[3 + i]
        res = residency(data[s]["timeline"], agents, edges)
        ax.imshow(res, aspect="auto", cmap="Greys", vmin=0, vmax=1, interpolation="nearest",
                  extent=(start, end, len(agents) - 0.5, -0.5))  # fmt: skip
        ax.set_yticks(range(len(agents)), [a[:14] for a in agents], fontsize=8)
        ax.set_ylabel(f"{label[s].replace(' = ', chr(10))}:\nresident\nprefixes", fontsize=8,
                      color=palette.get(s))  # fmt: skip
        ax.grid(False)
    ax = detail[-1]
    for s in reversed(shown):
        tl = data[s]["timeline"]
        kv = binned(tl, tl["kv_used_tokens"].to_numpy(dtype=float), edges, state=False)
        ax.step(centers, kv, where="mid", **style[s])
    budget = int(g.iloc[0]["kv_budget_tokens"])
    ax.axhline(budget, color="black", linewidth=0.8, linestyle="--")
    ax.annotate(f"KV budget {budget:,} tokens", (end, budget), xytext=(-4, 3), ha="right",
                textcoords="offset points", fontsize=8)  # fmt: skip
    ax.set_ylim(0, budget * 1.15)
    ax.set_ylabel("KV tokens\nin use", fontsize=9)
    for a in detail[:-1]:
        a.tick_params(labelbottom=False)
    ax.set_xlabel(f"time (s), window {start:,.0f}-{end:,.0f} s\nwaiting, residency and KV: "
                  f"duration-weighted means over {BINS} bins", fontsize=9)  # fmt: skip
    first = g.iloc[0]
    suptitle(fig, f"{first['workload']}: {' vs '.join(label.values())} over one run (seed {seed}); "
             f"{setting_title(first)}\nTop: the whole run. Below: the {100 * WINDOW:.0f}% of "
             f"it where topas and {other} differ most. Shaded: tasks topas holds fewer (green) "
             f"or more (red) than {other}; the area is their difference in total JCT.",
             fontsize=9)  # fmt: skip
    return fig
