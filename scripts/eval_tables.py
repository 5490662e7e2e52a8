"""The compact tables of docs/evaluation.md, from a report and from the runs behind it.

    python scripts/eval_tables.py margins REPORT_CSV [--schedulers topas,topas-no-joint]
    python scripts/eval_tables.py mechanism RESULTS WORKLOAD PATTERN SCHEDULERS

`margins`: per cell of `topas-bench report`'s report.csv, the best baseline (per metric) and
each named scheduler's mean and p99 JCT reduction against it, with the report's bootstrap
interval. `mechanism`: per scheduler, averaged over the runs of RESULTS/WORKLOAD/SCHEDULER whose
directory name contains PATTERN (e.g. `kv15000-r0.004548`): the decode batch size and the
distinct agents per decode batch (weighted by decode steps, from timeline.parquet), prefill's
share of busy time, the share of prompt tokens served from cache, preemptions per run and the
mean wait from a call being ready to its first admission (requests.parquet).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

BASELINES = ("fcfs", "lpm", "spf", "parrot", "autellix")


def _pct(v: float, lo: float, hi: float) -> str:
    return f"{100 * v:+.1f}% [{100 * lo:+.1f}, {100 * hi:+.1f}]"


def margins(report_csv: Path, schedulers: list[str]) -> str:
    d = pd.read_csv(report_csv)
    rows = []
    for (_, workload), cell in d.groupby(["group_label", "workload"], sort=False):
        base = cell[cell.scheduler.isin(BASELINES)]
        if base.empty:
            continue
        bm = base.loc[base.mean_jct_s.idxmin()]
        bp = base.loc[base.p99_jct_s.idxmin()]
        row = {
            "workload": workload,
            "KV": f"{int(cell.kv_budget_tokens.iloc[0]):,}",
            "rate /s": f"{cell.rate_per_s.iloc[0]:.4g}",
            "best mean (s)": f"{bm.scheduler} {bm.mean_jct_s:.1f}",
            "best p99 (s)": f"{bp.scheduler} {bp.p99_jct_s:.1f}",
        }
        for s in schedulers:
            t = cell[cell.scheduler == s]
            if t.empty:
                row[f"{s} mean"] = row[f"{s} p99"] = "-"
                continue
            r = t.iloc[0]
            row[f"{s} mean"] = _pct(r.reduction_mean, r.reduction_mean_lo, r.reduction_mean_hi)
            row[f"{s} p99"] = _pct(r.reduction_p99, r.reduction_p99_lo, r.reduction_p99_hi)
        rows.append(row)
    return str(pd.DataFrame(rows).to_markdown(index=False))


def mechanism(results: Path, workload: str, pattern: str, schedulers: list[str]) -> str:
    rows = []
    for s in schedulers:
        acc = []
        for d in sorted((results / workload / s).glob(f"*{pattern}*")):
            t = pd.read_parquet(d / "timeline.parquet")
            r = pd.read_parquet(d / "requests.parquet")
            dec, pre = t[t.kind == "decode"], t[t.kind == "prefill"]
            steps = dec.steps.sum()
            acc.append((
                (dec.batch * dec.steps).sum() / steps,
                (dec.batch_agents * dec.steps).sum() / steps,
                pre.duration_s.sum() / t.duration_s.sum(),
                r.cached_tokens.sum() / r.prompt_tokens.sum(),
                r.preemptions.sum(),
                (r.first_admitted_s - r.ready_s).mean(),
            ))  # fmt: skip
        if not acc:
            raise SystemExit(f"error: no runs under {results / workload / s} matching {pattern!r}")
        a = np.mean(acc, axis=0)
        rows.append({
            "scheduler": s, "runs": len(acc), "decode batch": f"{a[0]:.2f}",
            "agents / batch": f"{a[1]:.2f}", "prefill share of busy time": f"{100 * a[2]:.1f}%",
            "prompt tokens cached": f"{100 * a[3]:.1f}%", "preemptions / run": f"{a[4]:.0f}",
            "mean wait to admission (s)": f"{a[5]:.1f}",
        })  # fmt: skip
    return str(pd.DataFrame(rows).to_markdown(index=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("margins")
    m.add_argument("report_csv", type=Path)
    m.add_argument("--schedulers", default="topas,topas-no-joint")
    k = sub.add_parser("mechanism")
    k.add_argument("results", type=Path)
    k.add_argument("workload")
    k.add_argument("pattern")
    k.add_argument("schedulers")
    a = ap.parse_args()
    try:
        if a.cmd == "margins":
            print(margins(a.report_csv, a.schedulers.split(",")))
        else:
            print(mechanism(a.results, a.workload, a.pattern, a.schedulers.split(",")))
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
