"""Fake requests and stages implementing the view protocols of `schedulers/base.py`, shared
by the policy tests."""

from __future__ import annotations

from dataclasses import dataclass

from topas_bench.schedulers.base import StageState
from topas_bench.workloads.model import Segment


@dataclass
class FakeRequest:
    rid: int
    task_id: str
    stage_id: str
    agent: str = "a"
    kind: str = "k"
    prompt: tuple[Segment, ...] = ()
    generated: int = 0
    ready_s: float = 0.0
    queued_s: float = 0.0
    admitted_s: float | None = None
    preemptions: int = 0
    service_s: float = 0.0

    @property
    def prompt_tokens(self) -> int:
        return sum(s.tokens for s in self.prompt)


@dataclass
class FakeStage:
    id: str
    agent: str = "a"
    kind: str = "k"
    deps: tuple[str, ...] = ()
    children: tuple[str, ...] = ()
    prompt_tokens: int = 1000
    delay_s: float = 0.0
    state: StageState = StageState.BLOCKED
    request: FakeRequest | None = None
    pending_outputs: tuple[tuple[str, str, str], ...] = ()
