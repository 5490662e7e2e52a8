"""What a policy sees of one request and one stage: `StageState`, `RequestView`, `StageView`.

Kept apart from `base` (the engine view and the policy interface) because the shared
service-time estimator reads requests and stages, and `base`'s `EngineView` hands out the
estimator: both import this module, neither imports the other's importer.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Protocol

from topas_bench.workloads.model import Segment


class StageState(enum.IntEnum):
    """Where a stage of a live task is."""

    BLOCKED = 0  # some dependency has not finished
    DELAYED = 1  # dependencies done, the client's tool delay is running
    WAITING = 2  # in the server's waiting queue
    RUNNING = 3  # admitted: prefilling or decoding
    DONE = 4


class RequestView(Protocol):
    """A request as a server sees it. Never carries the true output length."""

    @property
    def rid(self) -> int: ...
    @property
    def task_id(self) -> str: ...
    @property
    def stage_id(self) -> str: ...
    @property
    def agent(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def prompt(self) -> Sequence[Segment]:
        """The prompt's segments (what the server's tokenizer sees, as content keys)."""
        ...

    @property
    def prompt_tokens(self) -> int: ...
    @property
    def generated(self) -> int:
        """Output tokens produced so far (kept across a preemption only as a count)."""
        ...

    @property
    def ready_s(self) -> float:
        """When the client sent the request."""
        ...

    @property
    def queued_s(self) -> float:
        """When it last entered the waiting queue (later than `ready_s` after a preemption)."""
        ...

    @property
    def admitted_s(self) -> float | None: ...
    @property
    def preemptions(self) -> int: ...
    @property
    def service_s(self) -> float:
        """Time spent in engine iterations so far (attained service, seconds)."""
        ...


class StageView(Protocol):
    """A stage of a live task, without its true output length."""

    @property
    def id(self) -> str: ...
    @property
    def agent(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def deps(self) -> tuple[str, ...]: ...
    @property
    def children(self) -> tuple[str, ...]: ...
    @property
    def prompt_tokens(self) -> int:
        """Its prompt's tokens that exist now: before it is sent, without the outputs of its
        task's stages that have not finished (`pending_outputs`; the estimator's
        `prompt_estimate` adds their expected lengths)."""
        ...

    @property
    def pending_outputs(self) -> tuple[tuple[str, str, str], ...]:
        """(stage id, agent, kind) of each stage of its task whose output its prompt will
        carry and that has not finished."""
        ...

    @property
    def delay_s(self) -> float: ...
    @property
    def state(self) -> StageState: ...
    @property
    def request(self) -> RequestView | None: ...
