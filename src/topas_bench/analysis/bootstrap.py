"""Seeded percentile-bootstrap intervals over seeds (`scipy.stats.bootstrap`), deterministic.

The unit of resampling is a seed (one run), not a task: tasks of one run share a queue and are
not independent. With few seeds the intervals are wide and coarse (with two seeds the 95%
interval of a mean is the two values themselves); they say how much the seeds disagree, not
more. The percentile method, not BCa: BCa's acceleration is estimated by a jackknife that is
unstable at 2-5 seeds and undefined when the seeds agree exactly (a common case on identical
tasks); the percentile interval is what the report has always shown.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

N_BOOT = 10_000
LEVEL = 0.95
SEED = 0

NAN3 = (float("nan"),) * 3


def _ci(
    data: tuple[np.ndarray, ...],
    statistic: Callable[..., Any],
    *,
    n_boot: int,
    level: float,
    seed: int,
) -> tuple[float, float]:
    from scipy.stats import bootstrap

    if data[0].size < 2:  # one seed: no spread to resample
        point = float(statistic(*(d[None, :] for d in data), axis=-1)[0])
        return point, point
    res = bootstrap(
        data, statistic, n_resamples=n_boot, confidence_level=level, method="percentile",
        paired=len(data) > 1, vectorized=True, rng=np.random.default_rng(seed),
    )  # fmt: skip
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def _mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.asarray(x.mean(axis=axis))


def mean_ci(
    values: np.ndarray, *, n_boot: int = N_BOOT, level: float = LEVEL, seed: int = SEED
) -> tuple[float, float, float]:
    """(mean, low, high): the mean of `values` and its percentile-bootstrap interval."""
    v = np.asarray(values, dtype=float)
    if v.size == 0 or np.isnan(v).any():
        return NAN3
    return (float(v.mean()), *_ci((v,), _mean, n_boot=n_boot, level=level, seed=seed))


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
    if a.size == 0 or a.size != b.size or np.isnan(a).any() or np.isnan(b).any():
        return NAN3

    def reduction(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(1.0 - x.mean(axis=axis) / y.mean(axis=axis))

    point = float(reduction(a, b))
    return (point, *_ci((a, b), reduction, n_boot=n_boot, level=level, seed=seed))
