"""TOPAS's parameters: every choice the paper leaves open, named, with its default and reason.

The paper (arXiv 2608.25523, as summarised in DESIGN section 5) fixes the score's shape but
not its constants. Ours, and why:

beta (0.5): weight of the one-hop reuse value `V_reuse`. Below 1 because n_a counts stages that
    *may* need the prefix soon; when they arrive the prefix must still be worth its memory.
rho (1.0), h_age_s (600): aging `g = 1 + rho * log(1 + age / h_age_s)` multiplies admission
    gains. h_age_s is of the order of a loaded MetaGPT-TL task's JCT, so a task twice as old as
    a typical one gets ~2x the weight: enough to bound waits, too little to undo SRPT.
max_agents_exact (M = 8): with at most M candidate prefixes, every subset is scored; beyond, a
    greedy search with pair additions and add/remove/swap repair. 2^8 packs stay < 1 ms.
max_actions (K = 8): at most K admissions + preemptions per decision, so a decision never
    churns the whole batch; the engine consults TOPAS again after the next iteration.
horizon_s (None = auto): the epoch over which an admission's gain is measured, i.e. how long a
    waiting request that is not admitted now is expected to wait for the next chance. Auto =
    the mean expected residual service of the running requests (when memory frees up), at
    least one decode step.
srpt_exponent (1.0): how waiting enters the path: each task's critical-path reduction is
    scaled by (mean remaining path / its remaining path) ** srpt_exponent, so finishing short
    tasks first (SRPT, optimal for mean completion time on one server) is preferred; 0 turns
    this off.
preempt_margin_s (5.0): a preemption must gain this much more than its redo + revoke cost,
    so near-ties never preempt (preemptions cost real recompute).
scan_limit (64): GREEDY-PACK skips requests that do not fit and continues down the ranked
    list for at most max(scan_limit, 4 K) candidates (the list itself spans the whole queue).
refresh_limit (128): per decision, at most this many waiting tasks whose paths are stale only
    because the estimator learned since get recomputed (stalest first); a task whose own state
    changed is always recomputed. Bounds decision time for queues of thousands.
starvation_factor (4.0; 0 = off): a request that has waited longer than this many times the
    mean remaining path of the waiting tasks is promoted to the front, oldest first, and no
    request behind it is backfilled while it does not fit. Log aging alone cannot bound waits
    against a greedy pack: a large request that never fits next to a stream of small ones is
    skipped forever; the barrier lets memory drain to it (bounded by the running requests'
    residual service).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from topas_bench.schedulers.base import InvalidParameter


@dataclass(frozen=True)
class TopasParams:
    beta: float = 0.5
    rho: float = 1.0
    h_age_s: float = 600.0
    max_agents_exact: int = 8
    max_actions: int = 8
    horizon_s: float | None = None
    srpt_exponent: float = 1.0
    preempt_margin_s: float = 5.0
    scan_limit: int = 64
    use_reuse: bool = True
    use_aging: bool = True
    density: bool = False
    refresh_limit: int = 128
    starvation_factor: float = 4.0
    move_stall: bool = False

    def __post_init__(self) -> None:
        _at_least("beta", self.beta, 0.0)
        _at_least("rho", self.rho, 0.0)
        _above("h_age_s", self.h_age_s)
        _int_at_least("max_agents_exact", self.max_agents_exact, 1)
        _int_at_least("max_actions", self.max_actions, 1)
        if self.horizon_s is not None:
            _above("horizon_s", self.horizon_s)
        _at_least("srpt_exponent", self.srpt_exponent, 0.0)
        _at_least("preempt_margin_s", self.preempt_margin_s, 0.0)
        _int_at_least("scan_limit", self.scan_limit, 1)
        _int_at_least("refresh_limit", self.refresh_limit, 1)
        _at_least("starvation_factor", self.starvation_factor, 0.0)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidParameter(f"topas: {name} must be a finite number, got {value!r}")
    return float(value)


def _at_least(name: str, value: object, low: float) -> None:
    if _number(name, value) < low:
        raise InvalidParameter(
            f"topas: {name} must be >= {low:g} (valid range [{low:g}, inf)), got {value}"
        )


def _above(name: str, value: object) -> None:
    if _number(name, value) <= 0:
        raise InvalidParameter(f"topas: {name} must be > 0 (valid range (0, inf)), got {value}")


def _int_at_least(name: str, value: object, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InvalidParameter(f"topas: {name} must be an integer >= {low}, got {value!r}")
