"""Condition 1 with backfill (`standing`'s docstring): the budget ceiling under which each
scored set's pack admits nothing, counting the requests a reservation would refuse
(`pack._backfill_ok`) throughout the window."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from topas_bench.schedulers.base import BUDGET_MARGIN
from topas_bench.schedulers.topas.pack import _earliest_fit
from topas_bench.schedulers.topas.standing_inputs import CEILING_BISECTIONS, EPS, F64
from topas_bench.schedulers.topas.standing_ranges import Ranges


class Backfill(Ranges):
    """The reservations a pack makes, and the requests they refuse."""

    def _held_back(
        self,
        considered: npt.NDArray[np.intp],
        fits_at: F64,
        budget_lo: float,
        n_lo: F64,
        n_hi: F64,
        steps: int,
    ) -> tuple[float, npt.NDArray[np.bool_]]:
        """1 with backfill: the budget ceiling under which each scored set's pack admits
        nothing, counting requests that fit but that the reservation of the set's first
        request would refuse (`pack._backfill_ok`) throughout the window.

        The first request a pack walks is the one with the highest ranking key (no starving
        one may be considered); where that holds over the window and it does not fit, it is
        reserved, and a later request that fits is refused while, over every budget,
        release time and free of the window, admitting it would make the reserved one fit
        later: the earliest fit with it (its memory back only when it ends, everything else
        as early and as large as it can be) is later than the one without (as late and as
        small). `budget_lo` must hold throughout: decode lowers the budget by at most one
        token per running request per step. Also which considered requests a pack may walk
        first, the only ones that may preempt (a later one finds a reservation made)."""
        first = np.zeros(len(considered), dtype=bool)
        if bool(self.urgent[considered].any()):
            return -math.inf, first  # starving requests go first, whatever their keys
        key_lo, key_hi = (n_lo, n_hi) if not self.p.density else (
            n_lo / self.denom, n_hi / self.denom)  # fmt: skip
        t_lo, t_hi, frees_lo, frees_hi = self._releases(steps)
        late = sorted(zip(t_hi, frees_lo, strict=True))
        early = sorted(zip(t_lo, frees_hi, strict=True))
        ceiling = self.swap_hi
        for s in range(len(self.visited)):
            walked = np.flatnonzero(np.isfinite(fits_at[s]))
            if not len(walked):
                continue
            keys = key_lo[considered[walked]]
            head = int(np.argmax(keys))
            top, rest = walked[head], np.delete(walked, head)
            blocked = float(fits_at[s, top])
            if len(rest) and not key_lo[considered[top]] > key_hi[considered[rest]].max() * (
                1.0 + EPS
            ):
                ceiling = min(ceiling, float(fits_at[s].min()))  # no order: nothing may fit
                first[walked] = True
                continue
            first[top] = True
            delta = self.deltas[s]
            # the reservations: the first request walked, and the second where its place is
            # certain and it does not fit now (`pack.greedy_pack` holds up to two); each with
            # its cost in this set's pack and its earliest fit without a backfill (as late as
            # it can be)
            reserved = [(blocked, top)]
            if len(rest) > 1:
                nxt = int(np.argmax(key_lo[considered[rest]]))
                second, others = rest[nxt], np.delete(rest, nxt)
                at2 = float(fits_at[s, second])
                certain = key_lo[considered[second]] > key_hi[considered[others]].max() * (
                    1.0 + EPS
                )
                if certain and at2 > self.budget0 + BUDGET_MARGIN:
                    reserved.append((at2, second))
            plans = [
                (at_r, r, at_r - delta,
                 _earliest_fit(at_r - delta, budget_lo - delta, late) * (1.0 + EPS) + EPS)
                for at_r, r in reserved
            ]  # fmt: skip
            for c in rest:
                at = float(fits_at[s, c])
                if at >= min(blocked, ceiling):
                    continue  # blocked whenever the first reserved one is
                cost = at - delta
                releases = sorted([*early, (self._service_lo(int(considered[c])), cost)])
                # each reservation refuses it up to a budget (the lower the budget, the
                # later the reserved one's earliest fit with it admitted): the highest
                best = -math.inf
                for at_r, r, need, without in plans:
                    if r == c:
                        continue
                    # the second one stays a reservation only while it does not fit
                    high = min(blocked, ceiling, at_r)
                    best = max(best, self._refused_up_to(need, without, cost, delta, releases,
                                                         high))  # fmt: skip
                if best < self.budget0 + BUDGET_MARGIN:
                    blocked = at  # it might be admitted: keep the budget where it does not fit
                else:
                    ceiling = min(ceiling, best)
            ceiling = min(ceiling, blocked)
        return ceiling, first

    def _refused_up_to(
        self,
        need: float,
        without: float,
        cost: float,
        delta: float,
        releases: list[tuple[float, float]],
        high: float,
    ) -> float:
        """The highest budget up to `high` (bisected) at which a reservation of `need` tokens,
        which fits at `without` at the latest without a backfill, refuses one of `cost`
        tokens that gives its memory back as `releases` say (its earliest fit with the
        backfill admitted is later); -inf if it does not at this decision's budget."""
        low = self.budget0 + BUDGET_MARGIN
        if high < low or not _earliest_fit(need, low - delta - cost, releases) > without:
            return -math.inf
        if _earliest_fit(need, high - delta - cost, releases) > without:
            return high
        for _ in range(CEILING_BISECTIONS):
            mid = 0.5 * (low + high)
            refused = _earliest_fit(need, mid - delta - cost, releases) > without
            low, high = (mid, high) if refused else (low, mid)
        return low
