"""The timeline figure: what TOPAS does differently from Parrot and LPM over one run.

For one run of each (same workload sample and seed), per time bin: resident agent prefixes
(how many agents' system prompts are on the GPU), batch size (requests in the iteration), agents
per batch (distinct agents among the batch's requests: the `batch_agents` timeline column; runs
recorded without it get a note instead of that panel) and KV use against the budget. Bins
average each iteration's value weighted by its duration, so thousands of iterations draw as
readable lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from topas_bench.analysis.collect import Collection
from topas_bench.results import read_table

BINS = 240
#: TOPAS against Parrot (application-level FCFS, the strongest baseline on MetaGPT-TL in the
#: paper) and LPM (SGLang's cache-first order); the best baseline stands in when a tree has
#: neither.
SHOWN = ("topas", "parrot", "lpm")


def _binned(tl: pd.DataFrame, values: np.ndarray, edges: np.ndarray, state: bool) -> np.ndarray:
    """Duration-weighted mean of `values` per time bin. Where nothing ran, a `state` (what the
    cache holds) keeps its last value and an activity (the batch) is 0."""
    start = tl["t_s"].to_numpy(dtype=float)
    dur = tl["duration_s"].to_numpy(dtype=float)
    mid = start + dur / 2
    idx = np.clip(np.searchsorted(edges, mid, side="right") - 1, 0, len(edges) - 2)
    weight = np.bincount(idx, weights=dur, minlength=len(edges) - 1)
    total = np.bincount(idx, weights=dur * values, minlength=len(edges) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        binned = np.where(weight > 0, total / weight, np.nan)
    if not state:
        return np.nan_to_num(binned)
    filled: np.ndarray = pd.Series(binned).ffill().to_numpy()
    return filled


def _resident(tl: pd.DataFrame) -> np.ndarray:
    return np.array([len([a for a in str(s).split("|") if a]) for s in tl["resident_agents"]])


def timeline_figure(
    plt: Any, coll: Collection, rows: pd.DataFrame, group: str, palette: dict[str, Any]
) -> Any | None:
    """TOPAS, Parrot and LPM (or the best baseline) on the group's first common seed; None when
    the group has neither TOPAS nor a baseline to set against it."""
    g = rows[rows["group"] == group]
    present = set(g["scheduler"])
    others = [s for s in SHOWN[1:] if s in present]
    if not others:
        others = [str(g.iloc[0]["best_baseline_mean"])]
    shown = [s for s in (SHOWN[0], *others) if s and s in present]
    if len(shown) < 2 or shown[0] != SHOWN[0]:
        return None
    seed = int(str(g.iloc[0]["seeds"]).split(",")[0])
    runs = coll.runs
    tables = {}
    for s in shown:
        pick = runs[(runs["group"] == group) & (runs["scheduler"] == s) & (runs["seed"] == seed)]
        tables[s] = read_table(Path(pick["path"].iloc[0]), "timeline")
    if any(t.empty for t in tables.values()):
        return None
    end = max(float((t["t_s"] + t["duration_s"]).max()) for t in tables.values())
    start = min(float(t["t_s"].min()) for t in tables.values())
    edges = np.linspace(start, end, BINS + 1)
    centers = (edges[:-1] + edges[1:]) / 2
    has_agents = all("batch_agents" in t for t in tables.values())
    panels = [
        ("resident agent prefixes", _resident, True),
        ("batch size (requests)", lambda t: t["batch"].to_numpy(dtype=float), False),
    ]
    if has_agents:
        panels.append(
            ("agents per batch", lambda t: t["batch_agents"].to_numpy(dtype=float), False)
        )
    panels.append(("KV tokens in use", lambda t: t["kv_used_tokens"].to_numpy(dtype=float), True))
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.3 * len(panels) + 0.8), sharex=True,
                             squeeze=False)  # fmt: skip
    for ax, (label, fn, state) in zip(axes[:, 0], panels, strict=True):
        for s, t in reversed(tables.items()):  # TOPAS drawn last, on top
            ax.step(centers, _binned(t, fn(t), edges, state), where="mid", label=s,
                    color=palette.get(s), linewidth=1.1, alpha=0.9)  # fmt: skip
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
    budget = int(g.iloc[0]["kv_budget_tokens"])
    axes[-1, 0].axhline(budget, color="black", linewidth=0.8, linestyle="--", label="KV budget")
    axes[-1, 0].set_xlabel(f"time (s); each point: the duration-weighted mean over {BINS} bins")
    axes[0, 0].legend(loc="upper right", fontsize=8)
    first = g.iloc[0]
    note = "" if has_agents else (
        "\n(agents per batch: not drawn, these runs' timelines have no batch_agents column)"
    )  # fmt: skip
    fig.suptitle(
        f"{first['workload']}: {' vs '.join(shown)}, seed {seed} ({first['group_label']})" + note,
        fontsize=10,
    )
    return fig
