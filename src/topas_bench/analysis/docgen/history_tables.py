"""Tables of the docs that set results side by side: calibration, demand, what changed
between two revisions, and the regime map's summary."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from topas_bench.analysis.docgen.data import md_table, runs_of, seeds_text, workload_order
from topas_bench.analysis.protocol import (
    cell_text,
    pct,
    versus,
)
from topas_bench.analysis.regime import NO_PINS, regime_table
from topas_bench.errors import TopasError
from topas_bench.schedulers.registry import BASELINES


def regime_summary(root: Path, dir: str) -> str:
    """Per workload of the regime map: the margin's range over its cells, its verdicts, and
    where residency (TOPAS against topas-no-pins) pays or hurts."""
    runs = runs_of(root, dir)
    table = regime_table(runs)
    records = []
    for w in workload_order(list(table["workload"].unique())):
        d = table[table["workload"] == w]
        counts = {m: d[f"verdict_{m}"].value_counts() for m in ("mean", "p99")}
        res = d["residency"].value_counts()
        lever = d[f"vs_{NO_PINS}_mean"] if f"vs_{NO_PINS}_mean" in d else pd.Series(dtype=float)
        records.append({
            "workload": w, "cells": str(len(d)),
            "TOPAS vs best other, mean: range": f"{pct(d['margin_mean'].min())} .. "
                                                f"{pct(d['margin_mean'].max())}",
            "win / tie / loss (mean)": _wtl(counts["mean"]),
            "win / tie / loss (p99)": _wtl(counts["p99"]),
            "residency (vs no-pins): range": f"{100 * lever.min():+.1f} .. "
                                             f"{100 * lever.max():+.1f} pts"
            if not lever.empty else "-",
            "residency pays / tie / hurts": f"{res.get('pays', 0)} / {res.get('tie', 0)} / "
                                            f"{res.get('hurts', 0)}",
            **{f"{name} pays / tie / hurts": _wtl(d[f"verdict_vs_{abl}"].value_counts())
               if f"verdict_vs_{abl}" in d else "-" for abl, name in LEVERS.items()},
        })  # fmt: skip
    n = len(table)
    return md_table(records) + (
        f"\n(Seeds {seeds_text(runs)}, {int(runs['num_tasks'].iloc[0])} tasks per run. Verdicts "
        f"Holm-corrected over the map's {n} cells per metric; each lever (TOPAS against "
        f"{', '.join(['topas-no-pins', *LEVERS])} on mean JCT) likewise over its {n} cells.)\n"
    )


#: The regime summary's lever columns beside residency: ablation -> what it switches off.
LEVERS = {"topas-no-joint": "restriction", "topas-no-preempt": "preemption"}


def _wtl(c: pd.Series) -> str:
    return f"{c.get('win', 0)} / {c.get('tie', 0)} / {c.get('loss', 0)}"


def calibration(root: Path, capacity: str) -> str:
    """Each scheduler's saturation rate per workload from a sweep's capacity.json (the rate
    at which its mean JCT reaches 3x the unloaded one)."""
    path = root / capacity
    try:
        rows = json.loads(path.read_text())["capacities"]
    except (OSError, ValueError, KeyError) as e:
        raise TopasError(f"{path}: unreadable capacity file ({e})") from None
    caps: dict[str, dict[str, float]] = {}
    for r in rows:
        caps.setdefault(r["workload"], {})[r["scheduler"]] = float(r["capacity_tps"])
    names = sorted({s for c in caps.values() for s in c})
    records = []
    for w in workload_order(list(caps)):
        c = caps[w]
        best = min(c, key=lambda s: (-c[s], s))
        records.append({"workload": w, **{s: f"{c[s]:.4g}" if s in c else "-" for s in names},
                        "best": f"{c[best]:.4g} ({best})"})  # fmt: skip
    return md_table(records)


def demand(root: Path, tasks: str = "150", seed: str = "101") -> str:
    """What one task asks of the server, per workload, from its generator: calls, input and
    output tokens per task, the largest prompt."""
    from topas_bench.workloads.registry import generate  # the generators: only this block

    records = []
    for w in ("chain3", "dag4", "dag10-wide", "metagpt-sop", "metagpt-tl"):
        sample = generate(w, num_tasks=int(tasks), seed=int(seed))
        calls = [s for t in sample.tasks for s in t.stages]
        n = len(sample.tasks)
        prompts = [s.prompt_tokens for s in calls]
        outs = [s.output_tokens for s in calls]
        records.append({
            "workload": w, "calls / task": f"{len(calls) / n:.1f}",
            "input tokens / task": f"{sum(prompts) / n:,.0f}",
            "output tokens / task (per call)":
                f"{sum(outs) / n:,.0f} ({sum(outs) / len(calls):,.0f})",
            "largest prompt": f"{max(prompts):,}",
        })  # fmt: skip
    return md_table(records) + f"\n({tasks} tasks of seed {seed}, as generated.)\n"


def _old_claim(r: pd.Series, col: str, against: str) -> str:
    v, lo, hi = (float(r[f"{col}{x}"]) for x in ("", "_lo", "_hi"))
    word = "win" if lo > 0 else "loss" if hi < 0 else "tie"
    return f"{against}: {pct(v, lo, hi)} {word}"


def changes(root: Path, old: str, new: str, focus: str = "topas") -> str:
    """Each headline claim of an earlier report (its report.csv: 5 seeds, an uncorrected
    interval read as a win where it excludes 0) beside what the protocol's runs say now."""
    try:
        before = pd.read_csv(root / old / "report.csv")
    except (OSError, ValueError) as e:
        raise TopasError(f"{root / old / 'report.csv'}: unreadable ({e})") from None
    runs = runs_of(root, new)
    table = versus(runs, focus)
    base = table[table["other_name"].isin(BASELINES)]
    records = []
    for w in workload_order(list(table["workload"].unique())):
        t = before[(before["workload"] == w) & (before["scheduler"] == focus)]
        for m in ("mean", "p99"):
            now = table[(table["workload"] == w) & (table["metric"] == m)]
            nb = base[(base["workload"] == w) & (base["metric"] == m)]
            if t.empty or now.empty or nb.empty:
                continue
            r = t.iloc[0]
            strongest = now.sort_values(["other_value", "other"]).iloc[0]
            best_base = nb.sort_values(["other_value", "other"]).iloc[0]
            records.append({
                "workload": w, "metric": m,
                "then vs best baseline": _old_claim(r, f"reduction_{m}",
                                                    str(r[f"best_baseline_{m}"])),
                "now vs best baseline": f"{best_base['other_name']}: {cell_text(best_base, False)}",
                "then vs best of all": _old_claim(r, f"reduction_any_{m}", str(r[f"best_any_{m}"])),
                "now vs best of all": f"{strongest['other_name']}: {cell_text(strongest, False)}",
            })  # fmt: skip
    seeds = ",".join(
        str(s) for s in sorted({int(x) for x in str(before["seeds"].iloc[0]).split(",")})
    )
    return md_table(records) + (
        f"\n(Then: {old}/report.csv, seeds {seeds}, {focus} with its defaults against every "
        "scheduler's defaults, a win wherever the 95% interval excluded 0, uncorrected. Now: "
        f"seeds {seeds_text(runs)}, each scheduler in its tuned form where it has one, verdicts "
        f"Holm-corrected over the {len(table)} cells of {focus} against every other.)\n"
    )


def changes_regime(root: Path, old: str, new: str) -> str:
    """The regime map's counts then (regime.csv of an earlier run: uncorrected intervals) and
    now (the protocol's corrected verdicts)."""
    try:
        before = pd.read_csv(root / old / "regime.csv")
    except (OSError, ValueError) as e:
        raise TopasError(f"{root / old / 'regime.csv'}: unreadable ({e})") from None
    now = regime_table(runs_of(root, new))
    records = []
    for w in workload_order(list(set(before["workload"]) | set(now["workload"]))):
        b, n = before[before["workload"] == w], now[now["workload"] == w]
        bounds = zip(b["margin_mean_lo"], b["margin_mean_hi"], strict=True)
        then = ["win" if lo > 0 else "loss" if hi < 0 else "tie" for lo, hi in bounds]
        pins_lo, pins_hi = b.get(f"vs_{NO_PINS}_mean_lo"), b.get(f"vs_{NO_PINS}_mean_hi")
        pays = int((pins_lo > 0).sum()) if pins_lo is not None else 0
        hurts = int((pins_hi < 0).sum()) if pins_hi is not None else 0
        res = n["residency"].value_counts() if not n.empty else pd.Series(dtype=int)
        records.append({
            "workload": w,
            "then: win / tie / loss (mean)": _wtl(pd.Series(then).value_counts()) if then else "-",
            "now: win / tie / loss (mean)": _wtl(n["verdict_mean"].value_counts())
            if not n.empty else "-",
            "then: residency pays / hurts": f"{pays} / {hurts}" if len(b) else "-",
            "now: residency pays / hurts": f"{res.get('pays', 0)} / {res.get('hurts', 0)}"
            if not n.empty else "-",
        })  # fmt: skip
    return md_table(records) + (
        f"\n(Then: {old}/regime.csv, 5 seeds, each cell's 95% interval read on its own. Now: "
        f"{new}, verdicts Holm-corrected over the map's cells.)\n"
    )
