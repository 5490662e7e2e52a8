"""Compare a new results tree with a reference: did any JCT or TOPAS's advantage regress?

Rows are matched by group (every identity field but scheduler and seed) and scheduler label.
With tolerance `x` (relative, 0.05 = 5%):
- a scheduler's mean or p99 JCT regresses when `new > reference * (1 + x)`;
- TOPAS's advantage regresses when its JCT relative to the best baseline grows by more than
  `x`: `(topas / best)_new > (topas / best)_reference * (1 + x)`, i.e. its reduction
  `1 - topas / best` shrinks by more than `x` of what TOPAS leaves.
Groups or schedulers of the reference that the new tree lacks are listed as missing, a failure
unless `allow_missing`; rows only in the new tree are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pandas as pd

from topas_bench.analysis.report import COMPARED, Report
from topas_bench.errors import TopasError


@dataclass(frozen=True)
class Change:
    workload: str
    setting: str
    scheduler: str
    metric: str  # "mean JCT", "p99 JCT", "mean advantage", "p99 advantage"
    reference: float
    new: float
    relative: float  # new / reference - 1 (for advantages: of topas / best baseline)
    regressed: bool

    def describe(self) -> str:
        if "advantage" in self.metric:
            what = f"reduction vs best baseline {_pct(self.reference)} -> {_pct(self.new)}"
        else:
            what = f"{self.reference:.2f} s -> {self.new:.2f} s"
        sign = "+" if self.relative >= 0 else ""
        return (
            f"{self.workload} ({self.setting}) {self.scheduler} {self.metric}: {what} "
            f"({sign}{100 * self.relative:.1f}%)"
        )


@dataclass
class Comparison:
    tolerance: float
    compared: int = 0
    changes: list[Change] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regressed]

    def ok(self, allow_missing: bool = False) -> bool:
        return not self.regressions and (allow_missing or not self.missing)


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def compare(new: Report, reference: Report, tolerance: float) -> Comparison:
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise TopasError(f"--tolerance must be a number >= 0, got {tolerance}")
    result = Comparison(tolerance)
    cur = {(str(r["group"]), str(r["scheduler"])): r for _, r in new.rows.iterrows()}
    for _, r in reference.rows.iterrows():
        sched = str(r["scheduler"])
        n = cur.get((str(r["group"]), sched))
        if n is None:
            result.missing.append(f"{r['workload']} ({r['group_label']}) {sched}")
            continue
        result.compared += 1
        for m, col in COMPARED.items():
            result.changes.append(_change(r, sched, f"{m} JCT", r[col], n[col], tolerance))
            if sched == "topas" and r[f"best_baseline_{m}"]:
                # compared as topas / best baseline; shown as the reduction 1 - that ratio
                before, after = 1.0 - float(r[f"reduction_{m}"]), 1.0 - float(n[f"reduction_{m}"])
                ch = _change(r, sched, f"{m} advantage", before, after, tolerance)
                result.changes.append(replace(ch, reference=1 - before, new=1 - after))
    if result.compared == 0:
        raise TopasError("no group and scheduler of the reference is in the new results")
    return result


def _change(
    r: pd.Series, scheduler: str, metric: str, ref: float, new: float, tol: float
) -> Change:
    rel = float(new) / float(ref) - 1.0 if ref else math.inf
    regressed = not math.isfinite(float(new)) or rel > tol
    return Change(
        str(r["workload"]), str(r["group_label"]), scheduler, metric, float(ref), float(new),
        rel, regressed,
    )  # fmt: skip
