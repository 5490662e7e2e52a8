"""Compare a new results tree with a reference: did a scheduler or TOPAS's advantage regress?

Rows are matched by group (every identity field but scheduler and seed) and scheduler label.
Per row it compares mean and p99 JCT, goodput and p99 TTFT (the last two where the reference
has them), and for TOPAS its reductions against the best baseline (mean and p99). A change is
a regression when it is worse than the reference by more than the allowed margin:

- `Tolerance.noise` (the default): the seed-to-seed noise both trees measured, the two 95%
  bootstrap half-widths over seeds added in quadrature (`sqrt(h_ref^2 + h_new^2)`), in the
  metric's own unit. A row with fewer than two seeds on either side has no noise estimate and
  falls back to `Tolerance.fallback` (relative).
- `Tolerance.relative = x`: worse by more than `x` of the reference (0.05 = 5%); for an
  advantage, TOPAS's JCT relative to the best baseline grows by more than `x`.

Both trees are compared on the same samples: per group, only the seeds both have
(`on_common_seeds`; a note says what was left out). Reference rows the new tree lacks are
`missing` (the CLI refuses to judge then, unless told
to compare what is there); rows only in the new tree are ignored; a reference with nothing in
common with the new tree is a `TopasError` that names both settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pandas as pd

from topas_bench.analysis.collect import Collection
from topas_bench.analysis.report import Report
from topas_bench.errors import TopasError


@dataclass(frozen=True)
class Tolerance:
    relative: float | None = None  # None: the measured noise
    fallback: float = 0.05

    def __post_init__(self) -> None:
        for v in (self.relative, self.fallback):
            if v is not None and not (v >= 0 and math.isfinite(v)):
                raise TopasError(f"--tolerance must be `noise` or a number >= 0, got {v}")

    @classmethod
    def parse(cls, text: str) -> Tolerance:
        if text.strip().lower() == "noise":
            return cls()
        try:
            return cls(relative=float(text))
        except ValueError:
            bad = f"--tolerance must be `noise` or a number >= 0, got {text!r}"
            raise TopasError(bad) from None

    def describe(self) -> str:
        if self.relative is None:
            return f"seed-to-seed noise (a {self.fallback:g} relative margin for single seeds)"
        return f"{self.relative:g} relative"


#: (label, report column, which way is better); each has a bootstrap interval over seeds
METRICS = (
    ("mean JCT", "mean_jct_s", "lower"),
    ("p99 JCT", "p99_jct_s", "lower"),
    ("goodput", "goodput_tps", "higher"),
    ("p99 TTFT", "ttft_p99_s", "lower"),
)
ADVANTAGES = {"mean advantage": "mean", "p99 advantage": "p99"}


@dataclass(frozen=True)
class Change:
    workload: str
    setting: str
    scheduler: str
    metric: str  # a METRICS label, or "mean advantage" / "p99 advantage"
    reference: float
    new: float
    relative: float  # new / reference - 1
    allowed: float  # the margin a worsening may reach, in the metric's unit
    regressed: bool

    def describe(self) -> str:
        if "advantage" in self.metric:
            what = f"reduction vs best baseline {_pct(self.reference)} -> {_pct(self.new)}"
            margin = f"noise {_pct(self.allowed)}"
        else:
            what = f"{self.reference:.4g} -> {self.new:.4g}"
            margin = f"allowed {self.allowed:.3g}"
        sign = "+" if self.relative >= 0 else ""
        return (
            f"{self.workload} ({self.setting}) {self.scheduler} {self.metric}: {what} "
            f"({sign}{100 * self.relative:.1f}%; {margin})"
        )


@dataclass
class Comparison:
    tolerance: Tolerance
    compared: int = 0
    changes: list[Change] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.regressed]


def on_common_seeds(new: Collection, ref: Collection) -> tuple[Collection, Collection, list[str]]:
    """Both collections with each group's runs cut to the seeds both trees have for it."""
    a, b = new.runs, ref.runs
    common = (
        a[["group", "seed"]].drop_duplicates().merge(b[["group", "seed"]].drop_duplicates())
    )  # fmt: skip
    notes = []
    for (key, label), g in a.groupby(["group", "group_label"], sort=False):
        ours, theirs = set(g["seed"]), set(b[b["group"] == key]["seed"])
        if theirs and ours != theirs:
            both = ",".join(str(x) for x in sorted(ours & theirs)) or "none"
            notes.append(
                f"{g.iloc[0]['workload']} ({label}): compared on seeds {both}, the seeds both "
                f"trees have (new: {_seeds(ours)}; reference: {_seeds(theirs)})"
            )

    def cut(c: Collection, runs: pd.DataFrame) -> Collection:
        kept = runs.merge(common, on=["group", "seed"]) if not common.empty else runs
        unmatched = runs[~runs["group"].isin(common["group"])]
        return replace(c, runs=pd.concat([kept, unmatched]).reset_index(drop=True))

    return cut(new, a), cut(ref, b), notes


def _seeds(seeds: set[int]) -> str:
    return ",".join(str(int(x)) for x in sorted(seeds))


def _pct(v: float) -> str:
    return f"{100 * v:.1f}%"


def _half(r: pd.Series, col: str) -> float:
    lo, hi = r.get(f"{col}_lo", math.nan), r.get(f"{col}_hi", math.nan)
    return (float(hi) - float(lo)) / 2 if r["n_seeds"] >= 2 else math.nan


def compare(new: Report, reference: Report, tolerance: Tolerance) -> Comparison:
    result = Comparison(tolerance)
    cur = {(str(r["group"]), str(r["scheduler"])): r for _, r in new.rows.iterrows()}
    for _, r in reference.rows.iterrows():
        sched = str(r["scheduler"])
        n = cur.get((str(r["group"]), sched))
        if n is None:
            result.missing.append(f"{r['workload']} ({r['group_label']}) {sched}")
            continue
        result.compared += 1
        if r["seeds"] != n["seeds"]:
            result.notes.append(
                f"{r['workload']} ({r['group_label']}) {sched}: seeds {n['seeds']} compared with "
                f"the reference's {r['seeds']}"
            )
        for label, col, better in METRICS:
            if math.isnan(float(r[col])):
                continue  # the reference predates the metric
            sign = 1.0 if better == "lower" else -1.0
            noise = math.hypot(_half(r, col), _half(n, col))
            result.changes.append(_change(r, sched, label, r[col], n[col], sign, noise, tolerance))
        if sched == "topas":
            for label, m in ADVANTAGES.items():
                if not r[f"best_baseline_{m}"]:
                    continue
                col = f"reduction_{m}"
                noise = math.hypot(_half(r, col), _half(n, col))
                # judged on topas / best = 1 - reduction, shown as the reduction
                before, after = 1.0 - float(r[col]), 1.0 - float(n[col])
                ch = _change(r, sched, label, before, after, 1.0, noise, tolerance)
                result.changes.append(
                    Change(**{**ch.__dict__, "reference": 1 - before, "new": 1 - after})
                )
    if result.compared == 0:
        raise TopasError(
            "no group and scheduler of the reference is in the new results; the reference "
            f"has {_settings(reference)}; the new tree has {_settings(new)}"
        )
    return result


def _settings(rep: Report) -> str:
    labels = rep.rows.drop_duplicates("group")
    pairs = list(zip(labels["workload"], labels["group_label"], strict=True))
    shown = "; ".join(f"{w} ({g})" for w, g in pairs[:3])
    more = len(labels) - 3
    return shown + (f" and {more} more" if more > 0 else "")


def _change(
    r: pd.Series, scheduler: str, metric: str, ref: float, new: float, sign: float,
    noise: float, tol: Tolerance,
) -> Change:  # fmt: skip
    ref, new = float(ref), float(new)
    rel = new / ref - 1.0 if ref else math.inf
    if tol.relative is not None or math.isnan(noise):
        allowed = abs(ref) * (tol.relative if tol.relative is not None else tol.fallback)
    else:
        allowed = noise
    worse = sign * (new - ref)  # > 0: worse
    regressed = not math.isfinite(new) or worse > allowed + 1e-12 * abs(ref)
    return Change(
        str(r["workload"]), str(r["group_label"]), scheduler, metric, ref, new, rel, allowed,
        regressed,
    )  # fmt: skip
