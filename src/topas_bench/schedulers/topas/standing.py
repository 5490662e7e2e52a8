"""How long an empty TOPAS decision stands (`base.Standing`), proved term by term.

TOPAS is asked at every iteration while requests wait (`acts_while_full`), and almost every
answer admits and preempts nothing and repeats the one before. Between two events (an arrival,
a finish, a release, an estimator update) the discrete state is fixed; what drifts, one decode
step at a time, is:

- time: the aging g_i of every waiting task grows; requests cross the starvation limit;
- the running requests' generated tokens: their expected residual output (through it the
  horizon H, and a victim's frees) falls one token per step between the output lengths seen,
  and jumps where it passes one (`ServiceEstimator.residual_tokens_range`: its exact range);
- the step-time estimate tpot (a moving average of the step times): H, a victim's redo cost;
- the admission budget `free + evictable - reserved`: decode takes a token per running
  request per step, the reservation shrinks as they generate and as `new_token_ratio` decays.

An empty decision stays the same empty decision with the same resident set while:
1. nothing fits: every candidate that may be scanned costs at least the budget of every
   scored set that would pack it: an upper bound on the budget;
2. no preemption pays: for each such candidate, its largest gain over the window minus the
   least its victims could cost (a fractional cover, at their cheapest keep values, of the
   memory it needs; or no cover at all) stays within the margin;
3. the scored sets' scores do not move: with every pack empty a score moves only with the
   swap-out its memory excess forces, a step function of the budget: a budget range;
4. the search scores the same sets in the same order: the order of the top agents by waiting
   gain holds (all gains share the factor H, so they are compared without it);
5. no request crosses the starvation limit (`until_s`), and no path refresh is pending (the
   policy checks that before asking here).

Each drifting input gets a range over the window: time up to `until_s`, tpot a band around
its value, the budget the range of 1 and 3 (the engine checks these three at every step), the
generated tokens the window's length in steps. Every quantity the decision compares is then
bounded from those ranges by monotonicity (aging in time; the SRPT-weighted gain in H, a
ratio of lengths linear in H; redo cost in tpot and generated tokens), with a relative slack
of `EPS` for rounding. The window is the longest of `LADDER` whose certificate holds.
"""

from __future__ import annotations

import math

import numpy as np

from topas_bench.schedulers.base import BUDGET_MARGIN, Standing
from topas_bench.schedulers.topas.standing_backfill import Backfill
from topas_bench.schedulers.topas.standing_inputs import CEILING_BISECTIONS, EPS
from topas_bench.schedulers.topas.standing_order import Order
from topas_bench.schedulers.topas.standing_preemption import Preemption

#: Relative half-widths of the step-time band a standing decision assumes, widest first: the
#: widest that stands one step is kept (the estimate drifts slowly between batch changes).
TPOT_BANDS = (0.1, 0.03, 0.01, 0.003)
#: Windows tried, in decode steps, shortest first: the longest that passes stands.
LADDER = (1, 4, 16, 64, 256, 1024)
#: A window's time limit, in step-time estimates per step (the engine also stops at `steps`).
TIME_PER_STEP = 2.0


class Certificate(Backfill, Order, Preemption):
    """The proof that an empty decision stands, for as many steps as it can be made: the
    inputs (`standing_inputs`), the ranges (`standing_ranges`) and one module per condition
    (`standing_backfill`: 1, `standing_preemption`: 2, `standing_order`: 3 and 4)."""

    # -- the window ----------------------------------------------------------------------
    def standing(self, steps: int = LADDER[-1]) -> Standing | None:
        """The longest window of `LADDER` (cut at `steps`) the decision provably stands for,
        or None (`base.ProvesStanding`)."""
        self.ladder = (*(k for k in LADDER if k < steps), min(steps, LADDER[-1]))
        found = self._prove() if steps >= 1 else None
        if self.tally is not None:
            self.tally[f"stands {found.steps}" if found else (self.failed or "none")] += 1
        return found

    def _prove(self) -> Standing | None:
        if not self.visited or not self.running:
            return None
        if self._scores_cannot_hold():
            self.failed = "scores"
            return None
        if not self._prepare():
            self.failed = self.failed or "starvation"
            return None
        # the usual answer first: the longest window at the widest band
        self._band(TPOT_BANDS[0])
        best = self._window(self.ladder[-1])
        if best is not None:
            return best
        # then the shortest window at the narrowest band: if that fails, every one does
        self._band(TPOT_BANDS[-1])
        if self._window(self.ladder[0]) is None:
            return None
        for band in TPOT_BANDS:  # the widest band that stands one step
            self._band(band)
            best = self._window(self.ladder[0])
            if best is not None:
                break
        # the longest window of the ladder that stands at that band: bisecting between the
        # longest known to stand and the shortest not
        good, bad = 0, len(self.ladder) - (1 if band == TPOT_BANDS[0] else 0)
        while bad - good > 1:
            mid = len(self.ladder) - 1 if bad == len(self.ladder) else (good + bad) // 2
            found = self._window(self.ladder[mid])
            if found is None:
                bad = mid
            else:
                good, best = mid, found
        return best

    # -- one window ------------------------------------------------------------------------
    def _window(self, steps: int) -> Standing | None:
        """The standing for `steps` decode steps, if the certificate holds over them."""
        self._residuals(steps)
        until = min(self.until_starve, self.now + TIME_PER_STEP * steps * self.tpot_hi)
        h_lo, h_hi = self._horizon_range()
        u_lo, u_hi = self._weight_range(h_lo, h_hi, until)
        n_lo = u_lo[self.task_of] * self.share  # gains / H
        n_hi = u_hi[self.task_of] * self.share
        if not self._order_holds(u_lo, u_hi):
            self.failed = "agent order"
            return None
        considered = self._considered(n_lo, n_hi)
        # per scored set (rows) and considered request (columns): the budget above which it
        # fits, where the set's pack walks it
        agent = self.agent_of[considered]
        walked = self.walks[:, agent] | self.urgent[considered][None, :]
        cost = self.cost[considered][None, :]
        fits_at = np.where(walked, cost + self.offsets[:, agent], np.inf)
        # a set whose pack admits something (and loses) is bounded by its score instead
        fits_at[self.acting] = np.inf
        margin = BUDGET_MARGIN
        budget_lo = self.swap_lo
        budget_hi = min(self.swap_hi, float(fits_at.min(initial=math.inf)))
        first = np.ones(len(considered), dtype=bool)  # may be walked first (and preempt)
        if budget_hi < self.budget0 + margin:
            # something fits now: it must be one a reservation holds back (backfill)
            budget_lo = max(budget_lo, self.budget0 - len(self.running) * steps)
            budget_hi, first = self._held_back(considered, fits_at, budget_lo, n_lo, n_hi, steps)
        if not budget_lo + margin <= self.budget0 <= budget_hi - margin:
            self.failed = "fits"
            return None
        fits_at = np.where(first, fits_at.min(axis=0), np.inf)
        if self.acting.any():
            # in a pack that admits, any request may find no reservation, and its agent's
            # prefix may be paid already
            paid_at = np.where(walked, cost + self.paid_offsets[:, agent], np.inf)[self.acting]
            fits_at = np.minimum(fits_at, paid_at.min(axis=0))
        gain_hi = n_hi[considered] * (h_hi * (1.0 + EPS))
        pays = self._preemption_test(gain_hi, steps)
        if pays is not None and pays(fits_at - budget_hi):
            # a lower ceiling leaves more memory to free, so dearer victims: the highest
            # ceiling (bisected) at which no preemption can pay
            low, high = self.budget0 + margin, budget_hi
            if pays(fits_at - low):
                self.failed = "preemption"
                return None
            for _ in range(CEILING_BISECTIONS):
                mid = 0.5 * (low + high)
                low, high = (low, mid) if pays(fits_at - mid) else (mid, high)
            budget_hi = low
        if self.acting.any():
            admits = walked & (cost + self.paid_offsets[:, agent] < budget_hi)
            best = np.where(admits, gain_hi[None, :], 0.0).sum(axis=1) + self.reuse_max
            if not self._comparisons_hold(best):
                self.failed = "scores"
                return None
        return Standing(
            steps=steps, until_s=until, tpot_lo_s=self.tpot_lo, tpot_hi_s=self.tpot_hi,
            budget_lo=budget_lo, budget_hi=budget_hi,
        )  # fmt: skip
