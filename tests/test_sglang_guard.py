"""`PolicyGuard`: a policy that raises (or answers nonsense) degrades one decision to the queue
order, counted by kind and logged once per kind; it never takes the server down."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from topas_bench.runners.sglang.guard import PolicyGuard, queue_order
from topas_bench.schedulers.base import Decision, Policy
from topas_bench.schedulers.view import EngineView


class Scripted(Policy):
    """Answers each decision from a script: a Decision, an exception to raise, or junk."""

    name = "scripted"

    def __init__(self, *answers: Any) -> None:
        super().__init__()
        self.answers = list(answers)

    def decide(self, view: EngineView) -> Decision:
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[no-any-return]


class View:
    waiting = ("r2", "r0", "r1")  # what the view holds stands in for requests


def view() -> Any:
    return View()


def test_failures_fall_back_to_the_queue_order_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ok = Decision(admit=("r1",))
    policy = Scripted(
        ValueError("bad state 1"), ok, ValueError("bad state 2"), RecursionError("deep"),
        None, ValueError("bad state 3"),
    )  # fmt: skip
    guard = PolicyGuard()
    with caplog.at_level(logging.WARNING, logger="topas_bench.sglang"):
        got = [guard.decide(policy, view()) for _ in range(6)]
    fallback = Decision(admit=("r2", "r0", "r1"))
    assert got == [fallback, ok, fallback, fallback, fallback, fallback]
    assert guard.failures == {
        "policy raised ValueError": 3,
        "policy raised RecursionError": 1,
        "policy returned NoneType": 1,
    }
    logged = [r for r in caplog.records if r.name == "topas_bench.sglang"]
    assert len(logged) == 3  # one line per kind, not per failure
    assert "bad state 1" in logged[0].getMessage() and logged[0].exc_info is not None
    assert all("bad state 2" not in r.getMessage() for r in logged)


def test_a_failing_fallback_admits_nobody_rather_than_raising() -> None:
    def broken(_: EngineView) -> Decision:
        raise KeyError("no queue")

    guard = PolicyGuard()
    assert guard.decide(Scripted(TypeError("x")), view(), broken) == Decision()
    assert guard.failures == {"policy raised TypeError": 1, "fallback raised KeyError": 1}


def test_interrupts_are_not_swallowed() -> None:
    with pytest.raises(KeyboardInterrupt):
        PolicyGuard().decide(Scripted(KeyboardInterrupt()), view())


def test_queue_order_is_the_waiting_queue() -> None:
    assert queue_order(view()) == Decision(admit=("r2", "r0", "r1"))
