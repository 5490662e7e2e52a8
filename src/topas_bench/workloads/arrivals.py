"""Task arrival times: a Poisson process (docs/design.md section 6)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def poisson_arrivals(
    rng: np.random.Generator, num_tasks: int, rate_per_s: float
) -> npt.NDArray[np.float64]:
    """Arrival times (s) of `num_tasks` tasks of a Poisson process at `rate_per_s`, from t = 0.

    Gaps are independent exponentials of mean ``1 / rate_per_s`` and the first task arrives
    after its own gap, not at 0: the process starts empty at t = 0, so the mean gap over the
    run, ``arrivals[-1] / num_tasks``, estimates ``1 / rate_per_s`` without bias.

    Draws are unit exponentials scaled by the rate, so for one generator state the times at two
    rates are proportional (a load sweep moves the same tasks closer together), and the first
    ``n`` times do not depend on `num_tasks` >= n.
    """
    gaps = rng.standard_exponential(num_tasks) / rate_per_s
    return np.cumsum(gaps)
