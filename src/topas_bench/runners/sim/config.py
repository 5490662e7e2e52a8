"""Simulator settings. Defaults mirror SGLang 0.5.23's server defaults (cited per field)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from topas_bench.errors import TopasError

LengthHint = Literal["none", "oracle"]


@dataclass(frozen=True)
class SimConfig:
    """One simulated SGLang server.

    kv_budget_tokens: KV cache capacity in tokens (SGLang's `max_total_num_tokens`); always an
        explicit, printed input.
    chunked_prefill_size: tokens prefilled per iteration at most (`--chunked-prefill-size`,
        8192 on large GPUs); at most one request is mid-chunk at a time.
    max_prefill_tokens: prefill tokens per batch (`--max-prefill-tokens`, 16384).
    max_running_requests: cap on the decode batch (`--max-running-requests`).
    context_length: the model's context window (`--context-length`; Qwen2.5-32B-Instruct's
        32,768). With the KV budget it bounds a request (`TpModelWorker.get_worker_info`:
        `max_req_len = min(context_length - 1, kv_budget_tokens - 1)`): a longer prompt is
        refused and `max_new_tokens` is clipped to fit (`Scheduler.init_req_max_new_tokens`).
    host_tier_tokens: host (CPU) KV capacity for evicted prefixes; 0 disables the tier.
    clip_max_new_tokens: `SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION` (4096), the most output tokens
        admission reserves for one request.
    init_new_token_ratio / min_new_token_ratio_factor / new_token_ratio_decay_steps:
        `SGLANG_INIT_NEW_TOKEN_RATIO` (0.7), `SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR` (0.14),
        `SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS` (600): the share of a running request's remaining
        `max_new_tokens` that admission holds back, decaying each decode step.
    retract_decode_steps: `SGLANG_RETRACT_DECODE_STEPS` (20), used to re-estimate the ratio
        after a retraction.
    length_hint: "oracle" lets policies see true output lengths.
    record_timeline: keep the per-iteration timeline (batch, KV use, residency).
    check_invariants: re-derive the memory accounting from scratch after every event and fail
        loudly on any mismatch (slow; for tests).
    """

    kv_budget_tokens: int
    chunked_prefill_size: int = 8192
    max_prefill_tokens: int = 16384
    max_running_requests: int = 1024
    context_length: int = 32768
    host_tier_tokens: int = 0
    clip_max_new_tokens: int = 4096
    init_new_token_ratio: float = 0.7
    min_new_token_ratio_factor: float = 0.14
    new_token_ratio_decay_steps: int = 600
    retract_decode_steps: int = 20
    length_hint: LengthHint = "none"
    record_timeline: bool = True
    check_invariants: bool = False

    def __post_init__(self) -> None:
        for name in (
            "kv_budget_tokens",
            "chunked_prefill_size",
            "max_prefill_tokens",
            "max_running_requests",
            "context_length",
            "clip_max_new_tokens",
            "new_token_ratio_decay_steps",
        ):
            if getattr(self, name) < 1:
                raise TopasError(f"{name} must be a positive integer, got {getattr(self, name)}")
        if self.host_tier_tokens < 0:
            raise TopasError(f"host_tier_tokens must be >= 0, got {self.host_tier_tokens}")
        if not 0.0 < self.init_new_token_ratio <= 1.0:
            raise TopasError("init_new_token_ratio must be in (0, 1]")
        if self.length_hint not in ("none", "oracle"):
            raise TopasError(f"length_hint must be 'none' or 'oracle', got {self.length_hint!r}")

    @property
    def min_new_token_ratio(self) -> float:
        return min(self.init_new_token_ratio * self.min_new_token_ratio_factor, 1.0)

    @property
    def new_token_ratio_decay(self) -> float:
        return (
            self.init_new_token_ratio - self.min_new_token_ratio
        ) / self.new_token_ratio_decay_steps
