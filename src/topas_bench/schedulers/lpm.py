"""`lpm`: SGLang's longest-prefix-match policy, with its quirks.

Mirrors SGLang 0.5.23 `SchedulePolicy` (`managers/schedule_policy.py`):
- `_sort_by_longest_prefix`: a stable sort of the waiting queue as it stands by matched prefix
  length (at most the request's length minus one, `Req._compute_max_prefix_len`), longest first;
  ties keep their queue order, whatever earlier sorts left it as.
- `_determine_active_policy`: with more than `WAITING_QUEUE_PREFIX_MATCH_MAX` (128) waiting
  requests, prefix matching is skipped and the queue keeps its current order.
- `_compute_prefix_matches` (in-batch prefix caching): a request whose own cache hit is at most
  `IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD` (32) tokens but which shares at least
  `IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD` (32) tokens with an earlier such request in
  the queue is deprioritised for this round (sorted last), so a shared prefix is computed once,
  then reused. Shared tokens are counted token-exactly (`workloads.pieces`).

With SGLang's thresholds, SGLang's own pass has already sorted the queue this way when the
policy decides (the simulator's `runners.sim.calc_priority`, the server's `SchedulePolicy`
behind the plugin); sorting again changes nothing (a request not demoted shares too little with
every other one not demoted, so the demotions are the same on the sorted queue, and the sort is
stable). Other thresholds sort only here, after an `fcfs` pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from topas_bench.schedulers.base import Decision, Policy, RequestView, ServerNeeds
from topas_bench.schedulers.validate import declared, integer
from topas_bench.schedulers.view import EngineView
from topas_bench.workloads.pieces import Piece, common, fill_pieces, length

#: SGLang's `WAITING_QUEUE_PREFIX_MATCH_MAX` and `IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD` (=
#: `IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD`).
PREFIX_MATCH_MAX = 128
IN_BATCH_THRESHOLD = 32


class LPM(Policy):
    """SGLang's longest prefix match (queue order above 128 waiting, in-batch deprioritisation)."""

    name = "lpm"

    fallback_above = integer(PREFIX_MATCH_MAX, 0)
    in_batch_check_tokens = integer(IN_BATCH_THRESHOLD, 0)
    in_batch_deprioritize_tokens = integer(IN_BATCH_THRESHOLD, 0)

    @property
    def needs(self) -> ServerNeeds:
        """SGLang's own `lpm` (the reference engine runs it natively) with SGLang's thresholds.
        SGLang's constants cannot express other thresholds: the plugin then serves this policy
        on a server started with `fcfs`, whose queue bookkeeping applies."""
        if self.params != {key: p.default for key, p in declared(LPM).items()}:
            return ServerNeeds()
        return ServerNeeds(schedule_policy="lpm", native=True)

    def decide(self, view: EngineView) -> Decision:
        queue = list(view.waiting)
        if self.fallback_above and len(queue) > self.fallback_above:
            return Decision(admit=queue)
        hits = {r.rid: view.cached_tokens(r) for r in queue}
        demoted = self._in_batch_demotions(queue, hits)

        def key(r: RequestView) -> float:
            if r.rid in demoted:
                return float("inf")
            return -min(hits[r.rid], r.prompt_tokens + r.generated - 1)

        return Decision(admit=sorted(queue, key=key))

    def _in_batch_demotions(self, queue: list[RequestView], hits: dict[int, int]) -> set[int]:
        return in_batch_demotions(
            queue, hits, self.in_batch_check_tokens, self.in_batch_deprioritize_tokens
        )


def in_batch_demotions(
    queue: Sequence[RequestView], hits: Mapping[int, int], check: int, deprioritize: int
) -> set[int]:
    """`SchedulePolicy._compute_prefix_matches`'s in-batch prefix caching: rids of the requests,
    in queue order, whose own cache hit is at most `check` tokens and which share at least
    `deprioritize` tokens with an earlier such request that was not itself demoted."""
    seen: list[list[Piece]] = []
    demoted: set[int] = set()
    for r in queue:
        if hits[r.rid] > check:
            continue
        fill = fill_pieces(r.prompt, r.task_id, r.stage_id, r.generated)
        n = length(fill)
        if any(common(fill, other, n) >= deprioritize for other in seen):
            demoted.add(r.rid)
        else:
            seen.append(fill)
    return demoted
