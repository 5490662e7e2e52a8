"""The simulator against SGLang 0.5.23's own scheduler, in lockstep (`runners.sglang_cpu.lockstep`).

Random request streams (shared agent prefixes, append-only histories, EOS far below
`max_new_tokens`, long prompts, a 2,600-token KV budget, at most 8 running requests) go through
the simulator and through SGLang's real `Scheduler` on CPU (the reference engine: its waiting
queue, `SchedulePolicy`, `PrefillAdder`, radix cache, KV pool, retraction and `batch_is_full`
latch; SGLang's own schedule and eviction policies natively, every other scheduler through
our plugin's adapter, with its seams: prefix eviction priorities on SGLang's Python tree core,
finished contexts kept for a time to live). At every iteration the two
must agree on the admitted requests in order, their cached and new tokens (or the decode batch),
the free KV tokens, the evictable cache and the queue length. The comparison must also catch a
broken latch and a missing LRU refresh (mutations of the simulator), and the radix tree alone
must agree with SGLang's Python and Rust tree cores on random operation sequences, under every
radix eviction policy the simulator mirrors.

Like `test_sglang_adapter.py`, this file is both the pytest module (main venv) and the script
the SGLang venv runs (`make sglang-env`).
"""

from __future__ import annotations

import json
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import Any

#: Every scheduler that runs on the reference engine natively or through the plugin, with
#: parameters where the defaults would rarely exercise what defines it (label -> name, params).
SCHEDULERS: dict[str, tuple[str, dict[str, Any]]] = {
    name: (name, {})
    for name in (
        "fcfs", "lpm", "spf", "parrot", "autellix", "topas", "dfs-weight", "lof", "random",
        "hrrn", "shortest-prefill-first", "routing-key", "lpm-slru", "lpm-lfu", "lpm-priority",
        "lpm-aging", "kvflow", "continuum",
    )
} | {
    "continuum-cheap": ("continuum", {"memory_price": 0.1}),  # more contexts kept, and expire
    "continuum-free": ("continuum", {"memory_price": 0.0}),  # kept until their task ends
    "lpm-aging-k2": ("lpm-aging", {"k": 2, "aging_tokens_per_pass": 16}),
}  # fmt: skip
SEEDS = (0, 1, 2, 3)
#: Simulator mutations the comparison must catch, and the scheduler each breaks.
MUTATIONS = {
    "broken_latch": "fcfs",
    "no_lru_refresh": "fcfs",
    "no_split_restamp": "fcfs",
    "no_prefix_priority": "kvflow",
    "no_context_expiry": "continuum-cheap",
    "no_prompt_retention": "lpm-priority",
}
EVICTIONS = ("lru", "lfu", "slru", "priority")

# -- pytest side (main venv) -----------------------------------------------------------------
if __name__ != "__main__":  # the SGLang venv has no pytest
    import pytest

    from sglang_venv import script_results

    @pytest.fixture(scope="module")
    def results() -> dict[str, Any]:
        return script_results(__file__)

    @pytest.mark.slow
    @pytest.mark.parametrize("eviction", EVICTIONS)
    @pytest.mark.parametrize("backend", ["python", "rust"])
    def test_radix_tree_agrees_with_sglang(
        results: dict[str, Any], backend: str, eviction: str
    ) -> None:
        res = results[f"tree_{backend}_{eviction}"]
        assert res["error"] is None, res["error"]
        assert res["mismatches"] == [], res["mismatches"][:3]
        assert res["evictions"] > 100 and res["splits"] > 100  # the streams exercised both

    @pytest.mark.slow
    @pytest.mark.parametrize("scheduler", SCHEDULERS)
    @pytest.mark.parametrize("seed", SEEDS)
    def test_lockstep(results: dict[str, Any], scheduler: str, seed: int) -> None:
        res = results[f"lockstep_{scheduler}_{seed}"]
        assert res.get("error") is None, res.get("error")
        assert res["divergence"] is None, res["divergence"]
        # what the stream exercised: prefix hits, several admissions per batch, retraction
        assert res["hits"] > 50 and res["admissions"] > res["prefills"]
        assert res["retractions"] > 0

    @pytest.mark.slow
    @pytest.mark.parametrize("mutation", list(MUTATIONS))
    def test_lockstep_catches(results: dict[str, Any], mutation: str) -> None:
        res = results[f"mutation_{mutation}"]
        assert res.get("error") is None, res.get("error")
        assert res["divergence"] is not None, f"the comparison missed a {mutation} simulator"


# -- the SGLang venv side --------------------------------------------------------------------
def tree_differential(
    backend: str, eviction: str = "lru", seeds: int = 12, steps: int = 1500
) -> dict[str, Any]:
    """Random match / insert / lock / unlock / evict sequences against SGLang's tree, under
    one radix eviction policy (inserts at priority 0 or 1, each counting hits as a new
    request's would)."""
    import random
    from array import array

    import torch
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.runtime_context import publish, reset_context
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    from topas_bench.runners.sglang_cpu.tokens import TokenIds
    from topas_bench.runners.sim.radix import RadixCache
    from topas_bench.workloads.model import Segment
    from topas_bench.workloads.pieces import pieces

    sa = ServerArgs(model_path="dummy", device="cpu", page_size=1)
    reset_context()
    publish(sa, role="tokenizer")
    set_global_server_args_for_scheduler(sa)
    kv = 600
    mismatches: list[str] = []
    evictions = splits = 0
    for seed in range(seeds):
        rng = random.Random(seed)
        keys = [f"k{i}" for i in range(12)]
        tok = TokenIds(keys)
        pool = MHATokenToKVPool(
            size=kv, page_size=1, dtype=torch.float16, head_num=1, head_dim=1, layer_num=1,
            device="cpu", enable_memory_saver=False,
        )  # fmt: skip
        alloc = TokenToKVPoolAllocator(
            size=kv, dtype=torch.float16, device="cpu", kvcache=pool, need_sort=False
        )
        rtp = ReqToTokenPool(size=8, max_context_len=512, device="cpu", enable_memory_saver=False)
        params = CacheInitParams(
            disable=False, req_to_token_pool=rtp, token_to_kv_pool_allocator=alloc, page_size=1,
            tree_components=(ComponentType.FULL,), eviction_policy=eviction,
        )  # fmt: skip
        with envs.SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND.override(backend):
            cache = UnifiedRadixCache(params=params)
        sim = RadixCache(eviction=eviction)
        locks: list[tuple[Any, Any]] = []
        for step in range(steps):
            segs = [Segment(rng.choice(keys[:3]), rng.choice([5, 8, 12]))]
            segs += [
                Segment(rng.choice(keys), rng.randint(1, 15)) for _ in range(rng.randint(0, 3))
            ]
            ids = tok.prompt(segs)
            op = rng.random()
            nodes_before = sum(1 for _ in sim.nodes())
            if op < 0.35:
                limit = len(ids) - 1 if rng.random() < 0.5 else None
                key = RadixKey(array("q", ids[:limit] if limit is not None else ids))
                m = cache.match_prefix(MatchPrefixParams(key=key))
                ms = sim.match(pieces(segs), limit)
                if m.device_prefix_len != ms.gpu_tokens:
                    mismatches.append(
                        f"{seed}/{step}: match {m.device_prefix_len} != {ms.gpu_tokens}"
                    )
                    break
                if rng.random() < 0.3 and ms.gpu_tokens > 0:
                    locks.append((cache.lock(m.last_device_node), ms.node))
                    sim.lock(ms.node)
            elif op < 0.7:
                if alloc.available_size() < len(ids):
                    short = len(ids) - alloc.available_size()
                    cache.evict(EvictParams(num_tokens=short))
                    sim.evict(short)
                    evictions += 1
                    if alloc.available_size() < len(ids):
                        continue
                value = alloc.alloc(len(ids))
                prio = rng.choice([0, 0, 1])
                cache.insert(
                    InsertParams(key=RadixKey(array("q", ids)), value=value, priority=prio)
                )
                sim.insert(pieces(segs), prio, 0)
            elif op < 0.8 and locks:
                lock, node = locks.pop(rng.randrange(len(locks)))
                cache.unlock(lock)
                sim.unlock(node)
            else:
                n = rng.randint(1, 200)
                cache.evict(EvictParams(num_tokens=n))
                sim.evict(n)
                evictions += 1
            splits += sum(1 for _ in sim.nodes()) > nodes_before and op < 0.35
            state = (alloc.available_size(), cache.evictable_size(), cache.protected_size())
            mine = (kv - sim.gpu_tokens, sim.evictable_tokens, sim.protected_tokens)
            if state != mine:
                mismatches.append(f"{seed}/{step}: free/evictable/protected {state} != {mine}")
                break
    return {"mismatches": mismatches, "evictions": evictions, "splits": splits}


def mutate(name: str) -> Callable[[], None]:
    """Break the simulator the named way; returns the undo."""
    from topas_bench.runners.sim import engine, pins, radix
    from topas_bench.workloads.pieces import take

    if name == "broken_latch":  # re-run admission every iteration, as the old simulator did
        orig = engine.Simulator._prefill_attempt

        def attempt(self: Any) -> Any:
            self.batch_is_full = False
            return orig(self)

        engine.Simulator._prefill_attempt = attempt  # type: ignore[method-assign]
        return lambda: setattr(engine.Simulator, "_prefill_attempt", orig)
    if name == "no_lru_refresh":  # matching waiting requests does not touch LRU times
        stamp = radix.RadixCache._stamp
        radix.RadixCache._stamp = lambda self, node: None  # type: ignore[method-assign]
        return lambda: setattr(radix.RadixCache, "_stamp", stamp)
    if name == "no_prefix_priority":  # KVFlow's classes never reach the tree
        setp = engine.set_prefix_priorities
        engine.set_prefix_priorities = lambda *a: None  # type: ignore[assignment]
        return lambda: setattr(engine, "set_prefix_priorities", setp)
    if name == "no_context_expiry":  # kept contexts outlive their time to live
        expire = pins.ContextPins.expire
        pins.ContextPins.expire = lambda self, now_s, live: None  # type: ignore[method-assign]
        return lambda: setattr(pins.ContextPins, "expire", expire)
    if name == "no_prompt_retention":  # a finished request's prompt is not re-inserted at +1
        insert = engine.Simulator._insert

        def no_retention(self: Any, req: Any, up_to: int) -> Any:
            last, _ = self.cache.insert(take(req.fill(), up_to)[0], 0, req.inserted_len)
            req.inserted_len = max(req.inserted_len, up_to)
            return last

        engine.Simulator._insert = no_retention  # type: ignore[method-assign]
        return lambda: setattr(engine.Simulator, "_insert", insert)
    if name == "no_split_restamp":  # a split keeps the suffix's old recency
        split = radix.RadixCache._split

        def no_restamp(self: Any, child: Any, at: int) -> Any:
            old = child.last_access
            new = split(self, child, at)
            child.last_access = old
            return new

        radix.RadixCache._split = no_restamp  # type: ignore[method-assign]
        return lambda: setattr(radix.RadixCache, "_split", split)
    raise ValueError(name)


def main() -> None:
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)
    from topas_bench.runners.sglang_cpu.driver import set_env
    from topas_bench.runners.sglang_cpu.job import ServerSettings
    from topas_bench.runners.sglang_cpu.lockstep import compare, lockstep_config

    set_env(ServerSettings.of(lockstep_config()))
    out: dict[str, Any] = {}

    def run(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        try:
            out[name] = {"error": None, **fn()}
        except Exception:
            out[name] = {"error": traceback.format_exc()[-3000:]}
        print(name, {k: v for k, v in out[name].items() if k != "mismatches"}, file=sys.stderr)

    for backend in ("python", "rust"):
        for eviction in EVICTIONS:
            run(
                f"tree_{backend}_{eviction}",
                lambda b=backend, e=eviction: tree_differential(b, e),  # type: ignore[misc]
            )
    for label, (name, params) in SCHEDULERS.items():
        for seed in SEEDS:
            run(
                f"lockstep_{label}_{seed}",
                lambda n=name, p=params, k=seed: compare(k, n, params=p),  # type: ignore[misc]
            )
    for mutation, label in MUTATIONS.items():
        name, params = SCHEDULERS[label]
        undo = mutate(mutation)
        try:
            run(f"mutation_{mutation}", lambda n=name, p=params: compare(0, n, params=p))  # type: ignore[misc]
        finally:
            undo()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
