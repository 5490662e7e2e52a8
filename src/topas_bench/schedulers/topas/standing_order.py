"""Conditions 3 and 4 of a standing decision (`standing`'s docstring): the search's order of
agents holds, and every comparison of scores it made goes the same way; and which waiting
requests a pack may walk in the window."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

from topas_bench.schedulers.topas.standing_inputs import EPS, F64, Prepared


class Order(Prepared):
    """The order tests: agents by waiting gain, scored sets by score."""

    def _order_holds(self, u_lo: F64, u_hi: F64) -> bool:
        """4: the search's agent order (by waiting gain, then name) holds through its top
        `max_agents` and the first one past them. For two neighbours x before y, the gain
        difference `sum_t w_t (s_xt - s_yt)` (w_t: task t's weight, s_at: the shares of a's
        requests in task t) stays positive with each w_t anywhere in its range; two agents
        whose requests are the same tasks with the same shares, in the same queue order, have
        the same gain to the last bit, and keep their order by name."""
        for pos, neg, shares in self._differences():
            low = float(pos.dot(u_lo) + neg.dot(u_hi))
            scale = float((pos - neg).dot(u_hi)) + shares * float(u_hi.max())
            if not low > EPS * scale:
                return False
        return True

    def _differences(self) -> list[tuple[F64, F64, float]]:
        """Per neighbour pair of `_order_holds` that is not tied for good: the positive and
        negative parts of `s_xt - s_yt` over tasks t, and the pair's summed shares."""
        if self._pairs is None:
            tasks = len(self.service)
            self._pairs = []
            for x, y in self.neighbours:
                sx, sy = self._terms(x), self._terms(y)
                if sx[0].tolist() == sy[0].tolist() and sx[1].tolist() == sy[1].tolist():
                    continue  # the same sums in the same order: tied for good, by name
                d = np.bincount(sx[0], weights=sx[1], minlength=tasks).astype(np.float64)
                d -= np.bincount(sy[0], weights=sy[1], minlength=tasks)  # (empty: integers)
                shares = float(sx[1].sum() + sy[1].sum())
                self._pairs.append((np.maximum(d, 0.0), np.minimum(d, 0.0), shares))
        return self._pairs

    def _terms(self, agent: str) -> tuple[npt.NDArray[np.int64], F64]:
        """The tasks and shares of `agent`'s waiting requests, in queue order."""
        mine = self.agent_of == self.agent_ix[agent]
        return self.task_of[mine], self.share[mine]

    def _considered(self, n_lo: F64, n_hi: F64) -> npt.NDArray[np.intp]:
        """Indices of the waiting requests that may be walked by a pack in the window: every
        starving one, and those whose ranking key may reach the scan's top `scan`."""
        key_lo, key_hi = n_lo, n_hi
        if self.p.density:
            key_lo, key_hi = n_lo / self.denom, n_hi / self.denom
        calm = ~self.urgent
        scan = self.inp.scan
        keep = self.urgent.copy()
        if int(calm.sum()) <= scan:
            keep |= calm
        else:
            threshold = np.partition(key_lo[calm], -scan)[-scan]
            keep |= calm & (key_hi * (1.0 + EPS) >= threshold * (1.0 - EPS))
        return np.flatnonzero(keep)

    def _acting_comparisons(self) -> Iterator[tuple[int, int, float]]:
        """(x's index, y's index, margin) of each comparison the search made between sets x
        (kept) and y of which one acts; a comparison of two fixed sets holds (3)."""
        where = {keep: s for s, keep in enumerate(self.visited)}
        for x, y, margin in self.comparisons:
            i, j = where[x], where[y]
            if self.acting[i] or self.acting[j]:
                yield i, j, margin

    def _fails_whatever_bounds(self, i: int, j: int, margin: float) -> bool:
        """The tests of `_comparisons_hold` that read only the scores and which sets act."""
        if self.scores[j] > self.scores[i] + margin:  # y was preferred: it must stay so, so
            return True  # its least must beat (an acting set's least score is not bounded here)
        return bool(self.acting[i])  # x kept: its least must stay above y's most

    def _scores_cannot_hold(self) -> bool:
        """Whether `_comparisons_hold` fails at every window, whatever its bounds: a comparison
        with an acting set that preferred y, or kept an acting x. Those two tests read only
        the scores and which sets act, so no window can pass them; checking them first spares
        the proof (the answer, None, is the same)."""
        return any(self._fails_whatever_bounds(*c) for c in self._acting_comparisons())

    def _comparisons_hold(self, best: F64) -> bool:
        """4 with packs that act: every comparison of scores the search made goes the same
        way over the window. An empty pack's score is fixed (3); one that admits is at most
        the most gain of every request it may admit plus its most reuse (it loses the rest:
        redo, revoke, moves are never negative); no preemption pays (2)."""
        for i, j, margin in self._acting_comparisons():
            if self._fails_whatever_bounds(i, j, margin):
                return False
            sx, sy = self.scores[i], self.scores[j]
            slack = EPS * (1.0 + abs(sx) + abs(sy) + float(best[i]) + float(best[j]))
            if not float(best[j]) <= sx + margin - slack:
                return False
        return True
