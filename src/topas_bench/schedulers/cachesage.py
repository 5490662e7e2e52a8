"""`cachesage`: eviction by a learned agent-transition survival probability plus recency.

CacheSage (arXiv 2605.27744; code ruizhang0101/vllm-cachesage, branch `cachesage-brae`,
`vllm/v1/core/block_pool.py` and `vllm/v1/engine/core.py`, read 2026-05): a vLLM block pool
whose freed prefix-cache blocks are ordered by a score, lowest evicted first. Two scores, chosen
by `CACHESAGE_POLICY`:

- `predictive`: `score = W * p_survive(agent) + exp(-decay * age)`. Each request's agent is a
  fingerprint of its leading blocks; the server observes one agent touch per request (repeats
  of the same agent in a row collapse into one) and a coordinator learns the agent-to-agent
  transitions of that stream online; `p_survive(agent)` is the probability that the agent
  fires within the next `K` touches. `age` counts the pool's touches since the block was last
  touched. Code defaults: `W = 4` (`CACHESAGE_PREDICT_WEIGHT`), `K = 3`
  (`CACHESAGE_PREDICT_K`), `decay = 0.1` (`CACHESAGE_DECAY`).
- `brae` (the code's default): `score = hits * exp(-decay * age)`, hits counted per block.

Here, with the simulator's mechanisms (`Decision.prefix_priority` under SGLang's `priority`
eviction, lower first, then LRU, as `kvflow`): the policy observes the agent of every request
as it first waits (a server sees every request there; FCFS admits in that order), in
(queued time, rid) order, collapsing repeats; `predictive` learns first-order transition counts
over that server-wide stream (the code's coordinator sees the server's stream too, not tasks)
and computes `p_survive(a)` exactly, from the last agent touched, as the probability of
reaching `a` within `horizon` steps of the empirical chain (no smoothing: an agent never seen
to follow has 0, and LRU decides). Each agent's prefix nodes get priority
`2 + floor(W * p_survive)`: two nodes whose `W * p` differ by 1 or more are ordered as the
code's additive score orders them whatever their recency (`exp(-decay * age)` lies in (0, 1]),
and within a class the order is recency, `exp(-decay * age)` being monotone in age. Outputs (0)
and prompts (1) keep SGLang's own priorities below. `score="hits-decay"` is the code's `brae`:
`hits` = requests of the agent observed, `age` = requests observed since its last one,
priority `2 + floor(hits * exp(-decay * age))`.

Simplifications (docs/schedulers.md): the score orders agent prefixes in integer classes, LRU
within, where the code's is additive and per block; only prefixes are tagged (the code tags
every block a request caches with its agent); one touch is one request (the code's `age`
counts block touches, so its decay per request is larger); the coordinator package
(`cachesage.engine.coordinator`: `predict_agent_survival`, `transition_window = 8`) is not
public, so the chain and its K-step survival are ours; the code's GPU pool reorders only the
blocks freed together (its free queue stays in free order across requests), ours orders the
whole tree, as the paper's eviction order. It orders no queue: FCFS.
"""

from __future__ import annotations

import math

from topas_bench.schedulers.base import Decision, Policy, ServerNeeds
from topas_bench.schedulers.validate import integer, number, one_of
from topas_bench.schedulers.view import EngineView

#: The lowest prefix class; SGLang's own nodes are 0 (outputs) and 1 (prompts).
BASE_PRIORITY = 2
SCORES = ("predictive", "hits-decay")


class AgentChain:
    """The server-wide stream of agent touches and its first-order transition counts."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[str, int]] = {}
        self.hits: dict[str, int] = {}
        self.last_touch: dict[str, int] = {}
        self.last: str | None = None
        self.step = 0

    def touch(self, agent: str) -> None:
        """One request of `agent`; a repeat of the last agent is not a transition."""
        self.step += 1
        self.hits[agent] = self.hits.get(agent, 0) + 1
        self.last_touch[agent] = self.step
        if agent == self.last:
            return
        if self.last is not None:
            row = self.counts.setdefault(self.last, {})
            row[agent] = row.get(agent, 0) + 1
        self.last = agent

    def survival(self, horizon: int) -> dict[str, float]:
        """Per agent seen: P(it is touched within `horizon` transitions from the last agent)."""
        out: dict[str, float] = {}
        if self.last is None:
            return out
        for target in sorted(self.hits):
            dist = {self.last: 1.0}
            hit = 0.0
            for _ in range(horizon):
                nxt: dict[str, float] = {}
                for state in sorted(dist):
                    row = self.counts.get(state)
                    if not row:
                        continue  # no transition seen from here: the walk stops
                    total = sum(row.values())
                    for to in sorted(row):
                        nxt[to] = nxt.get(to, 0.0) + dist[state] * row[to] / total
                hit += nxt.pop(target, 0.0)
                dist = nxt
            out[target] = hit
        return out

    def hits_decay(self, decay: float) -> dict[str, float]:
        """Per agent: its requests times exp(-decay x requests since its last one)."""
        return {
            a: self.hits[a] * math.exp(-decay * (self.step - self.last_touch[a]))
            for a in sorted(self.hits)
        }


class CacheSage(Policy):
    """FCFS; agent prefixes evicted by learned survival probability (or hits x decay), then LRU."""

    name = "cachesage"

    score = one_of("predictive", SCORES)
    weight = number(4.0, high=1e6)
    decay = number(0.1, high=1e6)
    horizon = integer(3, 1, 64)

    def setup(self) -> None:
        self.chain = AgentChain()
        self._seen: set[int] = set()

    @property
    def needs(self) -> ServerNeeds:
        """SGLang's `priority` eviction, whose prefix priorities it sets: the Python tree core."""
        return ServerNeeds(eviction="priority", tree_core="python")

    def observe(self, view: EngineView) -> None:
        """Touch the agent of every request waiting for the first time, in arrival order."""
        new = sorted(
            (r for r in view.waiting if r.rid not in self._seen),
            key=lambda r: (r.queued_s, r.rid),
        )
        for r in new:
            self._seen.add(r.rid)
            self.chain.touch(r.agent)

    def priorities(self) -> dict[str, int]:
        """Agent -> eviction priority of its prefix (higher survives longer)."""
        if self.score == "predictive":
            scores = {a: self.weight * p for a, p in self.chain.survival(self.horizon).items()}
        else:
            scores = self.chain.hits_decay(self.decay)
        return {a: BASE_PRIORITY + math.floor(s) for a, s in scores.items()}

    def decide(self, view: EngineView) -> Decision:
        self.observe(view)
        return Decision(admit=list(view.waiting), prefix_priority=self.priorities())
