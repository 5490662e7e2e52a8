"""Does calibrating the clock change a ranking or a verdict? From the report of
results/clock-sensitivity.toml (the paper's regime on h200-llama8b, uncalibrated and calibrated,
at a KV budget that binds), per workload: the rate each preset's capacity gave, the first five
schedulers by mean JCT, TOPAS's rank, the rank agreement of the two orders of all schedulers
(Kendall's tau), and TOPAS against the best other scheduler (of all, mean and p99) with its 95%
interval and verdict: wins (the interval above 0), loses (below 0), ties (it reaches 0); and
on the mean against the best of the paper's five baselines.

    python scripts/clock_sensitivity.py     # writes results/clock-sensitivity/summary.md

docs/fidelity.md ("Clock") holds the table; tests/test_clock.py checks it against this.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from scipy.stats import kendalltau

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "results" / "clock-sensitivity" / "report.csv"
WORKLOADS = ("chain3", "dag4", "dag10-wide", "metagpt-sop", "metagpt-tl")
TOPAS = {"topas", "topas-no-pins", "topas-no-joint", "topas-no-move-stall"}


def verdict(lo: float, hi: float) -> str:
    return "wins" if lo > 0 else "loses" if hi < 0 else "ties"


def _cell(row: pd.Series, metric: str, of: str = "any") -> tuple[str, str]:
    """TOPAS against the best other scheduler (`of` "any") or the best baseline ("baseline")."""
    key = f"reduction_{of}_{metric}" if of == "any" else f"reduction_{metric}"
    value, lo, hi = (row[f"{key}{s}"] for s in ("", "_lo", "_hi"))
    best = row[f"best_{of}_{metric}"]
    return f"{verdict(lo, hi)} vs {best}: {value:+.1%} [{lo:+.1%}, {hi:+.1%}]", verdict(lo, hi)


def summary(report: Path = REPORT) -> str:
    d = pd.read_csv(report)
    d["calibrated"] = ~d["preset"].str.contains("uncalibrated")
    head = ("workload", "preset", "rate (tasks/s)", "first five by mean JCT", "TOPAS rank",
            "TOPAS mean JCT vs best other", "TOPAS p99 JCT vs best other",
            "TOPAS mean JCT vs best baseline")  # fmt: skip
    rows, notes = [], []
    for w in WORKLOADS:
        orders, verdicts = {}, {}
        for cal in (False, True):
            g = d[(d["workload"] == w) & (d["calibrated"] == cal)].sort_values("mean_jct_s")
            order = list(g["scheduler"])
            t = g[g["scheduler"] == "topas"].iloc[0]
            mean, v_mean = _cell(t, "mean")
            p99, v_p99 = _cell(t, "p99")
            base, v_base = _cell(t, "mean", "baseline")
            orders[cal], verdicts[cal] = order, (v_mean, v_p99, v_base)
            name = "calibrated" if cal else "uncalibrated"
            rank = f"{order.index('topas') + 1} of {len(order)}"
            rows.append((w, name, f"{t['rate_per_s']:.4g}", " < ".join(order[:5]), rank, mean,
                         p99, base))  # fmt: skip
        common = [s for s in orders[False] if s not in TOPAS]
        tau = kendalltau([orders[False].index(s) for s in common],
                         [orders[True].index(s) for s in common]).statistic  # fmt: skip
        same = "the same" if verdicts[False] == verdicts[True] else "different"
        top = "the same" if orders[False][0] == orders[True][0] else "another"
        notes.append(f"- {w}: verdicts {same}; first place {top}; Kendall's tau of the two "
                     f"orders (TOPAS's variants aside) {tau:.2f}")  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join([*lines, "", *notes, ""])


def main() -> None:
    text = summary()
    (REPORT.parent / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
