"""Keep a failing policy from taking the SGLang scheduler process down (docs/design.md section 7:
nothing a request carries may crash the server).

The plugin calls the policy at every scheduling point inside SGLang's scheduler process; an
exception there (a policy bug, a task view the policy did not expect, a `RecursionError`) would
kill the server and every request on it. `PolicyGuard.decide` calls the policy and, when it
raises or returns something that is not a `Decision`, returns the fallback decision instead:
by default `queue_order`, every waiting request in the engine's own queue order, which is what
SGLang would have done without the plugin. Each failure is counted by kind in
`PolicyGuard.failures` (a warning metric, like `Tracker.untagged`) and the first of each kind
is logged with its traceback; later ones are only counted, so a policy failing on every
decision cannot flood the server's log.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from topas_bench.schedulers.base import Decision, Policy, RequestView, Standing
from topas_bench.schedulers.view import EngineView

LOGGER = logging.getLogger("topas_bench.sglang")


def queue_order(view: EngineView) -> Decision:
    """Admit the waiting requests in the engine's queue order (SGLang's own FCFS), preempt
    nothing, leave the kept prefixes as they are."""
    return Decision(admit=tuple(view.waiting))


class PolicyGuard:
    """Calls a policy and degrades to a fallback decision when it fails (module docstring).

    One instance per server; `failures` maps a failure kind (``policy raised ValueError``,
    ``policy returned NoneType``, ``fallback raised ...``) to how many decisions it spoiled.
    """

    def __init__(self, logger: logging.Logger = LOGGER) -> None:
        self.failures: dict[str, int] = {}
        self._log = logger

    def decide(
        self,
        policy: Policy,
        view: EngineView,
        fallback: Callable[[EngineView], Decision] = queue_order,
    ) -> Decision:
        """`policy.decide(view)`, or `fallback(view)` when that raises or returns something
        other than a `Decision`; `Decision()` (admit nobody this step) if the fallback fails
        too. Never raises an `Exception`."""
        steps: tuple[tuple[str, Callable[[EngineView], object]], ...] = (
            ("policy", policy.decide),  # typed to return a Decision, but a policy may be buggy
            ("fallback", fallback),
        )
        for who, step in steps:
            try:
                answer = step(view)
            except Exception as e:
                self._count(f"{who} raised {type(e).__name__}", e)
                continue
            if isinstance(answer, Decision):
                return answer
            self._count(f"{who} returned {type(answer).__name__}", None)
        return Decision()

    def standing(self, decision: Decision, steps: int) -> Standing | None:
        """`decision.standing(steps)`, or None (ask again at the next iteration) when that
        raises or answers something that is not a `Standing`."""
        try:
            stands: object = decision.standing(steps)  # a policy may be buggy
        except Exception as e:
            self._count(f"standing raised {type(e).__name__}", e)
            return None
        if stands is not None and not isinstance(stands, Standing):
            self._count(f"standing returned {type(stands).__name__}", None)
            return None
        return stands

    def context_ttl(self, policy: Policy, finished: RequestView, view: EngineView) -> float:
        """`policy.context_ttl`, or 0 (keep nothing) when it raises or answers something that
        is not a number >= 0."""
        try:
            ttl = policy.context_ttl(finished, view)
        except Exception as e:
            self._count(f"context_ttl raised {type(e).__name__}", e)
            return 0.0
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or math.isnan(ttl) or ttl < 0:
            self._count(f"context_ttl returned {ttl!r}"[:80], None)
            return 0.0
        return float(ttl)

    def _count(self, kind: str, error: Exception | None) -> None:
        first = kind not in self.failures
        self.failures[kind] = self.failures.get(kind, 0) + 1
        if first:
            self._log.warning(
                "topas: %s%s; this decision falls back to the queue order (counted in "
                "policy_failures; further failures of this kind are counted, not logged)",
                kind,
                f": {error}" if error is not None else "",
                exc_info=error,
            )
