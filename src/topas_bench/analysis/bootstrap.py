"""Seeded percentile bootstrap over seeds: deterministic confidence intervals.

The unit of resampling is a seed (one run), not a task: tasks of one run share a queue and are
not independent. With few seeds the intervals are wide and coarse (with two seeds the 95%
interval of a mean is the two values themselves); they say how much the seeds disagree, not
more.
"""

from __future__ import annotations

import numpy as np

N_BOOT = 10_000
LEVEL = 0.95
SEED = 0


def _resample_index(n: int, n_boot: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, n, size=(n_boot, n))


def _interval(stats: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(stats, [tail, 100.0 - tail])
    return float(lo), float(hi)


def mean_ci(
    values: np.ndarray, *, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = SEED
) -> tuple[float, float, float]:
    """(mean, low, high): the mean of `values` and its percentile-bootstrap interval."""
    v = np.asarray(values, dtype=float)
    if v.size == 0:
        return float("nan"), float("nan"), float("nan")
    idx = _resample_index(v.size, n_boot, seed)
    return (float(v.mean()), *_interval(v[idx].mean(axis=1), level))


def reduction_ci(
    ours: np.ndarray,
    theirs: np.ndarray,
    *,
    n_boot: int = N_BOOT,
    level: float = LEVEL,
    seed: int = SEED,
) -> tuple[float, float, float]:
    """(r, low, high) for r = 1 - mean(ours) / mean(theirs), values paired by seed: each
    resample draws seeds once and takes both schedulers' values of those seeds."""
    a, b = np.asarray(ours, dtype=float), np.asarray(theirs, dtype=float)
    if a.size == 0 or a.size != b.size:
        return float("nan"), float("nan"), float("nan")
    idx = _resample_index(a.size, n_boot, seed)
    with np.errstate(divide="ignore", invalid="ignore"):
        stats = 1.0 - a[idx].mean(axis=1) / b[idx].mean(axis=1)
        point = 1.0 - a.mean() / b.mean()
    return (float(point), *_interval(stats, level))
