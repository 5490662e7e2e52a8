"""Each drifting input's range over a window (`standing`'s docstring): the step-time band, the
running requests' residual outputs, the horizon H, the tasks' weights, the victims' releases
and a waiting request's least service."""

from __future__ import annotations

import numpy as np

from topas_bench.schedulers.topas.standing_inputs import EPS, F64, Prepared


class Ranges(Prepared):
    """The ranges, over the window being tried, that the tests bound their quantities by."""

    def _band(self, band: float) -> None:
        self.tpot_lo, self.tpot_hi = self.tpot * (1.0 - band), self.tpot * (1.0 + band)

    def _residuals(self, steps: int) -> None:
        """Each running request's residual output range over generated .. generated + steps
        (memoised per window length: the ladder tries several)."""
        hit = self._rt_memo.get(steps)
        if hit is None:
            est = self.view.estimator
            lo, hi = [], []
            for r in self.running:
                a, b = est.residual_tokens_range(
                    r.agent, r.kind, r.generated, steps, (r.task_id, r.stage_id)
                )
                lo.append(a)
                hi.append(b)
            hit = self._rt_memo[steps] = (lo, hi)
        self._rt_lo, self._rt_hi = hit

    def _horizon_range(self) -> tuple[float, float]:
        """`Topas._horizon` over the window: mean residual service of the running requests,
        at least one step."""
        if self.p.horizon_s is not None:
            return self.p.horizon_s, self.p.horizon_s
        n = len(self.running)
        lo = max(sum(self._rt_lo) / n * self.tpot_lo, self.tpot_lo)
        hi = max(sum(self._rt_hi) / n * self.tpot_hi, self.tpot_hi)
        return lo * (1.0 - EPS), hi * (1.0 + EPS)

    def _weight_range(self, h_lo: float, h_hi: float, until: float) -> tuple[F64, F64]:
        """Each task's weight over H (aging x SRPT factor), low and high, over the window:
        aging rises with time; the SRPT factor (mean L / L_i) ** alpha is monotone in H (a
        ratio of two functions linear in H), so its extremes are at H's ends."""
        alpha = self.p.srpt_exponent
        g_lo, g_hi = self.aging_now, self.aging_now
        if self.pool.h_age > 0:
            waited = np.maximum(until - self.arrival, 0.0)
            g_hi = 1.0 + self.p.rho * np.log1p(waited / self.pool.h_age)
        if alpha:
            length = self.service + self.hops * np.array([[h_lo], [h_hi]])  # L at both ends
            ratio = length.mean(axis=1, keepdims=True) / np.where(self.live, length, 1.0)
            ratio = np.where(self.live, ratio, 1.0)  # no SRPT factor on an empty path
            g_lo = g_lo * ratio.min(axis=0) ** alpha
            g_hi = g_hi * ratio.max(axis=0) ** alpha
        return g_lo * (1.0 - EPS), g_hi * (1.0 + EPS)

    def _releases(self, steps: int) -> tuple[list[float], list[float], list[int], list[int]]:
        """The victims' release times (their residual service) and frees, least and most,
        over the window (`pack.PackInputs.victims`, whose releases backfill counts on)."""
        t_lo, t_hi, f_lo, f_hi = [], [], [], []
        for i, g, _, base in self.victims:
            t_lo.append(self._rt_lo[i] * self.tpot_lo * (1.0 - EPS))
            t_hi.append(self._rt_hi[i] * self.tpot_hi * (1.0 + EPS))
            f_lo.append(base + g + int(self._rt_lo[i]))
            f_hi.append(base + g + steps + int(self._rt_hi[i]))
        return t_lo, t_hi, f_lo, f_hi

    def _service_lo(self, i: int) -> float:
        """The least expected service of waiting request i over the window (its prefill, and
        its expected output at the low step time): when admitting it would give memory back."""
        r = self.rows.requests[i]
        est = self.view.estimator
        out = est.residual_tokens(r.agent, r.kind, r.generated, (r.task_id, r.stage_id))
        prefill = est.prefill_s(max(r.prompt_tokens + r.generated, 1), 0)
        return (out * self.tpot_lo + prefill) * (1.0 - EPS)
