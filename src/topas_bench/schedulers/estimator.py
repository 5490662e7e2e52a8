"""The online service-time estimator every policy shares (docs/design.md section 3).

Per (agent, stage kind) it keeps the empirical distribution of output lengths of finished
requests (a sliding window of the most recent `window` observations), seeded with a prior of
`prior_weight` pseudo-observations at `prior_output_tokens`. Service time in seconds is
`prefill time of the uncached prompt + output tokens * time per output token`, where the time per
output token is an exponentially weighted mean of the decode iterations the engine reports,
starting from the cost model's batch-1 decode time. Working in tokens makes "service already
received" exact (the tokens a request has generated), and the residual
``E[X - g | X > g]`` is read straight off the empirical distribution.

Policies see true output lengths only when the run uses the oracle length hint: then the engine
hands the estimator a lookup of true lengths and every expectation uses it instead.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

from topas_bench.schedulers.request import RequestView, StageView


class CostLike(Protocol):
    def prefill_s(self, items: Sequence[tuple[int, int]]) -> float: ...
    def decode_step_s(self, batch: int, context_tokens: int) -> float: ...


TrueLength = Callable[[str, str], int]  # (task_id, stage_id) -> true output tokens
#: Weight of each new tool-time observation (TokenCake's `OffloadConfig.ewma_alpha`,
#: pku-lemonade/TokenCake `vllm/tokencake/config.py`).
TOOL_ALPHA = 0.5
#: Before (and beside) what it has seen of an (agent, kind), the estimator expects this many
#: output tokens, weighted as this many samples.
PRIOR_OUTPUT_TOKENS = 256.0
PRIOR_WEIGHT = 2.0
#: Output lengths kept per (agent, kind): the latest this many.
WINDOW = 512
#: Weight of each decode iteration's time in the time-per-output-token estimate.
TPOT_ALPHA = 0.05
F64 = npt.NDArray[np.float64]


class _Dist:
    """Sorted window of samples with suffix sums, for O(log n) conditional residual means."""

    __slots__ = ("_order", "_sorted", "_suffix", "_table", "_window")

    def __init__(self, window: int) -> None:
        self._window = window
        self._order: deque[float] = deque()
        self._sorted: list[float] = []
        self._suffix: list[float] | None = [0.0]  # _suffix[i] = sum(_sorted[i:]); None: stale
        self._table: F64 | None = None  # `residual_table`

    def add(self, x: float) -> None:
        self._order.append(x)
        bisect.insort(self._sorted, x)
        if len(self._order) > self._window:
            old = self._order.popleft()
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._suffix = None  # rebuilt when next read: many adds may come before a read
        self._table = None

    def _sums(self) -> list[float]:
        suffix = self._suffix
        if suffix is None:
            suffix = [0.0] * (len(self._sorted) + 1)
            for i in range(len(self._sorted) - 1, -1, -1):
                suffix[i] = suffix[i + 1] + self._sorted[i]
            self._suffix = suffix
        return suffix

    def residual_table(self, upto: int, prior: float, prior_weight: float) -> F64:
        """`residual(a)` at every whole a = 0 .. upto (at least), the same arithmetic element
        by element; kept until the next sample (grown, doubling, when asked for more)."""
        table = self._table
        if table is None or len(table) <= upto:
            values, suffix = np.array(self._sorted), np.array(self._sums())
            size = max(upto + 1, 2 * (len(table) if table is not None else 0), 1024)
            a = np.arange(size, dtype=np.float64)
            i = np.searchsorted(values, a, side="right")
            n_above = len(values) - i
            total = suffix[i] - a * n_above
            weight = n_above.astype(np.float64)
            has_prior = prior > a
            total = np.where(has_prior, total + prior_weight * (prior - a), total)
            weight = np.where(has_prior, weight + prior_weight, weight)
            empty = weight == 0.0
            table = np.where(empty, np.maximum(1.0, 0.1 * a), total / np.where(empty, 1.0, weight))
            self._table = table
        return table

    def residual(self, attained: float, prior: float, prior_weight: float) -> float:
        """E[X - a | X > a] over the samples plus `prior_weight` pseudo-samples at `prior`."""
        i = bisect.bisect_right(self._sorted, attained)
        n_above = len(self._sorted) - i
        total = self._sums()[i] - attained * n_above
        weight = float(n_above)
        if prior > attained:
            total += prior_weight * (prior - attained)
            weight += prior_weight
        if weight == 0.0:
            # Everything seen finished earlier than this request has run: expect it to end
            # soon, but not instantly (one more quantum of its own length).
            return max(1.0, 0.1 * attained)
        return total / weight


class ServiceEstimator:
    """Expected (residual) output tokens and service seconds per (agent, kind)."""

    def __init__(self, cost: CostLike, *, true_length: TrueLength | None = None) -> None:
        self._cost = cost
        self._true = true_length
        self._dists: dict[tuple[str, str], _Dist] = {}
        self._tpot_s = cost.decode_step_s(1, 1024)
        self._prefill_memo: dict[tuple[int, int], float] = {}
        self._full_memo: dict[tuple[str, str], float] = {}
        #: Bumped on every observed finish: expectations in tokens only change then.
        self.version = 0
        self._tools: dict[tuple[str, str], float] = {}

    @property
    def oracle(self) -> bool:
        return self._true is not None

    @property
    def tpot_s(self) -> float:
        """Current estimate of the time per output token (one decode iteration)."""
        return self._tpot_s

    def observe(self, agent: str, kind: str, output_tokens: int) -> None:
        """A request of (agent, kind) finished with `output_tokens` tokens."""
        d = self._dists.get((agent, kind))
        if d is None:
            d = self._dists[(agent, kind)] = _Dist(WINDOW)
        d.add(float(output_tokens))
        self._full_memo.pop((agent, kind), None)
        self.version += 1

    def observe_tool(self, agent: str, kind: str, wait_s: float) -> None:
        """A call of (agent, kind) reached the server `wait_s` seconds after the last call it
        depends on (in its task) finished: the client's tool time as a server sees it."""
        prev = self._tools.get((agent, kind))
        a = TOOL_ALPHA
        self._tools[(agent, kind)] = wait_s if prev is None else a * wait_s + (1.0 - a) * prev

    def tool_s(self, agent: str, kind: str) -> float | None:
        """The expected tool time before a call of (agent, kind): an exponentially weighted
        mean (`TOOL_ALPHA`) of those observed (`observe_tool`); None before the first."""
        return self._tools.get((agent, kind))

    def observe_decode(self, step_s: float, steps: int = 1) -> None:
        """The engine ran `steps` decode iterations of `step_s` seconds each."""
        keep = (1.0 - TPOT_ALPHA) ** steps
        self._tpot_s = keep * self._tpot_s + (1.0 - keep) * step_s

    def observe_decode_steps(self, steps_s: Sequence[float]) -> None:
        """`observe_decode(s, 1)` for each step duration in order, in one call (the same
        arithmetic, step by step)."""
        keep = (1.0 - TPOT_ALPHA) ** 1
        rest = 1.0 - keep
        tpot = self._tpot_s
        for s in steps_s:
            tpot = keep * tpot + rest * s
        self._tpot_s = tpot

    def tpot_path(self, steps_s: Sequence[float]) -> list[float]:
        """`tpot_s` after each of `steps_s` were observed in turn (`observe_decode_steps`'
        arithmetic), without observing them."""
        keep = (1.0 - TPOT_ALPHA) ** 1
        rest = 1.0 - keep
        tpot = self._tpot_s
        out = []
        for s in steps_s:
            tpot = keep * tpot + rest * s
            out.append(tpot)
        return out

    def residual_tokens(
        self, agent: str, kind: str, generated: int, key: tuple[str, str] | None = None
    ) -> float:
        """Expected output tokens still to come for a call that has produced `generated`.

        `key` = (task_id, stage_id) lets the oracle answer exactly.
        """
        if self._true is not None and key is not None:
            return float(max(self._true(*key) - generated, 0))
        if generated == 0:
            full = self._full_memo.get((agent, kind))
            if full is None:
                full = self._full_memo[(agent, kind)] = self._residual(agent, kind, 0)
            return full
        return self._residual(agent, kind, generated)

    def residual_tokens_sample(
        self,
        agent: str,
        kind: str,
        generated: int,
        u: float,
        key: tuple[str, str] | None = None,
    ) -> float:
        """The `u`-quantile (0 <= u < 1) of the output tokens still to come, over the lengths
        seen above `generated` (`residual_tokens` where none is: no spread is known; the true
        length under the oracle). Averaged over uniform u it is the empirical residual mean."""
        if self._true is not None and key is not None:
            return self.residual_tokens(agent, kind, generated, key)
        d = self._dists.get((agent, kind))
        if d is None:
            return self.residual_tokens(agent, kind, generated, key)
        seen = d._sorted
        i = bisect.bisect_right(seen, generated)
        n = len(seen) - i
        if n <= 0:
            return self.residual_tokens(agent, kind, generated, key)
        return seen[i + min(int(u * n), n - 1)] - generated

    def residual_tokens_range(
        self, agent: str, kind: str, generated: int, steps: int, key: tuple[str, str] | None = None
    ) -> tuple[float, float]:
        """(min, max) of `residual_tokens` over `generated .. generated + steps`, with the
        distributions as they are now (they change only with a finish): exact, from the
        residual at every count of the window (`_Dist.residual_table`). Without samples, or
        with true lengths, the residual only falls: its ends."""
        last = generated + steps
        d = self._dists.get((agent, kind))
        if d is None or (self._true is not None and key is not None):  # monotone: the ends
            a = self.residual_tokens(agent, kind, generated, key)
            b = self.residual_tokens(agent, kind, last, key)
            return min(a, b), max(a, b)
        window = d.residual_table(last, PRIOR_OUTPUT_TOKENS, PRIOR_WEIGHT)[generated : last + 1]
        return float(window.min()), float(window.max())

    def _residual(self, agent: str, kind: str, generated: int) -> float:
        d = self._dists.get((agent, kind))
        if d is None:
            return max(PRIOR_OUTPUT_TOKENS - generated, 1.0)
        return d.residual(float(generated), PRIOR_OUTPUT_TOKENS, PRIOR_WEIGHT)

    def prefill_s(self, new_tokens: int, cached_tokens: int = 0) -> float:
        if new_tokens <= 0:
            return 0.0
        key = (new_tokens, cached_tokens)
        t = self._prefill_memo.get(key)
        if t is None:
            if len(self._prefill_memo) > 65536:
                self._prefill_memo.clear()
            t = self._prefill_memo[key] = self._cost.prefill_s([(cached_tokens, new_tokens)])
        return t

    def prompt_estimate(self, task_id: str, stage: StageView) -> float:
        """Expected prompt size of a stage not yet sent: what exists of it, plus the expected
        output of each stage whose output it will carry and that has not finished (the same
        estimate every policy gets; the true outputs are not shown before they are made)."""
        total = float(stage.prompt_tokens)
        for sid, agent, kind in stage.pending_outputs:
            total += self.residual_tokens(agent, kind, 0, (task_id, sid))
        return total

    def stage_service_s(self, task_id: str, stage: StageView, cached_tokens: int = 0) -> float:
        """Expected service of a stage not yet admitted (prefill + all its output)."""
        out = self.residual_tokens(stage.agent, stage.kind, 0, (task_id, stage.id))
        new = max(int(self.prompt_estimate(task_id, stage)) - cached_tokens, 1)
        return self.prefill_s(new, cached_tokens) + out * self._tpot_s

    def residual_service_s(self, req: RequestView, cached_tokens: int = 0) -> float:
        """Expected remaining service of a request, given what it has generated.

        A request still waiting (never admitted, or preempted) also owes its prefill.
        """
        out = self.residual_tokens(req.agent, req.kind, req.generated, (req.task_id, req.stage_id))
        rest = out * self._tpot_s
        if req.admitted_s is None:
            new = max(req.prompt_tokens + req.generated - cached_tokens, 1)
            rest += self.prefill_s(new, cached_tokens)
        return rest
