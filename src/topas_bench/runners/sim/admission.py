"""One prefill pass's admission budget, mirroring SGLang 0.5.23's `PrefillAdder` (page size 1).

`managers/schedule_policy.py` (`PrefillAdder.__init__`, `add_chunked_req`, `add_one_req`,
`_select_prefill_admission`, `_commit_prefill_admission`, `_update_prefill_budget`,
`budget_state`) and `mem_cache/prefill_budget.py` (`PrefillBudget`):

- `remaining_total = free + evictable - total_offset`, `remaining_current = free + evictable -
  current_offset`; `total_offset` starts at the running requests' decode headroom,
  `min(max_new - generated, CLIP) * ratio` each (ratio 1.0 for `ignore_eos` requests, else the
  decaying `new_token_ratio`: `_get_running_request_total_token_offset`).
- A fresh candidate is checked with its matched path temporarily locked (`_lock_node`): it needs
  `extend + min(max_new - generated, CLIP) + 1 < remaining_total`, else NO_TOKEN. An extend
  longer than the chunk budget left is cut to it (the request becomes the chunked one and
  reserves no decode headroom). Admission locks the path and reserves `extend + 1 +
  min(max_new, CLIP)` in `total_offset` (the sampling `max_new_tokens`, not reduced by tokens
  already generated) and `extend + 1` in `current_offset`; the compute budgets
  (`max_prefill_tokens`, the chunk size) lose the extend.
- The in-flight chunked request continues first (`add_chunked_req`) with
  `min(chunk budget, remaining_total)` tokens (the whole chunk budget when that is not
  positive), reserving its decode headroom only with its last chunk.
- After each admission: NO_TOKEN when `remaining_total` or `remaining_current` is not positive,
  OTHER when a compute budget is spent; either ends the pass.

Host-tier hits (a simulator extension) are loaded back during the pass, like SGLang's
`init_load_back` inside `add_one_req`; the need then also counts the loaded tokens.
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
    """`PrefillAdder._get_running_request_total_token_offset`."""
    r = 1.0 if req.ignore_eos else ratio
    return min(req.max_new_tokens - req.generated, clip) * r


class PrefillAdder:
    """Builds one prefill batch's admission list. Allocates nothing; locks admitted paths."""

    def __init__(
        self,
        cache: RadixCache,
        free_tokens: Callable[[], int],
        running: Sequence[SimRequest],
        ratio: float,
        cfg: SimConfig,
    ) -> None:
        self.cache = cache
        self.free = free_tokens  # live: preemptions and host load-backs change it in the pass
        self.cfg = cfg
        self.ratio = ratio
        self.total_offset = sum(running_offset(r, ratio, cfg.clip_max_new_tokens) for r in running)
        self.current_offset = 0.0
        self.rem_input = cfg.max_prefill_tokens
        self.rem_chunk = cfg.chunked_prefill_size
        self.batch: list[Admission] = []
        self.new_chunked: SimRequest | None = None

    @property
    def remaining_total(self) -> float:
        return self.free() + self.cache.evictable_tokens - self.total_offset

    @property
    def remaining_current(self) -> float:
        return self.free() + self.cache.evictable_tokens - self.current_offset

    def _clip(self, tokens: int) -> int:
        return min(max(tokens, 0), self.cfg.clip_max_new_tokens)

    def need(self, req: SimRequest, match: Match) -> int:
        """Tokens a fresh admission of `req` is checked against (`total_tokens` of
        `add_one_req`, plus any host-tier hit it would load)."""
        extend = req.fill_tokens - match.gpu_tokens
        return extend + self._clip(req.max_new_tokens - req.generated) + 1

    def release(self, req: SimRequest) -> None:
        """A running request preempted in this pass no longer reserves decode headroom."""
        self.total_offset -= running_offset(req, self.ratio, self.cfg.clip_max_new_tokens)

    def budget_state(self) -> AddResult:
        if self.remaining_total <= 0 or self.remaining_current <= 0:
            return AddResult.NO_TOKEN
        if self.rem_input <= 0 or self.rem_chunk <= 0:
            return AddResult.OTHER
        return AddResult.CONTINUE

    def add_chunked(self, req: SimRequest, limit: int | None = None) -> bool:
        """Continue the in-flight chunked request, at most `limit` tokens when given
        (`chunked_req_limit`); True if it is still unfinished after it."""
        avail = min(self.rem_chunk, int(self.remaining_total))
        if avail <= 0:
            avail = self.rem_chunk
        if limit is not None:
            avail = min(avail, limit)
        rest = req.fill_tokens - req.prefix_len
        truncated = rest > avail
        new = min(rest, avail)
        self.batch.append(Admission(req, new, req.prefix_len, None))
        self._reserve(new, 0 if truncated else self._clip(req.max_new_tokens))
        return truncated

    def add_one(self, req: SimRequest, match: Match) -> AddResult:
        """`add_one_req` for a waiting request already matched (`init_next_round_input`)."""
        extend = req.fill_tokens - match.gpu_tokens
        need = self.need(req, match)
        self.cache.lock(match.node)  # the temporary pin of `_lock_node`
        try:
            if not need < self.remaining_total:
                return AddResult.NO_TOKEN
            new, max_new = extend - match.host_tokens, self._clip(req.max_new_tokens)
            if new > self.rem_chunk:
                new, max_new = self.rem_chunk, 0
                if new <= 0:
                    return AddResult.OTHER
                self.new_chunked = req
            self.cache.lock(match.node)  # the request's own lock (`req.lock`)
            self.batch.append(Admission(req, new, match.gpu_tokens + match.host_tokens, match))
            self._reserve(new, max_new)
        finally:
            self.cache.unlock(match.node)
        return self.budget_state()

    def _reserve(self, new: int, max_new: int) -> None:
        """`PrefillBudget.reserve` plus the compute budgets of `_update_prefill_budget`."""
        self.total_offset += new + 1 + max_new
        self.current_offset += new + 1
        self.rem_input -= new
        self.rem_chunk -= new
