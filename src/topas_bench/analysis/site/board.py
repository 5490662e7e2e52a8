"""One setting's leaderboard as the pages show it (`Board`): every metric's ranked rows as
display text with sort keys, the chart's data, its sentences; and the number formats the pages
share. A report without per-run data gets a leaderboard of its rows alone (`rows_board`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from topas_bench.analysis.protocol import pct
from topas_bench.analysis.site.leaderboard import COLUMNS, FOCUS, METRICS, sentence
from topas_bench.analysis.site.sources import Source
from topas_bench.schedulers.registry import ABLATIONS, BASELINES, PEERS, PEERS_2026


def family(name: str) -> str:
    """The scheduler's family, for colours and the chooser's presets."""
    if name == FOCUS:
        return "topas"
    if name.startswith("topas"):
        return "lever"
    if name in BASELINES:
        return "baseline"
    if name in PEERS_2026:
        return "peer-2026"
    if name in PEERS:
        return "peer"
    return "other"


def num(v: Any) -> float | None:
    """A JSON-safe number (None for NaN)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) or math.isinf(f) else round(f, 6)


def fmt(v: Any, unit: str) -> str:
    f = num(v)
    if f is None:
        return "-"
    return f"{f:,.1f}" if unit == "s" else f"{f:.4f}"


def ci(v: Any, lo: Any, hi: Any, unit: str) -> str:
    if num(lo) is None:
        return fmt(v, unit)
    return f"{fmt(v, unit)} [{fmt(lo, unit)}, {fmt(hi, unit)}]"


def seed_text(seeds: str) -> str:
    """`0,1,2,3` as `0-3`; other lists as they are."""
    try:
        n = sorted(int(x) for x in str(seeds).split(",") if x.strip())
    except ValueError:
        return str(seeds)
    if len(n) > 2 and n == list(range(n[0], n[-1] + 1)):
        return f"{n[0]}-{n[-1]}"
    return ", ".join(map(str, n))


@dataclass
class Board:
    """One setting's leaderboard: every metric's ranking, its sentences and its CSV."""

    id: str
    source: Source
    workload: str
    group_label: str
    rows: pd.DataFrame  # leaderboard.COLUMNS
    setting: str
    seeds: str
    engine: str
    csv: str = ""

    def sentences(self) -> dict[str, str]:
        return {m: sentence(self.rows, m) for m in METRICS}

    def tables(self) -> dict[str, list[dict[str, Any]]]:
        """Per metric, the table's rows: display text and sort keys."""
        wide: dict[tuple[str, str, str], Any] = {
            (str(r["metric"]), str(r["scheduler"]), k): r[k]
            for _, r in self.rows.iterrows()
            for k in ("value", "value_lo", "value_hi")
        }
        out: dict[str, list[dict[str, Any]]] = {}
        for m in METRICS:
            rows = []
            for _, r in self.rows[self.rows["metric"] == m].sort_values("rank").iterrows():
                s = str(r["scheduler"])
                cells = {}
                for mm, (_, _, _, u) in METRICS.items():
                    v = wide.get((mm, s, "value"))
                    text = (ci(v, wide.get((mm, s, "value_lo")), wide.get((mm, s, "value_hi")), u)
                            if mm == m else fmt(v, u))  # fmt: skip
                    cells[mm] = {"text": text, "v": num(v)}
                rows.append({
                    "rank": int(r["rank"]), "scheduler": s, "family": family(s),
                    "form": r["form"], "label": r["label"], "cells": cells,
                    "margin": pct(float(r["margin"]), float(r["lo"]), float(r["hi"])),
                    "margin_v": num(r["margin"]), "verdict": r["verdict"] or "-",
                })  # fmt: skip
            out[m] = rows
        return out

    def chart(self) -> dict[str, Any]:
        """The chart's data: per metric, each scheduler's value and interval, ranked."""
        data: dict[str, Any] = {}
        for m, (_, lower, label, unit) in METRICS.items():
            b = self.rows[self.rows["metric"] == m].sort_values("rank")
            data[m] = {
                "label": label, "unit": unit, "lower": lower,
                "s": list(b["scheduler"]), "f": [family(s) for s in b["scheduler"]],
                "v": [num(v) for v in b["value"]], "lo": [num(v) for v in b["value_lo"]],
                "hi": [num(v) for v in b["value_hi"]], "verdict": list(b["verdict"]),
                "margin": [pct(float(a), float(lo), float(hi))
                           for a, lo, hi in zip(b["margin"], b["lo"], b["hi"], strict=True)],
            }  # fmt: skip
        return data


def rows_board(g: pd.DataFrame) -> pd.DataFrame:
    """A leaderboard from report rows alone (a report without per-run data): ranks and the
    report's intervals, no paired margin and no verdict."""
    g = g[~g["scheduler"].isin(ABLATIONS)]
    records = []
    for m, (col, lower, _, _) in METRICS.items():
        if col not in g:
            continue
        d = g.sort_values(col, ascending=lower, kind="stable")
        leader = str(d.iloc[0]["scheduler"])
        for rank, (_, r) in enumerate(d.iterrows(), start=1):
            records.append({
                "workload": r["workload"], "engine": r.get("engine", ""),
                "group_label": r["group_label"], "metric": m, "rank": rank,
                "scheduler": r["scheduler"], "form": "", "label": r["scheduler"],
                "value": r[col], "value_lo": r.get(f"{col}_lo"), "value_hi": r.get(f"{col}_hi"),
                "n_seeds": r.get("n_seeds"), "leader": leader,
                "verdict": "leader" if rank == 1 else "",
            })  # fmt: skip
    return pd.DataFrame(records).reindex(columns=COLUMNS)
