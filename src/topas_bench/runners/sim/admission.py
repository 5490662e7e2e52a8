"""Admission of waiting requests into a prefill batch, mirroring SGLang's `PrefillAdder`.

SGLang 0.5.23, `managers/schedule_policy.py` (`PrefillAdder.add_one_req`, `add_chunked_req`,
`_update_prefill_budget`) and `mem_cache/prefill_budget.py` (`PrefillBudget`), page size 1:

- `remaining_total = available + evictable - total_offset`, where `total_offset` starts at the
  sum over running requests of `min(max_new - generated, CLIP) * ratio` (ratio 1.0 for
  `ignore_eos` requests, else the decaying `new_token_ratio`).
- A candidate needs `extend + min(max_new - generated, CLIP) + 1` tokens; its matched prefix is
  locked while it is checked (so it does not count as evictable), and it is admitted only if
  that need is strictly below `remaining_total`; otherwise admission stops (NO_TOKEN).
- An extend longer than the chunk budget is truncated to it (the request becomes the one
  in-flight chunked request, reserving no decode tokens yet); a continuing chunked request is
  added first, taking `min(chunk budget, remaining_total)` tokens.
- After each admission: NO_TOKEN if `remaining_total` or `remaining_current` is exhausted, OTHER
  if the prefill-token or chunk budget is spent; either stops the pass.

A host-tier hit is loaded back during the pass, as SGLang's `init_load_back` does inside
`add_one_req`; unlike SGLang's single-pool budget, the admission check also counts the loaded
tokens in the need, so a load-back can never overcommit memory.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from topas_bench.runners.sim.config import SimConfig
from topas_bench.runners.sim.radix import Match, RadixCache
from topas_bench.runners.sim.state import SimRequest


class AddResult(enum.Enum):
    CONTINUE = 0
    NO_TOKEN = 1
    OTHER = 2


@dataclass(slots=True)
class Admission:
    """One request's part of a prefill batch."""

    req: SimRequest
    new_tokens: int  # tokens computed in this iteration
    cached_before: int  # context already in KV when this iteration starts
    match: Match | None  # set on a fresh admission, None for a chunk continuation


def running_offset(req: SimRequest, ratio: float, clip: int) -> float:
    """Decode headroom held back for a running request.

    SGLang: `PrefillAdder._get_running_request_total_token_offset`.
    """
    r = 1.0 if req.ignore_eos else ratio
    return min(req.max_new_tokens - req.generated, clip) * r


class PrefillAdder:
    """Builds one prefill batch. Does not allocate; the engine allocates the result."""

    def __init__(
        self,
        cache: RadixCache,
        free_tokens: Callable[[], int],
        running: Sequence[SimRequest],
        ratio: float,
        cfg: SimConfig,
        match_of: Callable[[SimRequest], Match] | None = None,
        chunked: SimRequest | None = None,
    ) -> None:
        self.cache = cache
        self.match_of = match_of or (lambda r: cache.match(r.prompt))
        self.free = free_tokens  # live: host load-backs allocate during the pass
        self.cfg = cfg
        self.total_offset = sum(running_offset(r, ratio, cfg.clip_max_new_tokens) for r in running)
        if chunked is not None:
            # Deviation: the in-flight chunked request's unprefilled rest and its decode
            # headroom stay reserved, so later admissions cannot take the memory its next
            # chunks need (SGLang reserves only the current chunk and can run out there).
            self.total_offset += chunked.extend_tokens - chunked.done_prefill
            self.total_offset += self._max_new(chunked)
        self.current_offset = 0.0
        self.rem_input = cfg.max_prefill_tokens
        self.rem_chunk = cfg.chunked_prefill_size
        self.batch: list[Admission] = []
        self.new_chunked: SimRequest | None = None
        self.deficit: float | None = None  # how far the first refused candidate was from fitting

    @property
    def remaining_total(self) -> float:
        return self.free() + self.cache.evictable_tokens - self.total_offset

    @property
    def remaining_current(self) -> float:
        return self.free() + self.cache.evictable_tokens - self.current_offset

    def _max_new(self, req: SimRequest) -> int:
        return min(max(req.max_new_tokens - req.generated, 0), self.cfg.clip_max_new_tokens)

    @staticmethod
    def extend_tokens(req: SimRequest, match: Match) -> int:
        """Tokens to compute: the uncached prompt plus any output to redo after a preemption.

        At least one: like SGLang (which matches at most `len(fill_ids) - 1` tokens), a fully
        cached prompt still recomputes its last token to produce logits.
        """
        return max(req.prompt_tokens + req.generated - match.gpu_tokens - match.host_tokens, 1)

    def need(self, req: SimRequest, match: Match) -> int:
        """Tokens a fresh admission of `req` is charged (before the `<` comparison)."""
        return self.extend_tokens(req, match) + match.host_tokens + self._max_new(req) + 1

    def add_chunked(self, req: SimRequest) -> None:
        """Continue the in-flight chunked request (`add_chunked_req`): its next chunk, up to
        the chunk budget (its memory is already reserved, see `__init__`)."""
        rest = req.extend_tokens - req.done_prefill
        physical = self.free() + self.cache.evictable_tokens
        new = min(rest, self.rem_chunk, physical)
        self.new_chunked = req if new < rest else None
        if new <= 0:
            return
        context = req.prompt_tokens + req.generated - req.extend_tokens + req.done_prefill
        self.batch.append(Admission(req, new, context, None))
        self.current_offset += new + 1
        self.rem_input -= new
        self.rem_chunk -= new

    def add_one(self, req: SimRequest) -> AddResult:
        """Try to admit a waiting request (`add_one_req`); on success its prefix is locked."""
        if self.rem_chunk <= 0 or self.rem_input <= 0:
            return AddResult.OTHER  # a chunk continuation took the whole budget
        match = self.match_of(req)
        need = self.need(req, match)
        self.cache.lock(match.node)  # the temporary pin of SGLang's `_lock_node`
        if need >= self.remaining_total:
            if not self.batch and self.deficit is None:
                self.deficit = need - self.remaining_total + 1
            self.cache.unlock(match.node)
            return AddResult.NO_TOKEN
        # Keep the lock: it is the request's (`_commit_prefill_admission`).
        extend = self.extend_tokens(req, match)
        new, max_new = extend, self._max_new(req)
        if extend > self.rem_chunk:
            new, max_new = self.rem_chunk, 0
            self.new_chunked = req
        context = req.prompt_tokens + req.generated - extend
        self.batch.append(Admission(req, new, context, match))
        # The caller loads any host-tier hit now (`init_load_back`), so only the extend and
        # the decode headroom are reserved here.
        self._reserve(new, max_new)
        return self._state()

    def _reserve(self, new: int, max_new: int) -> None:
        """`PrefillBudget.reserve` + the compute budgets of `_update_prefill_budget`."""
        self.total_offset += new + 1 + max_new
        self.current_offset += new + 1
        self.rem_input -= new
        self.rem_chunk -= new

    def _state(self) -> AddResult:
        if self.remaining_total <= 0 or self.remaining_current <= 0:
            return AddResult.NO_TOKEN
        if self.rem_input <= 0 or self.rem_chunk <= 0:
            return AddResult.OTHER
        return AddResult.CONTINUE
