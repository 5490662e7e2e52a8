"""Condition 2 of a standing decision (`standing`'s docstring): no preemption pays, whatever
victims a candidate would take, over the window."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from topas_bench.schedulers.topas.standing_inputs import EPS, F64, Prepared


class Preemption(Prepared):
    """The least a candidate's victims can cost, against its largest gain."""

    def _preemption_test(self, gain_hi: F64, steps: int) -> Callable[[F64], bool] | None:
        """2: whether some candidate's preemption may pay, given `need`, the least memory
        each would have to free (its cost less the budget ceiling). Its victims must free more
        than that: at least the p victims with the most frees (at their largest over the
        window) that together exceed it, so they cost at least the p cheapest keep values (at
        their least: tpot low, generated tokens as now), and at least the fractional cover of
        the need at the cheapest keep value per token freed; and where the victims' order by
        keep value holds, at least the prefix of that order the pack would take. None when no
        preemption can pay at any need: no victims, or no gain beats the cheapest victim by
        the margin."""
        if not self.victims:
            return None
        g, fixed = self.v_generated, self.v_fixed
        keep_lo = (self.tpot_lo * g + fixed) * (1.0 - EPS)
        margin = self.inp.preempt_margin_s  # infinite where the class never preempts
        top, cheapest_one = float(gain_hi.max(initial=0.0)), float(keep_lo.min())
        # `pays` below with every gain at its largest and every value at its least
        if top - cheapest_one * (1.0 - EPS) + EPS * (1.0 + top + abs(margin)) <= margin:
            return None
        # (int() of a residual, never negative, is its floor)
        frees_hi = self.v_base + g + steps + np.floor(np.array(self._rt_hi)[self.v_index])
        room = frees_hi > 0
        rate = np.where(room, keep_lo / np.where(room, frees_hi, 1.0), math.inf)
        order = np.argsort(rate, kind="stable")
        order = order[room[order]]
        cum_frees = np.concatenate(([0.0], np.cumsum(frees_hi[order])))
        cum_keep = np.concatenate(([0.0], np.cumsum(keep_lo[order])))
        most_frees = np.cumsum(np.sort(frees_hi)[::-1])  # the p victims freeing most, p = 1..
        cheapest = np.cumsum(np.sort(keep_lo))  # the p cheapest keep values
        total = cum_frees[-1]
        last = len(cheapest) - 1
        # The pack takes victims cheapest first (`Topas._victims`' order) until they make
        # room: where that order cannot change over the window, the victims it takes are a
        # prefix of it, at least as long as with every one freeing its most.
        keep_hi = (self.tpot_hi * (g + steps) + fixed) * (1.0 + EPS)
        ordered = bool(np.all(keep_hi[:-1] < keep_lo[1:]))
        prefix_frees = np.cumsum(frees_hi)
        prefix_keep = np.cumsum(keep_lo)

        def pays(need: F64) -> bool:
            p = np.searchsorted(most_frees, need, side="right")  # victims needed, less one
            fewest = cheapest[np.minimum(p, last)]
            value_lo = np.maximum(np.interp(need, cum_frees, cum_keep), fewest)
            if ordered:
                taken = np.searchsorted(prefix_frees, need, side="right")
                value_lo = np.maximum(value_lo, prefix_keep[np.minimum(taken, last)])
            slack = EPS * (1.0 + np.abs(gain_hi) + np.abs(value_lo) + abs(margin))
            possible = need < total  # else every victim together cannot make room
            return bool(np.any(possible & (gain_hi - value_lo > margin - slack)))

        return pays
