"""How far the simulator is from SGLang's own scheduler: the same cells on `sim` and on the
`sglang-cpu` reference engine, compared (`topas-bench fidelity`, docs/fidelity.md).

Per workload, seed and scheduler, both engines serve the same workload sample. Per workload and
scheduler (averaged over seeds) the table gives the relative difference of mean and p99 JCT
(simulator against reference), the prefix-hit-rate difference in points, and the admission-order
agreement: the share of request pairs that both engines first admit in the same order (1 =
identical order). Per workload it says whether the schedulers rank the same by mean JCT.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from topas_bench.cell.stored import CellResult
from topas_bench.experiment import plan_run
from topas_bench.harness import run_cell, run_cells
from topas_bench.plan import RunPlan
from topas_bench.results import read_table
from topas_bench.runners.sglang_cpu.options import ReferenceOptions
from topas_bench.spec import RunSpec

#: (engine, workload, seed, scheduler) as cells finish.
Progress = Callable[[str, str, int, str], None]

COLUMNS = [
    "workload", "scheduler", "seeds", "mean_jct_sim_s", "mean_jct_ref_s", "mean_jct_diff",
    "p99_jct_sim_s", "p99_jct_ref_s", "p99_jct_diff", "hit_rate_diff_pts", "order_agreement",
]  # fmt: skip


@dataclass(frozen=True)
class FidelityReport:
    cells: pd.DataFrame  # one row per workload x scheduler (COLUMNS)
    rankings: pd.DataFrame  # per workload: ranking by mean JCT on each engine, same or not

    @property
    def max_abs_diff(self) -> float:
        diffs = self.cells[["mean_jct_diff", "p99_jct_diff"]].abs().to_numpy()
        return float(np.nanmax(diffs)) if diffs.size else float("nan")


def run_fidelity(
    workloads: Sequence[str],
    schedulers: Sequence[str],
    *,
    num_tasks: int,
    seeds: Sequence[int],
    out: Path,
    load: float | None = None,
    preset: str = "a100-qwen32b",
    kv_budget_tokens: int | None = None,
    force: bool = False,
    progress: Progress | None = None,
) -> FidelityReport:
    """Run every cell on both engines (stored cells of the current engines are reused unless
    `force`) and compare them."""
    pairs: list[tuple[str, int, str, CellResult, CellResult]] = []
    for w in workloads:
        for seed in seeds:
            spec = RunSpec(
                workload=w, schedulers=tuple(schedulers), num_tasks=num_tasks, seed=seed,
                load=load, preset=preset, kv_budget_tokens=kv_budget_tokens, out=out,
            )  # fmt: skip
            plan = plan_run(spec)
            ref_plan = plan_run(dataclasses.replace(spec, engine=ReferenceOptions()))
            sims = {}
            for name in schedulers:
                sims[name] = run_cell(plan, name, force=force)
                if progress:
                    progress("sim", w, seed, name)
            refs = run_cells(
                ref_plan, schedulers, force=force,
                progress=_ref_progress(progress, w, seed, schedulers, plan),
            )  # fmt: skip
            for name, ref in zip(schedulers, refs, strict=True):
                pairs.append((w, seed, name, sims[name], ref))
    return compare_cells(pairs)


def _ref_progress(
    progress: Progress | None, w: str, seed: int, schedulers: Sequence[str], plan: RunPlan
) -> Callable[[int, int], None] | None:
    if progress is None:
        return None

    def report(cell: int, done: int) -> None:
        if done == plan.num_tasks:
            progress("sglang-cpu", w, seed, schedulers[cell])

    return report


def compare_cells(pairs: Sequence[tuple[str, int, str, CellResult, CellResult]]) -> FidelityReport:
    """The comparison of (workload, seed, scheduler, sim cell, reference cell) pairs."""
    rows = []
    for w, seed, name, sim, ref in pairs:
        rows.append({
            "workload": w, "seed": seed, "scheduler": name,
            "mean_sim": sim.summary["mean_jct_s"], "mean_ref": ref.summary["mean_jct_s"],
            "p99_sim": sim.summary["p99_jct_s"], "p99_ref": ref.summary["p99_jct_s"],
            "hit_sim": sim.summary["prefix_hit_rate"], "hit_ref": ref.summary["prefix_hit_rate"],
            "order": order_agreement(
                read_table(sim.run_dir, "requests"), read_table(ref.run_dir, "requests")
            ),
        })  # fmt: skip
    df = pd.DataFrame(rows)
    cells = []
    rankings = []
    for workload, g in df.groupby("workload", sort=False):
        per = g.groupby("scheduler", sort=False).mean(numeric_only=True)
        seeds = g.groupby("scheduler", sort=False)["seed"].nunique()
        for name, r in zip(per.index, per.to_dict("records"), strict=True):
            cells.append({
                "workload": workload, "scheduler": name, "seeds": int(seeds[name]),
                "mean_jct_sim_s": r["mean_sim"], "mean_jct_ref_s": r["mean_ref"],
                "mean_jct_diff": r["mean_sim"] / r["mean_ref"] - 1.0,
                "p99_jct_sim_s": r["p99_sim"], "p99_jct_ref_s": r["p99_ref"],
                "p99_jct_diff": r["p99_sim"] / r["p99_ref"] - 1.0,
                "hit_rate_diff_pts": 100.0 * (r["hit_sim"] - r["hit_ref"]),
                "order_agreement": r["order"],
            })  # fmt: skip
        by_sim = list(per.sort_values("mean_sim", kind="stable").index)
        by_ref = list(per.sort_values("mean_ref", kind="stable").index)
        rankings.append({
            "workload": workload, "same": by_sim == by_ref,
            "ranking_sim": " < ".join(by_sim), "ranking_ref": " < ".join(by_ref),
        })  # fmt: skip
    return FidelityReport(pd.DataFrame(cells, columns=COLUMNS), pd.DataFrame(rankings))


def order_agreement(sim: pd.DataFrame, ref: pd.DataFrame) -> float:
    """Share of request pairs that both engines first admit in the same order (ties in either
    engine's admission time count as agreeing): Kendall concordance over the requests."""
    keys = ["task_id", "stage_id"]
    m = sim[[*keys, "first_admitted_s"]].merge(
        ref[[*keys, "first_admitted_s"]], on=keys, suffixes=("_sim", "_ref")
    )
    n = len(m)
    if n < 2:
        return 1.0
    # Sorted by sim time (equal times by reference time), a discordant pair is a strict
    # inversion of the reference times: count them by merge sort, O(n log n).
    m = m.sort_values(["first_admitted_s_sim", "first_admitted_s_ref"], kind="stable")
    _, discordant = _inversions(m["first_admitted_s_ref"].tolist())
    return 1.0 - discordant / (n * (n - 1) / 2)


def _inversions(xs: list[float]) -> tuple[list[float], int]:
    """`xs` sorted, and its number of pairs i < j with xs[i] > xs[j]."""
    if len(xs) < 2:
        return xs, 0
    mid = len(xs) // 2
    left, a = _inversions(xs[:mid])
    right, b = _inversions(xs[mid:])
    merged: list[float] = []
    count = a + b
    i = j = 0
    while i < len(left) and j < len(right):
        if right[j] < left[i]:
            merged.append(right[j])
            count += len(left) - i
            j += 1
        else:
            merged.append(left[i])
            i += 1
    merged += left[i:] + right[j:]
    return merged, count


def markdown(report: FidelityReport, command: str) -> str:
    """The report as Markdown tables, with the command that made it."""

    def pct(x: float) -> str:
        return f"{100 * x:+.1f}%"

    lines = [f"Command: `{command}`", ""]
    lines += [
        "| workload | scheduler | seeds | mean JCT sim / ref (s) | diff | p99 JCT sim / ref (s) "
        "| diff | hit rate diff | admission order |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report.cells.to_dict("records"):
        lines.append(
            f"| {r['workload']} | {r['scheduler']} | {r['seeds']} | {r['mean_jct_sim_s']:,.1f} / "
            f"{r['mean_jct_ref_s']:,.1f} | {pct(r['mean_jct_diff'])} | {r['p99_jct_sim_s']:,.1f} / "
            f"{r['p99_jct_ref_s']:,.1f} | {pct(r['p99_jct_diff'])} | "
            f"{r['hit_rate_diff_pts']:+.2f} pts | {r['order_agreement']:.4f} |"
        )
    lines += ["", "| workload | ranking on sim (by mean JCT) | ranking on sglang-cpu | same |",
              "|---|---|---|---|"]  # fmt: skip
    for r in report.rankings.to_dict("records"):
        same = "yes" if r["same"] else "NO"
        lines.append(f"| {r['workload']} | {r['ranking_sim']} | {r['ranking_ref']} | {same} |")
    return "\n".join(lines) + "\n"


def as_json(report: FidelityReport) -> dict[str, Any]:
    return {
        "cells": report.cells.to_dict("records"),
        "rankings": report.rankings.to_dict("records"),
    }
