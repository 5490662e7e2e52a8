"""Paired verdicts (issue 29's protocol): one scheduler against others, seed by seed.

A *cell* compares a focus scheduler F with another scheduler O on one metric (mean or p99 JCT)
in one group (same workload sample, arrivals, budget and rate for both: seed s of F and seed
s of O ran the same tasks). Its margin is ``1 - mean_s(F) / mean_s(O)`` over the seeds both
have (positive: F is faster), with a 95% paired percentile bootstrap interval: each of
`N_BOOT` resamples draws seeds with replacement and takes both schedulers' values of those
seeds (`bootstrap.reduction_ci`'s statistic). Its two-sided bootstrap p-value is twice the
smaller share of resampled margins on either side of 0 (at most 1), so that the percentile
interval at level ``1 - a`` excludes 0 exactly when ``p < a``.

A *table* is a family of cells judged together. Each cell's p-value is adjusted by Holm's
step-down method over the table's cells (`holm`): the k-th smallest p is multiplied by the
number of cells not yet rejected, and the adjusted values made monotone. The verdict is
``win`` (F faster) or ``loss`` (F slower) where the adjusted p is below `ALPHA`, ``tie``
elsewhere: a win is a cell whose interval excludes 0 at the level Holm's step asks for, which
controls the chance of even one false win or loss in the table at 5%. Holm, not
Benjamini-Hochberg: the claims are read one by one ("TOPAS beats Continuum on dag4"), so the
family-wise error is the one to bound, not the share of false claims.

What the verdicts cannot do: the unit of resampling is a seed, so with 10 seeds the interval
says how much these 10 workload samples disagree, not more; a percentile bootstrap over 10
values is known to be somewhat narrow. A cell with fewer than `MIN_SEEDS` common seeds is a
tie by rule (``n/a`` in its interval).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

N_BOOT = 10_000
ALPHA = 0.05
LEVEL = 0.95
SEED = 0
#: Fewer common seeds than this: no verdict other than a tie.
MIN_SEEDS = 3
METRICS = {"mean": "mean_jct_s", "p99": "p99_jct_s"}


@dataclass(frozen=True)
class Paired:
    """One cell: the margin of the focus over another scheduler on one metric."""

    margin: float  # 1 - mean(focus) / mean(other); > 0: the focus is faster
    lo: float
    hi: float
    p: float  # two-sided bootstrap p-value, before any correction
    n_seeds: int
    ahead: int  # seeds on which the focus's value is lower

    @property
    def usable(self) -> bool:
        return self.n_seeds >= MIN_SEEDS and math.isfinite(self.margin)


NOT_PAIRED = Paired(math.nan, math.nan, math.nan, 1.0, 0, 0)


def paired(
    focus: Sequence[float] | np.ndarray,
    other: Sequence[float] | np.ndarray,
    *,
    n_boot: int = N_BOOT,
    seed: int = SEED,
) -> Paired:
    """The paired margin of `focus` over `other` (values of the same seeds, in the same order)
    with its percentile interval and bootstrap p-value (module docstring)."""
    a, b = np.asarray(focus, dtype=float), np.asarray(other, dtype=float)
    if a.size == 0 or a.size != b.size or not (np.isfinite(a).all() and np.isfinite(b).all()):
        return NOT_PAIRED
    if b.mean() <= 0:
        return NOT_PAIRED
    margin = float(1.0 - a.mean() / b.mean())
    ahead = int((a < b).sum())
    if a.size < 2:
        return Paired(margin, margin, margin, 1.0, int(a.size), ahead)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, size=(n_boot, a.size))
    with np.errstate(divide="ignore", invalid="ignore"):
        boot = 1.0 - a[idx].mean(axis=1) / b[idx].mean(axis=1)
    tail = (1.0 - LEVEL) / 2
    lo, hi = (float(x) for x in np.quantile(boot, [tail, 1.0 - tail]))
    below, above = float((boot <= 0).mean()), float((boot >= 0).mean())
    p = min(1.0, 2.0 * min(below, above))
    return Paired(margin, lo, hi, p, int(a.size), ahead)


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: (ps[i], i))
    adjusted = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def verdicts(cells: Sequence[Paired], alpha: float = ALPHA) -> list[tuple[float, str]]:
    """(Holm-adjusted p, verdict) per cell of one table; cells that are not `usable` are ties
    and do not count in the family."""
    usable = [i for i, c in enumerate(cells) if c.usable]
    adj = holm([cells[i].p for i in usable])
    out: list[tuple[float, str]] = [(1.0, "tie")] * len(cells)
    for i, p in zip(usable, adj, strict=True):
        c = cells[i]
        word = "tie"
        if p < alpha:
            word = "win" if c.margin > 0 else "loss"
        out[i] = (p, word)
    return out


def family_note(n: int, alpha: float = ALPHA) -> str:
    """One sentence for a table's caption: what its verdicts were corrected for."""
    return (
        f"Verdicts: win / loss where the Holm-adjusted bootstrap p-value over this table's {n} "
        f"cells is below {alpha:g} (the interval excludes 0 after the correction), tie otherwise."
    )
