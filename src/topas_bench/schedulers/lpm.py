"""`lpm`: SGLang's longest-prefix-match policy, with its quirks.

Mirrors SGLang 0.5.23 `SchedulePolicy` (`managers/schedule_policy.py`):
- `_sort_by_longest_prefix`: waiting requests by matched prefix length, longest first; ties keep
  queue order (FCFS).
- `_determine_active_policy`: with more than `WAITING_QUEUE_PREFIX_MATCH_MAX` (128) waiting
  requests, prefix matching is skipped and the queue is served FCFS.
- `_compute_prefix_matches` (in-batch prefix caching): a request whose own cache hit is at most
  `IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD` (32) tokens but which shares at least
  `IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD` (32) tokens with a request ahead of it in the
  queue is deprioritised for this round, so a shared prefix is computed once, then reused.
"""

from __future__ import annotations

from typing import Any

from topas_bench.schedulers.base import Decision, EngineView, Policy, RequestView, require_int


class LPM(Policy):
    """SGLang's longest prefix match (FCFS above 128 waiting, in-batch deprioritisation)."""

    name = "lpm"
    reorders_during_decode = False

    def __init__(
        self,
        fallback_above: int = 128,
        in_batch_check_tokens: int = 32,
        in_batch_deprioritize_tokens: int = 32,
    ) -> None:
        require_int(self.name, "fallback_above", fallback_above, 0)
        require_int(self.name, "in_batch_check_tokens", in_batch_check_tokens, 0)
        require_int(self.name, "in_batch_deprioritize_tokens", in_batch_deprioritize_tokens, 0)
        self.fallback_above = fallback_above
        self.check = in_batch_check_tokens
        self.deprioritize = in_batch_deprioritize_tokens

    @property
    def params(self) -> dict[str, Any]:
        return {
            "fallback_above": self.fallback_above,
            "in_batch_check_tokens": self.check,
            "in_batch_deprioritize_tokens": self.deprioritize,
        }

    def decide(self, view: EngineView) -> Decision:
        queue = sorted(view.waiting, key=lambda r: (r.queued_s, r.rid))
        if self.fallback_above and len(queue) > self.fallback_above:
            return Decision(admit=queue)
        hits = {r.rid: view.cached_tokens(r) for r in queue}
        demoted = self._in_batch_demotions(queue, hits)
        # Demoted requests all sort last in queue order (SGLang keys them float("inf")).
        return Decision(
            admit=sorted(queue, key=lambda r: float("inf") if r.rid in demoted else -hits[r.rid])
        )

    def _in_batch_demotions(self, queue: list[RequestView], hits: dict[int, int]) -> set[int]:
        trie: dict[str, Any] = {}
        demoted: set[int] = set()
        for r in queue:
            if hits[r.rid] > self.check:
                continue
            node, shared = trie, 0
            for seg in r.prompt:
                nxt = node.get(seg.key)
                if nxt is None:
                    break
                shared += seg.tokens
                node = nxt
            if shared >= self.deprioritize:
                demoted.add(r.rid)
                continue
            node = trie
            for seg in r.prompt:
                node = node.setdefault(seg.key, {})
        return demoted
