"""The engine view a policy decides on (docs/design.md section 3): read-only by contract, a
policy must not mutate anything reachable from it. The simulator (`runners/sim/view.py`) and the
SGLang plugin (`runners/sglang/view.py`) implement it alike."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from topas_bench.schedulers.estimator import ServiceEstimator
from topas_bench.schedulers.request import RequestView, StageView


class PrefixLocation(enum.IntEnum):
    NONE = 0
    HOST = 1
    GPU = 2


class TaskView(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def workflow(self) -> str: ...
    @property
    def arrival_s(self) -> float: ...
    @property
    def attained_s(self) -> float:
        """Sum of the service its requests received so far (seconds)."""
        ...

    @property
    def stages(self) -> Mapping[str, StageView]:
        """Stages in topological order."""
        ...

    @property
    def version(self) -> int:
        """Changes whenever any stage changes state (lets policies memoise per task)."""
        ...


@dataclass(frozen=True, slots=True)
class PrefixView:
    """An agent's system-prompt prefix as the cache holds it right now."""

    agent: str
    tokens: int
    where: PrefixLocation
    locks: int  # requests currently using it (0 = evictable unless kept)
    kept: bool  # pinned by the policy's last `keep_prefixes`


class EngineView(Protocol):
    """What a policy sees at a scheduling point. Read-only."""

    @property
    def now_s(self) -> float: ...
    @property
    def kv_budget_tokens(self) -> int: ...
    @property
    def running_tokens(self) -> int:
        """KV held privately by running requests (tokens not in the shared cache)."""
        ...

    @property
    def locked_tokens(self) -> int:
        """Cached tokens locked by running requests or kept by the policy."""
        ...

    @property
    def evictable_tokens(self) -> int: ...
    @property
    def free_tokens(self) -> int: ...
    @property
    def host_capacity_tokens(self) -> int: ...
    @property
    def reserved_tokens(self) -> float:
        """Decode headroom the admission mechanism holds back for running requests."""
        ...

    @property
    def waiting(self) -> Sequence[RequestView]: ...
    @property
    def running(self) -> Sequence[RequestView]: ...
    @property
    def tasks(self) -> Mapping[str, TaskView]: ...
    @property
    def estimator(self) -> ServiceEstimator: ...
    def cached_tokens(self, req: RequestView) -> int:
        """Tokens of `req`'s prompt that are on the GPU right now (its prefix-cache hit)."""
        ...

    def prefixes(self) -> Sequence[PrefixView]: ...
    def admission_need(self, req: RequestView) -> int:
        """KV tokens admitting `req` would charge against the budget right now."""
        ...

    def lock_cost(self, req: RequestView) -> int:
        """Evictable cached tokens on `req`'s matched prefix, which admitting it would lock
        (and so take out of the admission budget)."""
        ...

    def admission_costs(self, reqs: Sequence[RequestView]) -> list[int]:
        """`admission_need(r) + lock_cost(r)` of each request, in order: the same numbers,
        asked once for a whole queue (an engine may answer it in one pass)."""
        ...

    def absent_reload_s(self, agent: str) -> float:
        """Seconds to bring `agent`'s prefix onto the GPU were it not there: a host-tier load
        when the engine has a host tier (evicted prefixes go there), else the prefill time to
        recompute it. The cost of moving it in, and of evicting it."""
        ...

    def reload_s(self, agent: str) -> float:
        """Seconds to bring `agent`'s prefix onto the GPU now: 0 if resident, a host-tier load
        if it is on the host, else the prefill time to recompute it."""
        ...
