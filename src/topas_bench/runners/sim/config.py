"""Simulator settings. Defaults mirror SGLang 0.5.23's server defaults (cited per field).

`SimOptions` is the simulator's part of a run specification (`spec.RunSpec.engine`): the two
settings only the simulator has. `SimConfig` is one simulated server, built by the planner.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from topas_bench.errors import TopasError
from topas_bench.workloads.model import Stage, Workload
from topas_bench.workloads.trace.parse import MAX_TOKENS

LengthHint = Literal["none", "oracle"]
#: SimConfig fields that enter a run's identity when they differ from their defaults.
ENGINE_PARAM_FIELDS = (
    "host_tier_tokens", "length_hint", "chunked_prefill_size", "max_prefill_tokens",
    "max_running_requests", "context_length",
)  # fmt: skip


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


def sim_engine_params(sim: SimConfig) -> dict[str, Any]:
    """What a simulated (or reference) server adds to a run's identity: the `SimConfig`
    settings that differ from their defaults (`ENGINE_PARAM_FIELDS`)."""
    defaults = SimConfig(kv_budget_tokens=sim.kv_budget_tokens)
    return {
        k: getattr(sim, k) for k in ENGINE_PARAM_FIELDS if getattr(sim, k) != getattr(defaults, k)
    }


@dataclass(frozen=True)
class SimOptions:
    """The simulator's settings of a run (`--length-hint`, `--host-tier-tokens`).

    length_hint: "oracle" shows policies the true output lengths (the estimator's, only here).
    host_tier_tokens: host-memory KV tier capacity in tokens (0: off).
    """

    engine: ClassVar[str] = "sim"
    #: Part of every run's identity: bump it whenever a change to the engine can change a
    #: result, so cells an older engine made are rerun, never reused (`cell.identity.RunIdentity`).
    #: v2: SGLang 0.5.23's batch_is_full latch, LRU refresh on match, token-granular radix
    #: with node splits, PrefillAdder/retraction accounting as the reference engine measures.
    #: v3: a finished request's prompt is split from its output in the tree (as SGLang's
    #: checkpoint_into_tree), so eviction can drop the output and keep the prompt; the policy
    #: seams of the peers (calc_priority variants, eviction policies, pins, TTL retention).
    version: ClassVar[int] = 3
    #: A real server (`runners.sglang.options.SglangOptions.real_server`): no.
    real_server: ClassVar[bool] = False

    length_hint: LengthHint = "none"
    host_tier_tokens: int = 0

    def __post_init__(self) -> None:
        if self.length_hint not in ("none", "oracle"):
            raise TopasError(f"--length-hint must be `none` or `oracle`, got {self.length_hint!r}")
        if not 0 <= self.host_tier_tokens <= MAX_TOKENS:
            raise TopasError(
                f"--host-tier-tokens must be 0..{MAX_TOKENS:,}, got {self.host_tier_tokens}"
            )

    @classmethod
    def from_flags(cls, flags: Mapping[str, Any]) -> SimOptions:
        """The options of `run`'s engine flags (by flag name, `runners.engines.engine_options`,
        which has refused the real server's)."""
        return cls(flags.get("--length-hint", "none"), flags.get("--host-tier-tokens", 0))

    def check_spec(self, schedulers: tuple[str, ...], cluster: object) -> None:
        """Every run the simulator can take (a cluster too)."""

    def sim_settings(self) -> dict[str, Any]:
        """`SimConfig` fields these options set."""
        return {"length_hint": self.length_hint, "host_tier_tokens": self.host_tier_tokens}

    def engine_params(self, sim: SimConfig) -> dict[str, Any]:
        return sim_engine_params(sim)


def least_tokens(s: Stage) -> int:
    """The least KV budget a call is served whole in (`check_fits`)."""
    return max(s.prompt_tokens + 7, s.prompt_tokens + min(s.output_tokens, s.max_new_tokens) + 2)


def check_fits(w: Workload, kv_budget_tokens: int, context_length: int = 32768) -> None:
    """Every call must be one the server serves whole: SGLang refuses a prompt of at least
    `min(context_length - 1, kv_budget - 1) - 5` tokens (`TpModelWorker.get_worker_info`)
    and clips `max_new_tokens` to `min(context_length, kv_budget) - prompt - 2`
    (`Scheduler.init_req_max_new_tokens`), which must leave the call its output."""

    stage = max((s for _, s in w.stages()), key=least_tokens)
    need = least_tokens(stage)
    if need > min(kv_budget_tokens, context_length):
        what = "KV budget" if kv_budget_tokens <= context_length else "context length"
        have = min(kv_budget_tokens, context_length)
        out = min(stage.output_tokens, stage.max_new_tokens)
        if need == stage.prompt_tokens + out + 2:
            parts = f"prompt {stage.prompt_tokens:,} + output {out:,} + 2 spare tokens"
        else:  # SGLang refuses a prompt within 7 tokens of the limit, whatever its output
            parts = f"prompt {stage.prompt_tokens:,} + 7 tokens SGLang keeps beyond a prompt"
        raise TopasError(
            f"{what} of {have:,} tokens is smaller than the largest call in {w.name!r} "
            f"({parts} = {need:,}); raise --kv-budget to at least {need:,}"
            + (
                f", or lower --workload-param context_tokens (now {w.params['context_tokens']:,}"
                ", MetaGPT's memory cut) to about 0.8 x the budget"
                if "context_tokens" in w.params
                else ""
            )
        )
