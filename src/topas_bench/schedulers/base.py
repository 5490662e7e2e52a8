"""The policy interface (docs/design.md section 3): the decision, what a policy needs of a server,
the policy.

An engine (the simulator or the SGLang plugin) calls `Policy.decide(view)` at every scheduling
point. The view is read-only by contract: policies must not mutate anything reachable from it.
The decision names requests to admit (in order), requests to preempt, and optionally the agent
prefixes to keep on the GPU. The engine applies it through its shared admission mechanism
(budget checks, prefix matching, locking), so a policy cannot break memory accounting: an admit
that does not fit stops admission, exactly like SGLang's `PrefillAdder` returning NO_TOKEN.

Most policies are an ordering of the waiting queue: subclass `OrderingPolicy`, write `sort_key`,
register the class in `topas_bench.schedulers.registry`. That is the whole cost of a new policy.

The policy API: this module is a policy author's one import (`__all__`). Besides what it
defines (`Policy`, `OrderingPolicy`, `Decision`, `Standing`, `ProvesStanding`, `ServerNeeds`,
`Capabilities`, `ContextAction`, `DROP`, `EVICTION_POLICIES`), it re-exports what a policy
reads and checks, from where it lives: the engine view (`EngineView`, `TaskView`, `PrefixView`,
`PrefixLocation`; `view.py`), the requests and stages in it (`RequestView`, `StageView`,
`StageState`; `request.py`), the service estimator (`ServiceEstimator`; `estimator.py`) and a
parameter's declaration and checks (`Param`, `number`, `integer`, `flag`, `one_of`,
`InvalidParameter`, `reject_unknown`, `require_number`, `require_int`, `require_bool`,
`MAX_NUMBER`, `MAX_INT`; `validate.py`). The project's own modules import a
name from where it lives.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.schedulers.request import RequestView, StageState, StageView
from topas_bench.schedulers.validate import (
    MAX_INT,
    MAX_NUMBER,
    InvalidParameter,
    Param,
    declared,
    flag,
    integer,
    number,
    one_of,
    reject_unknown,
    require_bool,
    require_int,
    require_number,
)
from topas_bench.schedulers.view import EngineView, PrefixLocation, PrefixView, TaskView

#: SGLang 0.5.23's `--radix-eviction-policy` choices the engines mirror (`ServerNeeds.eviction`;
#: the simulator's orders: `runners.sim.evict`).
EVICTION_POLICIES = ("lru", "lfu", "slru", "priority")


@dataclass(frozen=True, slots=True)
class Standing:
    """How long a decision stands: until when asking again would return the same decision.

    A policy may attach one to a decision (`Decision.stands`). The engine may then apply the
    same decision again, without asking, at each later scheduling point P (a prefill attempt
    with requests waiting) for which all of these hold:

    - since the decision was made, nothing happened but decode steps of the same running
      batch: no request arrived, was admitted, finished, retracted or preempted; nothing was
      inserted into or evicted from the prefix cache and no pin changed (the decision's own
      `keep_prefixes`, applied once, excepted); the estimator saw no finish (its `version` is
      unchanged; it did see the step times, which move `tpot_s`);
    - P is at most `steps` decode steps after the decision;
    - P's `now_s < until_s`;
    - at P, `tpot_lo_s <= estimator.tpot_s <= tpot_hi_s`;
    - at P, the admission budget `free_tokens + evictable_tokens - reserved_tokens` lies in
      `[budget_lo, budget_hi]`.

    Asking again at P would also leave the policy's own state as it is, so skipping the
    question changes nothing. The bound must be conservative: an engine may always ask earlier
    (waking early is fine), never later. What drifts between decode steps with the discrete
    state fixed (time, the running requests' generated tokens, the step-time estimate, the
    budget as decode consumes it and the reservation decays) is the policy's to bound; the
    events are the engine's to notice. The simulator runs closed-form decode steps up to the
    bound (`runners.sim.engine`); the plugin's `Bridge` (SGLang, and the reference engine)
    reuses the decision at each iteration up to it.
    """

    steps: int
    until_s: float = math.inf
    tpot_lo_s: float = 0.0
    tpot_hi_s: float = math.inf
    budget_lo: float = -math.inf
    budget_hi: float = math.inf

    def holds(self, steps: int, now_s: float, tpot_s: float, budget: float) -> bool:
        """Whether the decision stands at a scheduling point `steps` decode steps after it,
        at `now_s`, with that step-time estimate and admission budget. The budget is checked
        with a margin (`BUDGET_MARGIN`): an engine's sum may round differently from the
        view's."""
        return (
            steps <= self.steps
            and now_s < self.until_s
            and self.tpot_lo_s <= tpot_s <= self.tpot_hi_s
            and self.budget_lo + BUDGET_MARGIN <= budget <= self.budget_hi - BUDGET_MARGIN
        )


class ProvesStanding(Protocol):
    """The lazy form of `Decision.stands`: called at most once, right after the decision and
    before anything changes (the engine's state still the one the policy saw), with the most
    decode steps the engine could use (until its own next event, or as many as it likes when
    it cannot tell); returns how long the decision stands, at most that, or None."""

    def __call__(self, steps: int) -> Standing | None: ...


#: Tokens of slack on each side of a `Standing`'s budget range: far above the rounding of a
#: sum of a few hundred reservations, far below one token.
BUDGET_MARGIN = 1e-6


@dataclass(frozen=True, slots=True)
class Decision:
    """A policy's answer. `keep_prefixes=None` leaves the pinned set unchanged.

    prefix_priority: agent -> eviction priority of the radix nodes of its prefix (the device
        path of the prefix's tokens, read-only, the node where it ends included), for a server
        evicting by `priority` (`ServerNeeds.eviction`, SGLang's `PriorityStrategy`:
        lower first, then LRU). A node on several agents' paths takes the highest. Every other
        node keeps SGLang's request priorities, 0 for outputs and 1 for prompts. None leaves
        priorities unchanged.
    prefetch: agents whose prefix, where the host tier holds it, is loaded back to the GPU now,
        overlapped with serving (in order, until one does not fit); a simulator host-tier
        operation, which engines without a host tier ignore.
    stands: how long the decision stands (`Standing`), or a function that says so when asked
        (`ProvesStanding`: the proof may cost more than the decision, and is paid only where an
        engine can use it); None (the default): the engine asks at every scheduling point.
        Only a decision that admits and preempts nothing, sets no `prefix_priority` and no
        `prefetch` is reused; ordering policies need none (they are asked only at prefill
        attempts the engine makes anyway).
    """

    admit: Sequence[RequestView] = ()
    preempt: Sequence[RequestView] = ()
    keep_prefixes: frozenset[str] | None = None
    prefix_priority: Mapping[str, int] | None = None
    prefetch: Sequence[str] = ()
    stands: Standing | ProvesStanding | None = None

    def standing(self, steps: int) -> Standing | None:
        """`stands` as a `Standing`, asking for at most `steps` decode steps if it is a
        function (call once per decision: a proof is not free)."""
        s = self.stands
        return s if s is None or isinstance(s, Standing) else s(steps)

    @property
    def reusable(self) -> bool:
        """Whether an engine may apply it again while it stands (`Standing`): it acts on
        nothing but pins, which applying twice leaves as they are."""
        return (
            self.stands is not None
            and not self.admit
            and not self.preempt
            and self.prefix_priority is None
            and not self.prefetch
        )


#: Every `--schedule-policy` SGLang 0.5.23's `SchedulePolicy` implements
#: (`managers/schedule_policy.py`; the server's parser also accepts `priority`, which
#: `SchedulePolicy` refuses: `schedulers.sglang_stock.REFUSED`).
SCHEDULE_POLICIES = (
    "fcfs", "lpm", "dfs-weight", "lof", "random", "hrrn", "shortest-prefill-first", "routing-key",
)  # fmt: skip
#: SGLang's tree cores (`SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND`).
TREE_CORES = ("rust", "python")


@dataclass(frozen=True, slots=True)
class ServerNeeds:
    """What a policy needs from the server it runs on: one frozen value (`Policy.needs`), read
    once by every engine (the simulator, the reference engine, the plugin and its launcher).

    schedule_policy: SGLang's own `--schedule-policy` pass that runs before the policy decides
        (`SchedulePolicy.calc_priority`: `lpm` matches every waiting request, refreshing their
        prefixes' LRU time; `fcfs` refreshes the first 128 every 32nd call). The simulator
        mirrors it (`runners.sim.calc_priority`); the plugin runs SGLang's own.
    native: SGLang's pass is the whole policy (its `decide` keeps the order that pass leaves,
        or sorts it the way SGLang would): the reference engine then runs SGLang's own
        `SchedulePolicy`, without the plugin.
    eviction, eviction_config: SGLang's `--radix-eviction-policy` (`lru`, `lfu`, `slru`,
        `priority`; `runners.sim.evict`) and its `--radix-eviction-policy-config` (for `slru`:
        `protected_threshold`), as sorted (key, value) pairs. Both engines build their cache
        with them.
    seed: the seed of SGLang's shuffle under `random` (the simulator seeds its own generator
        with it, the reference engine SGLang's global one).
    acts_while_full: the one door for acting while the batch is full. SGLang stops trying to
        admit once a prefill attempt finds the batch full (`ScheduleBatch.batch_is_full`,
        cleared only when a running request leaves), so a policy is normally not consulted
        until then. True opens the door SGLang itself has (`enable_priority_preemption` clears
        the latch before every prefill attempt, `Scheduler._get_new_batch_prefill_raw`): the
        engine, simulated or real (the plugin's adapter), then asks the policy at every
        iteration while requests wait, so it can preempt for a better candidate, and pays a
        prefill attempt per step for it. A policy opens it exactly when its class declares
        `Capabilities.acts_while_full` (`tests/test_capabilities.py`).
    tree_core: the SGLang tree core the server must run, or None for the server's own
        (`ServerSettings.tree_core`, SGLang's Rust core). A policy that sets
        `Decision.prefix_priority` needs `python`: the Rust core keeps node priorities out of
        Python's reach.
    """

    schedule_policy: str = "fcfs"
    native: bool = False
    eviction: str = "lru"
    eviction_config: tuple[tuple[str, int], ...] = ()
    seed: int = 0
    acts_while_full: bool = False
    tree_core: str | None = None

    def __post_init__(self) -> None:
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"unknown SGLang schedule policy {self.schedule_policy!r}")
        if self.eviction not in EVICTION_POLICIES:
            raise ValueError(f"unknown SGLang radix eviction policy {self.eviction!r}")
        keys = [k for k, _ in self.eviction_config]
        if keys not in ([], ["protected_threshold"]) or (keys and self.eviction != "slru"):
            raise ValueError(f"eviction config {self.eviction_config!r} for {self.eviction!r}")
        if self.tree_core is not None and self.tree_core not in TREE_CORES:
            raise ValueError(f"unknown SGLang tree core {self.tree_core!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")

    @classmethod
    def slru(cls, protected_threshold: int, **fields: Any) -> ServerNeeds:
        """Needs under SGLang's `slru` eviction with its protected threshold."""
        config = (("protected_threshold", protected_threshold),)
        return cls(eviction="slru", eviction_config=config, **fields)

    @property
    def eviction_config_dict(self) -> dict[str, int]:
        """`eviction_config` as `--radix-eviction-policy-config` takes it (JSON)."""
        return dict(self.eviction_config)

    @property
    def protected_threshold(self) -> int:
        """`slru`'s protected threshold: the config's, else SGLang's default (2)."""
        return self.eviction_config_dict.get("protected_threshold", 2)


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a scheduler may do beyond ordering the queue where SGLang asks any policy: a fact
    of its class (of its registered name, whatever its parameters), read by
    `schedulers.registry.capabilities`, shown by `topas-bench schedulers list` and tabled in
    docs/schedulers.md, so that a comparison can say which schedulers had which powers.

    acts_while_full: it is consulted, and may act, while the batch is full (SGLang's
        `batch_is_full` latch set: a prefill attempt found no room, and no running request
        has left since). Its `needs` open the door (`ServerNeeds.acts_while_full`: the engines
        ask it at every iteration while requests wait). False: it is asked only at the prefill
        attempts SGLang makes for any policy.
    preempts: it may retract a running request by its own decision (`Decision.preempt`).
        False: no decision of it preempts (the simulator refuses one that does).

    Neither covers what the engine does on its own: SGLang retracts running requests when a
    decode step does not fit (`ScheduleBatch.retract_decode`; the policy only orders them,
    `Policy.retraction_order`), whatever the policy. A run's `preemptions` counter counts
    those retractions and the policy's preemptions together; the decisions table's
    `preempt` column counts the policy's alone.
    """

    acts_while_full: bool = False
    preempts: bool = False


@dataclass(frozen=True, slots=True)
class ContextAction:
    """What the engine does with a finished call's context (its prompt and output, as the tree
    holds it) while its task waits, e.g. on a tool call (`Policy.context_action`).

    keep_s: seconds to keep it locked on the GPU (`Policy.context_ttl`'s pin), > 0 to keep.
    offload: move its own part (below its agent's prefix, which stays under the cache's
        eviction) to the host tier now, freeing that GPU memory; an engine without a host
        tier ignores it (the context is then dropped: left evictable).
    upload_in_s: with `offload`, seconds from now at which the engine loads it back to the
        GPU over the host link (a prefetch: a prefill reading it before the load ends waits
        for it); None loads it only when a request matches it.
    Neither keep nor offload: drop, the default (left in the cache, evictable, as SGLang does).
    """

    keep_s: float = 0.0
    offload: bool = False
    upload_in_s: float | None = None

    def __post_init__(self) -> None:
        if math.isnan(self.keep_s) or self.keep_s < 0:
            raise ValueError(f"keep_s must be >= 0, got {self.keep_s!r}")
        if self.keep_s > 0 and self.offload:
            raise ValueError("a context is kept or offloaded, not both")
        up = self.upload_in_s
        if up is not None and (not self.offload or not math.isfinite(up) or up < 0):
            raise ValueError(f"upload_in_s needs offload and a finite value >= 0, got {up!r}")


#: Leave a finished context in the cache, evictable (SGLang's own behaviour).
DROP = ContextAction()


class Policy(ABC):
    """A scheduling policy. One instance per run, so state never leaks across runs.

    An engine consults it where SGLang's scheduler would: at every prefill attempt with requests
    waiting (`Scheduler._get_new_batch_prefill_raw`, after `SchedulePolicy.calc_priority`). The
    engine then admits in the order the decision gives, stopping at the first request the
    decision does not admit.
    """

    #: The scheduler's registered name (a stock SGLang policy's is its row's, set per instance).
    name: str = ""
    #: What it may do beyond ordering the queue (`Capabilities`): by default, nothing.
    capabilities: ClassVar[Capabilities] = Capabilities()
    #: An oracle variant, labeled as one: the simulator's estimator answers it from the true
    #: output lengths, as `--length-hint oracle` does for every policy (`astraea-oracle`).
    oracle_lengths: ClassVar[bool] = False
    #: Whether a kept context's time to live restarts when an admitted request's cached
    #: prefix covers it (refresh on hit, SGLang PR #18941's pins; `Policy.context_ttl`). A
    #: simulator mechanism: the reference engine and the plugin refuse such a policy.
    refreshes_contexts: ClassVar[bool] = False

    def __init__(self, **params: Any) -> None:
        """Check and set the parameters the class declares (`validate.Param`, in declaration
        order; unknown names fail, naming the valid ones), then `setup`."""
        spec = declared(type(self))
        reject_unknown(self.name, params, list(spec))
        for key, param in spec.items():
            self.__dict__[key] = param.check(self.name, key, params.get(key, param.default))
        self.setup()

    def setup(self) -> None:
        """After the declared parameters are set: checks across them, and the policy's state."""
        return None

    @property
    def params(self) -> dict[str, Any]:
        """The parameters that identify this policy in a run's identity: by default the
        declared ones, as set."""
        return {key: vars(self)[key] for key in declared(type(self))}

    @property
    def needs(self) -> ServerNeeds:
        """What this policy needs from the server, as one frozen value (`ServerNeeds`); the
        default is a stock SGLang server under `fcfs`. Engines read it once, when they start."""
        return ServerNeeds()

    @abstractmethod
    def decide(self, view: EngineView) -> Decision: ...

    def context_ttl(self, finished: RequestView, view: EngineView) -> float:
        """Seconds to keep `finished`'s context (its prompt and output, as the tree holds it
        when it finishes) locked on the GPU; 0 keeps nothing (the default).

        The engine asks at the iteration after the request finished, locks the context if the
        admission budget allows it (as for kept prefixes: not what running requests reserved,
        nor what the in-flight chunked prefill still needs), and releases it when the time is
        up (at the first iteration at or after it), when its task ends, before decode would
        retract, or when the server would otherwise sit idle.
        """
        return 0.0

    def context_action(self, finished: RequestView, view: EngineView) -> ContextAction:
        """What to do with `finished`'s context until its task's next call (`ContextAction`:
        keep it locked on the GPU, offload it to the host tier with an optional timed upload,
        or drop it); the default keeps it for `context_ttl` seconds, else drops it.

        Asked when `context_ttl` asks: at the iteration after the request finished, while its
        task is live. A simulator operation (as `Decision.prefetch`): the plugin's adapter
        and the reference engine ask `context_ttl` only, so a policy overriding this hook
        keeps, offloads and uploads nothing there.
        """
        ttl = self.context_ttl(finished, view)
        return ContextAction(keep_s=ttl) if ttl > 0 else DROP

    def retraction_order(self, view: EngineView) -> list[RequestView]:
        """Running requests, the first to retract first when decode runs out of memory.

        SGLang's default (`ScheduleBatch._get_decode_retraction_order`, 0.5.23): fewest output
        tokens first, then longest input; among equals, the latest in the batch first (SGLang
        sorts the batch's indices stably in reverse and pops from the end).
        """
        return sorted(reversed(view.running), key=lambda r: (r.generated, -r.prompt_tokens))


class OrderingPolicy(Policy):
    """A policy that only orders the waiting queue; the engine's LRU eviction does the rest."""

    @abstractmethod
    def sort_key(self, req: RequestView, view: EngineView) -> tuple[Any, ...]:
        """Lower sorts first. Must end in a stable id (e.g. `req.rid`) for determinism."""

    def decide(self, view: EngineView) -> Decision:
        return Decision(admit=sorted(view.waiting, key=lambda r: self.sort_key(r, view)))


def sim_only_error(cls: type[Policy], name: str, engine: str) -> str | None:
    """Why a policy class cannot run on `engine` (anything but the simulator), or None: true
    output lengths (`Policy.oracle_lengths`, an oracle variant such as `astraea-oracle`) or
    kept contexts refreshed on a cache hit (`Policy.refreshes_contexts`). One check for the
    engines' options (`registry.refuse_sim_only`) and the plugin's adapter."""
    if cls.oracle_lengths:
        return (
            f"{name} is an oracle variant (true output lengths): a simulator scheduler, "
            f"not for {engine}; run it with --engine sim"
        )
    if cls.refreshes_contexts:
        return (
            f"scheduler {name!r} refreshes kept contexts on a cache hit, a simulator "
            f"mechanism {engine} does not have; run it with --engine sim"
        )
    return None


__all__ = [
    "BUDGET_MARGIN",
    "DROP",
    "EVICTION_POLICIES",
    "MAX_INT",
    "MAX_NUMBER",
    "SCHEDULE_POLICIES",
    "Capabilities",
    "ContextAction",
    "Decision",
    "EngineView",
    "InvalidParameter",
    "OrderingPolicy",
    "Param",
    "Policy",
    "PrefixLocation",
    "PrefixView",
    "ProvesStanding",
    "RequestView",
    "ServerNeeds",
    "ServiceEstimator",
    "StageState",
    "StageView",
    "Standing",
    "TaskView",
    "flag",
    "integer",
    "number",
    "one_of",
    "reject_unknown",
    "require_bool",
    "require_int",
    "require_number",
    "sim_only_error",
]
