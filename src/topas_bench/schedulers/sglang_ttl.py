"""`sglang-ttl`: SGLang's own agent cache control after 0.5.23: finished contexts pinned for a
time to live, refreshed on a hit, released when the session closes.

Mirrored from SGLang's main branch after the 0.5.23 release. There is no release number to
name: 0.5.23 is the newest release on PyPI (`pip index versions sglang`, 2026-12-04), so these
features are unreleased; the repository snapshot was too large to fetch here, so what was read
is the pull requests and files below:
- PR #18941 (merged 2026-02, "TTL-based prefix pinning with refresh-on-hit for HiRadixCache",
  `mem_cache/hiradix_cache.py`, `/hicache/pin_prefix`): after a request's stream completes, the
  client (Dynamo's router, `nvext.cache_control`, PR ai-dynamo/dynamo#6213) pins the request's
  tokens for `ttl` seconds; pinned nodes survive eviction, expire lazily, and a cache hit on a
  pinned node pushes its expiry to `now + ttl`. Dynamo clamps the TTL to [300, 3600] s, default
  300 s (its `cache_control` docs, `fern/pages/backends/sglang/agents.md`). PR #21884 (2026-04)
  removed the hard pin again, to come back another way.
- PR #27058 / #29436 / #29173 (2026-06 to 2026-08, `--enable-session-radix-cache`,
  `mem_cache/radix_cache.py`, `unified_cache/components/tree_component.py`): a request's
  `session_id` (Dynamo derives it from the agent trajectory, dynamo#10214) tags its KV in the
  radix tree; `/close_session` releases it; session-referenced entries are evicted after
  unreferenced ones. `mem_cache/cache_salt_ttl.py`'s `last_use` mode is the same idle-timeout
  rule for cache salts (every request carrying the salt pushes the deadline out).

Here (the simulator's mechanisms): a session is a task (its trajectory). When a call finishes,
its context (prompt and output as the tree holds them) is kept locked for `ttl_s`
(`Policy.context_ttl`); an admitted request whose cached prefix covers a kept context restarts
that context's TTL from now (`Policy.refreshes_contexts`, `runners.sim.pins.ContextPins.refresh`);
the task's end closes the session and releases its contexts (the engine's rule for every kept
context). Queue: FCFS, the stock server's default. Simplifications (docs/schedulers.md): a pin
here is a lock on the GPU (SGLang's needs HiCache and demotes pinned nodes to host rather than
deleting them; the simulator's host tier keeps no pins); the pin budget
(`SGLANG_HICACHE_MAX_PINNED_RATIO`, a fraction of the host pool) is the engine's admission
budget, as for every kept context, and pins give way before decode would retract or the server
would idle; a hit refreshes a context only when it covers the whole context (SGLang refreshes
each matched node); the soft session-referenced eviction order of PR #29173 is not mirrored
(contexts are hard-pinned for the TTL instead). Refresh on hit is a simulator mechanism: the
reference engine and the plugin refuse this scheduler.
"""

from __future__ import annotations

from topas_bench.schedulers.base import Decision, Policy, RequestView
from topas_bench.schedulers.validate import number
from topas_bench.schedulers.view import EngineView


class SglangTTL(Policy):
    """FCFS; a finished context pinned for a TTL, refreshed on a hit, released at session end."""

    name = "sglang-ttl"
    refreshes_contexts = True

    ttl_s = number(300.0, high=1e9)

    def decide(self, view: EngineView) -> Decision:
        return Decision(admit=list(view.waiting))

    def context_ttl(self, finished: RequestView, view: EngineView) -> float:
        return self.ttl_s
