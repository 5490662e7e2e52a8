"""The nightly's history: one JSON series per workload and scheduler, a trend plot, a check.

`append` adds a report's rows to ``DIR/<workload>/<scheduler>.json``::

    {"workload": "dag4", "scheduler": "topas", "points": [
      {"date": "2026-12-01", "revision": "ab12cd", "setting": "load 0.8, ...", "n_seeds": 5,
       "mean_jct_s": [value, low, high], "p99_jct_s": [...], "goodput_tps": [...],
       "reduction_mean": [...], "reduction_p99": [...]}, ...]}

(values with their 95% bootstrap interval over seeds; a point of the same date, revision and
setting is replaced, so a rerun night does not count twice). `check` flags a setting whose
TOPAS margin (reduction vs the best baseline) fell from the previous point by more than the
seed-to-seed noise the two points measured (their half-widths in quadrature). `plot` draws
each workload's margins and JCTs over the nights.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from topas_bench.analysis.report import Report
from topas_bench.errors import TopasError

SERIES = ("mean_jct_s", "p99_jct_s", "goodput_tps", "reduction_mean", "reduction_p99")
MARGINS = {"reduction_mean": "mean", "reduction_p99": "p99"}


def _triple(row: pd.Series, col: str) -> list[float | None]:
    vals = [row.get(col), row.get(f"{col}_lo"), row.get(f"{col}_hi")]
    return [None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)
            for v in vals]  # fmt: skip


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.[]=," else "_" for c in name)


def append(rep: Report, directory: Path, date: str, revision: str) -> list[Path]:
    """Add every row of `rep` as a point of its workload's and scheduler's series."""
    written = []
    for (workload, scheduler), rows in rep.rows.groupby(["workload", "scheduler"], sort=False):
        path = directory / _safe(str(workload)) / f"{_safe(str(scheduler))}.json"
        doc = _read(path) or {"workload": workload, "scheduler": scheduler, "points": []}
        for _, r in rows.iterrows():
            point = {"date": date, "revision": revision, "setting": str(r["group_label"]),
                     "n_seeds": int(r["n_seeds"])} | {c: _triple(r, c) for c in SERIES}  # fmt: skip
            key = (date, revision, point["setting"])
            doc["points"] = [
                p for p in doc["points"] if (p["date"], p["revision"], p["setting"]) != key
            ] + [point]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        os.replace(tmp, path)
        written.append(path)
    return written


def _read(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        doc: dict[str, Any] = json.loads(path.read_text())
        if not isinstance(doc.get("points"), list):
            raise ValueError("no `points` list")
    except (OSError, ValueError) as e:
        raise TopasError(f"{path}: unreadable history series ({e})") from None
    return doc


def load(directory: Path) -> pd.DataFrame:
    """Every point of every series under `directory`, one row per point and series column."""
    if not directory.is_dir():
        raise TopasError(f"{directory}: no history here")
    rows = []
    for path in sorted(directory.glob("*/*.json")):
        doc = _read(path) or {}
        for i, p in enumerate(doc.get("points", [])):
            row = {"workload": doc["workload"], "scheduler": doc["scheduler"], "order": i}
            row |= {k: p[k] for k in ("date", "revision", "setting")}
            for c in SERIES:
                v, lo, hi = p.get(c) or [None, None, None]
                row |= {c: _f(v), f"{c}_lo": _f(lo), f"{c}_hi": _f(hi)}
            rows.append(row)
    if not rows:
        raise TopasError(f"{directory}: no history series (workload/scheduler.json) here")
    return pd.DataFrame(rows)


def _f(v: Any) -> float:
    return math.nan if v is None else float(v)


@dataclass(frozen=True)
class Drop:
    workload: str
    setting: str
    metric: str
    before: float
    after: float
    noise: float

    def describe(self) -> str:
        return (
            f"{self.workload} ({self.setting}) TOPAS {self.metric} margin "
            f"{100 * self.before:.1f}% -> {100 * self.after:.1f}% (noise {100 * self.noise:.1f}%)"
        )


def check(history: pd.DataFrame) -> list[Drop]:
    """TOPAS margins that fell from the previous point of their setting beyond the noise."""
    drops = []
    topas = history[history["scheduler"] == "topas"]
    for (workload, setting), s in topas.groupby(["workload", "setting"], sort=False):
        s = s.sort_values(["date", "order"])
        if len(s) < 2:
            continue
        prev, last = s.iloc[-2], s.iloc[-1]
        for col, m in MARGINS.items():
            noise = math.hypot(_half(prev, col), _half(last, col))
            if math.isnan(noise):
                continue
            if last[col] < prev[col] - noise:
                drops.append(Drop(str(workload), str(setting), m, prev[col], last[col], noise))
    return drops


def _half(r: pd.Series, col: str) -> float:
    return (float(r[f"{col}_hi"]) - float(r[f"{col}_lo"])) / 2


def plot(history: pd.DataFrame, out: Path, formats: tuple[str, ...] = ("png", "svg")) -> list[Path]:
    """Per workload: TOPAS's margins in percent (with intervals) and every scheduler's mean
    JCT, by night, one column per setting (named above it), two to a row."""
    from matplotlib.ticker import PercentFormatter

    from topas_bench.analysis.figures import MAIN
    from topas_bench.analysis.plotting import (
        PAGE_WIDTH_IN,
        legend_below,
        palette_for,
        pyplot,
        save,
        suptitle,
    )

    plt = pyplot()
    out.mkdir(parents=True, exist_ok=True)
    written = []
    palette = palette_for(history["scheduler"].unique())
    for workload, w in history.groupby("workload", sort=False):
        settings = list(dict.fromkeys(w["setting"]))
        cols = min(2, len(settings))  # settings wrap two to a row: page width
        blocks = -(-len(settings) // cols)
        fig = plt.figure(figsize=(PAGE_WIDTH_IN, 8.5 * blocks + 1.2))
        subs = fig.subfigures(blocks, cols, squeeze=False)
        for sub in subs.flat[len(settings) :]:
            sub.set_visible(False)
        jcts = []
        for sub, setting in zip(subs.flat, settings, strict=False):
            axes = sub.subplots(3, 1, sharex=True)
            jcts.append(axes[2])
            d = w[w["setting"] == setting]
            nights = sorted(dict.fromkeys(zip(d["date"], d["revision"], strict=True)))
            x = {n: i for i, n in enumerate(nights)}
            t = d[d["scheduler"] == "topas"]
            for ax, (col, m) in zip(axes, MARGINS.items(), strict=False):
                xs = [x[(a, b)] for a, b in zip(t["date"], t["revision"], strict=True)]
                ax.plot(xs, 100 * t[col], marker="o", color=palette.get("topas"))
                ax.fill_between(xs, 100 * t[f"{col}_lo"], 100 * t[f"{col}_hi"], alpha=0.2,
                                color=palette.get("topas"))  # fmt: skip
                ax.axhline(0, color="black", linewidth=0.8)
                ax.yaxis.set_major_formatter(PercentFormatter(decimals=0))
                ax.set_ylabel(f"TOPAS {m} JCT\nreduction vs best\nbaseline", fontsize=8)
                ax.tick_params(labelsize=8)
            ax = axes[2]
            for sched, s in d[d["scheduler"].isin(MAIN)].groupby("scheduler", sort=False):
                xs = [x[(a, b)] for a, b in zip(s["date"], s["revision"], strict=True)]
                ax.plot(xs, s["mean_jct_s"], marker=".", label=sched, color=palette.get(sched))
            ax.set_ylabel("mean JCT (s)", fontsize=8)
            ax.set_xticks(range(len(nights)), [f"{a}\n{b[:7]}" for a, b in nights], fontsize=8)
            ax.tick_params(labelsize=8)
            suptitle(sub, setting, fontsize=8)
        legend_below(fig, jcts)
        suptitle(fig, f"{workload}: nightly trend, one column per setting (bands: 95% "
                 "bootstrap intervals over seeds)")  # fmt: skip
        written += save(plt, fig, out, _safe(str(workload)), formats)
    return written
