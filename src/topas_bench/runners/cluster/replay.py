"""Replaying the real sglang-router's decisions through the simulated cache-aware router.

Given what the real router did with a request stream (each request's text, the worker that
served it, when the worker received it and when it finished it) and its registry order, every
decision is replayed: the simulated router (`routers.cache_aware.CacheAware`) decides on the
same text with the same state the real one had, then learns the real choice, not its own (the
tree gets the text under the real worker, the load counts the real worker), so one
disagreement cannot cascade into the next and each decision is checked on its own.

Each request is counted in flight from `routed_s` to `released_s`, on one clock: the client's
(when it sent the request and when its answer ended: the router routes it right after it
arrives and counts it out as it passes the last of the answer on) or the workers' (when the
worker received and finished it: later than the router's decision by the proxy's own delay,
which a busy machine can stretch). `route_window` and `release_window` bound, around those
times, when the router really acted; a decision whose window overlaps another event's may have
come before or after that event at the router: it is counted apart (`Agreement.ambiguous`) and
left out of the match rate (it is still replayed, with the real choice learnt).
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
    served it (replica index), and when it was routed and released (seconds, one clock)."""

    key: Any
    worker: int
    routed_s: float
    released_s: float


#: (seconds before, seconds after) the observed time in which the router acted: on the client's
#: clock (it routes right after the client sends; counts out just before the client's end).
CLIENT_WINDOWS = ((0.0, 0.05), (0.05, 0.0))
#: on the workers' clock (it routed before the worker received; counted out after it ended).
WORKER_WINDOWS = ((0.1, 0.0), (0.0, 0.05))


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
    windows: tuple[tuple[float, float], tuple[float, float]] = CLIENT_WINDOWS,
) -> Agreement:
    """How many of the real router's decisions the simulated cache-aware router makes too."""
    cluster = Cluster(replicas, order=tuple(order))
    router = CacheAware(cluster, parse_params(CacheAware, params or {}), units=units)
    events = sorted(
        [(o.routed_s, 1, i) for i, o in enumerate(stream)]
        + [(o.released_s, 0, i) for i, o in enumerate(stream)]
    )  # at one instant, a release first: the worker was free before the next request came
    (rb, ra), (lb, la) = windows
    routed = np.array([o.routed_s for o in stream])
    released = np.array([o.released_s for o in stream])
    starts = np.concatenate([routed - rb, released - lb])  # each event's window at the router
    ends = np.concatenate([routed + ra, released + la])
    out = Agreement(matched=[-1] * len(stream))
    t0 = float(routed.min()) if len(routed) else 0.0
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
        overlaps = int(((starts <= t + ra) & (ends >= t - rb)).sum()) - 1  # not itself
        if overlaps > 0:
            out.ambiguous += 1
        elif simulated == o.worker:
            out.agree += 1
        else:
            out.differ.append((i, simulated, o.worker))
    return out
