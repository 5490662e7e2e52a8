"""Replaying the real sglang-router's decisions through the simulated cache-aware router.

Given what the real router did with a request stream (each request's text, the worker that
served it, when the worker received it and when it finished it) and its registry order, every
decision is replayed: the simulated router (`routers.cache_aware.CacheAware`) decides on the
same text with the same state the real one had, then learns the real choice, not its own (the
tree gets the text under the real worker, the load counts the real worker), so one
disagreement cannot cascade into the next and each decision is checked on its own.

Events are ordered by the workers' clock: a request is counted in flight from when its worker
received it until its worker finished it. The real router decided somewhat before the worker
received (up to `decide_lead_s` on a busy machine: the proxy connects, the worker's thread
starts) and counted the request out somewhat after the worker finished (`release_lag_s`). A
decision whose window overlaps another event's window may have come before or after that event
at the router: it is counted apart (`Agreement.ambiguous`) and left out of the match rate (it is
still replayed, with the real choice learnt).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from topas_bench.runners.cluster.routers.base import Cluster, Route, parse_params
from topas_bench.runners.cluster.routers.cache_aware import CacheAware
from topas_bench.runners.cluster.tree import TEXT, Units


@dataclass(frozen=True)
class Observed:
    """One request of the stream: its routing key (text, or token runs), the worker that
    served it (replica index), and when that worker received and finished it (seconds)."""

    key: Any
    worker: int
    received_s: float
    finished_s: float


@dataclass
class Agreement:
    decisions: int = 0
    agree: int = 0
    ambiguous: int = 0
    #: (request index, simulated choice, real choice) of each clear disagreement
    differ: list[tuple[int, int, int]] = field(default_factory=list)
    #: per request (stream order): units its prefix match found (-1: decided on load alone)
    matched: list[int] = field(default_factory=list)

    @property
    def clear(self) -> int:
        return self.decisions - self.ambiguous

    @property
    def rate(self) -> float:
        return self.agree / self.clear if self.clear else float("nan")


def agreement(
    stream: Sequence[Observed],
    replicas: int,
    order: Sequence[int],
    params: dict[str, Any] | None = None,
    *,
    units: Units[Any] = TEXT,
    decide_lead_s: float = 0.1,
    release_lag_s: float = 0.05,
) -> Agreement:
    """How many of the real router's decisions the simulated cache-aware router makes too."""
    cluster = Cluster(replicas, order=tuple(order))
    router = CacheAware(cluster, parse_params(CacheAware, params or {}), units=units)
    events = sorted(
        [(o.received_s, 1, i) for i, o in enumerate(stream)]
        + [(o.finished_s, 0, i) for i, o in enumerate(stream)]
    )  # at one instant, a finish first: the worker was free before the next request came
    recv = np.array([o.received_s for o in stream])
    done = np.array([o.finished_s for o in stream])
    starts = np.concatenate([recv - decide_lead_s, done])  # each event's window at the router
    ends = np.concatenate([recv, done + release_lag_s])
    out = Agreement(matched=[-1] * len(stream))
    t0 = float(recv.min()) if len(recv) else 0.0
    for t, kind, i in events:
        o = stream[i]
        if kind == 0:
            router.loads[o.worker] -= 1
            continue
        req = Route(i, str(i), "", "", "", o.key)
        simulated = router.decide(req, t - t0)
        out.matched[i] = router.last_match
        router.tree.insert(o.key, o.worker)
        router.loads[o.worker] += 1
        out.decisions += 1
        overlaps = int(((starts < t) & (ends > t - decide_lead_s)).sum()) - 1  # not itself
        if overlaps > 0:
            out.ambiguous += 1
        elif simulated == o.worker:
            out.agree += 1
        else:
            out.differ.append((i, simulated, o.worker))
    return out
