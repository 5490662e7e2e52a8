"""`lpm-aging`: longest prefix match with a fairness bound, the fix a serving engineer tries
before a new scheduler.

k-LPM (Dexter et al., "LLM Query Scheduling with Prefix Reuse and Latency Constraints", arXiv
2502.04677, NeurIPS 2025): serve the oldest waiting query, then `k - 1` queries by longest
prefix match, and repeat; `k = 1` is FCFS, `k = inf` is LPM, and any finite `k` bounds how many
cache-hot queries can overtake a cold one. In a batching server one pass admits several
requests, so the cycle runs over the pass's admission order: position 0 is the oldest request
(queue entry, then rid), positions 1..k-1 the longest matches, position k the next oldest, ...

Optionally also the aging of SGLang PR #31723 (`--lpm-aging-tokens-per-pass N`, proposed for
0.5.x, issue #31954): the LPM key becomes `matched + N * passes`, `passes` counting the
prefill passes a request has waited through, so a cold request's effective match grows until it
is served. Off by default (`aging_tokens_per_pass = 0`).

The LPM part is SGLang's `lpm` as it is (`schedulers.lpm`): SGLang's pass matches and sorts
first (in-batch demotions sort last, and above 128 waiting requests the queue keeps FCFS
order, which k-LPM then leaves alone).
"""

from __future__ import annotations

from topas_bench.schedulers.base import Decision, Policy, RequestView, ServerNeeds
from topas_bench.schedulers.lpm import IN_BATCH_THRESHOLD, PREFIX_MATCH_MAX, in_batch_demotions
from topas_bench.schedulers.validate import integer, number
from topas_bench.schedulers.view import EngineView


class LPMAging(Policy):
    """k-LPM: every k-th admission is the oldest waiting request, the others longest match."""

    name = "lpm-aging"

    k = integer(4, 1)
    aging_tokens_per_pass = number(0.0)

    def setup(self) -> None:
        self._passes: dict[int, int] = {}

    @property
    def needs(self) -> ServerNeeds:
        """SGLang's `lpm` pass first (its prefix matching and order), then this policy's."""
        return ServerNeeds(schedule_policy="lpm")

    def decide(self, view: EngineView) -> Decision:
        queue = list(view.waiting)
        live = {r.rid for r in queue}
        self._passes = {rid: self._passes.get(rid, 0) + 1 for rid in live}
        if len(queue) > PREFIX_MATCH_MAX:
            return Decision(admit=queue)  # SGLang's lpm falls back to FCFS order here
        hits = {r.rid: view.cached_tokens(r) for r in queue}
        demoted = in_batch_demotions(queue, hits, IN_BATCH_THRESHOLD, IN_BATCH_THRESHOLD)

        def lpm_key(r: RequestView) -> tuple[bool, float]:
            matched = min(hits[r.rid], r.prompt_tokens + r.generated - 1)
            return (r.rid in demoted, -(matched + self.aging_tokens_per_pass * self._passes[r.rid]))

        by_match = sorted(queue, key=lpm_key)
        by_age = sorted(queue, key=lambda r: (r.queued_s, r.rid))
        order: list[RequestView] = []
        taken: set[int] = set()
        cursors = {"age": 0, "match": 0}
        while len(order) < len(queue):
            lane, source = ("age", by_age) if len(order) % self.k == 0 else ("match", by_match)
            while source[cursors[lane]].rid in taken:
                cursors[lane] += 1
            pick = source[cursors[lane]]
            taken.add(pick.rid)
            order.append(pick)
        return Decision(admit=order)
