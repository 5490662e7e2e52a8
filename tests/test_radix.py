"""The segment radix cache: matching, lock counts, LRU eviction, kept prefixes, host tier."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topas_bench.runners.sim.radix import Node, RadixCache
from topas_bench.workloads.model import Segment


def segs(*pairs: tuple[str, int]) -> tuple[Segment, ...]:
    return tuple(Segment(k, n) for k, n in pairs)


def path(cache: RadixCache, *keys: str) -> Node:
    node = cache.root
    for k in keys:
        node = node.children[k]
    return node


def snapshot(cache: RadixCache) -> tuple[object, ...]:
    """Everything eviction could change, for "mutates nothing" checks."""
    nodes = sorted(
        (n.seq, n.key, n.tokens, n.lock, n.on_gpu, n.on_host, n.last_access_s, len(n.children))
        for n in cache.nodes()
    )
    return (
        cache.version,
        cache.gpu_tokens,
        cache.evictable_tokens,
        cache.host_tokens,
        tuple(nodes),
    )


def check_accounting(cache: RadixCache) -> None:
    gpu = sum(n.tokens for n in cache.nodes() if n.on_gpu)
    evictable = sum(n.tokens for n in cache.nodes() if n.on_gpu and n.lock == 0)
    host = sum(n.tokens for n in cache.nodes() if n.on_host)
    assert (cache.gpu_tokens, cache.evictable_tokens, cache.host_tokens) == (gpu, evictable, host)
    for n in cache.nodes():
        if n.on_gpu:
            assert n.parent is not None and (n.parent is cache.root or n.parent.on_gpu)
        assert n.on_gpu or n.on_host, f"{n.key} is in the tree but nowhere"


# -- matching ------------------------------------------------------------------------------
def test_empty_cache_matches_nothing() -> None:
    cache = RadixCache()
    m = cache.match(segs(("a", 10)))
    assert (m.gpu_tokens, m.host_tokens, m.host_nodes) == (0, 0, ())
    assert m.node is cache.root


def test_match_gpu_prefix_and_partial_matches() -> None:
    cache = RadixCache()
    last, added = cache.insert(cache.root, segs(("a", 10), ("b", 5)), now_s=1.0)
    assert added == 15
    assert last is path(cache, "a", "b")
    assert (cache.gpu_tokens, cache.evictable_tokens, cache.protected_tokens) == (15, 15, 0)

    full = cache.match(segs(("a", 10), ("b", 5), ("c", 7)))
    assert (full.gpu_tokens, full.host_tokens) == (15, 0)
    assert full.node is last

    partial = cache.match(segs(("a", 10), ("x", 5)))
    assert partial.gpu_tokens == 10
    assert partial.node is path(cache, "a")

    # A different first segment shares nothing even if a later key exists in the tree.
    miss = cache.match(segs(("b", 5)))
    assert (miss.gpu_tokens, miss.node) == (0, cache.root)

    limited = cache.match(segs(("a", 10), ("b", 5)), limit=1)
    assert (limited.gpu_tokens, limited.node) == (10, path(cache, "a"))


def test_match_does_not_touch_lru_or_version() -> None:
    cache = RadixCache()
    cache.insert(cache.root, segs(("a", 10)), now_s=1.0)
    before = snapshot(cache)
    cache.match(segs(("a", 10)))
    assert snapshot(cache) == before


def test_host_segments_follow_gpu_ones_in_a_match() -> None:
    cache = RadixCache(host_capacity_tokens=100)
    cache.insert(cache.root, segs(("p", 5), ("q", 7), ("r", 3)), now_s=1.0)
    cache.lock(path(cache, "p"))
    assert cache.evict(10) == 10  # r (leaf) first, then q: both go to the host tier
    q, r = path(cache, "p", "q"), path(cache, "p", "q", "r")
    assert not q.on_gpu and q.on_host and not r.on_gpu and r.on_host
    assert cache.host_tokens == 10

    m = cache.match(segs(("p", 5), ("q", 7), ("r", 3), ("s", 1)))
    assert m.gpu_tokens == 5
    assert m.node is path(cache, "p")
    assert m.host_tokens == 10
    assert m.host_nodes == (q, r)
    check_accounting(cache)


# -- locking ------------------------------------------------------------------------------
def test_lock_and_unlock_move_tokens_between_evictable_and_protected() -> None:
    cache = RadixCache()
    b, _ = cache.insert(cache.root, segs(("a", 10), ("b", 5)), now_s=1.0)
    c, _ = cache.insert(path(cache, "a"), segs(("c", 3)), now_s=1.0)
    assert (cache.gpu_tokens, cache.evictable_tokens) == (18, 18)

    assert cache.unlocked_path_tokens(b) == 15
    cache.lock(b)
    assert (cache.evictable_tokens, cache.protected_tokens) == (3, 15)
    assert (path(cache, "a").lock, b.lock, c.lock) == (1, 1, 0)
    # c's path shares the locked a: only c itself would become protected.
    assert cache.unlocked_path_tokens(c) == 3

    cache.lock(c)
    assert (cache.evictable_tokens, cache.protected_tokens) == (0, 18)
    assert path(cache, "a").lock == 2

    cache.unlock(b)
    assert (cache.evictable_tokens, cache.protected_tokens) == (5, 13)  # a still held by c
    cache.unlock(c)
    assert (cache.evictable_tokens, cache.protected_tokens) == (18, 0)
    assert all(n.lock == 0 for n in cache.nodes())
    assert cache.root.lock == 1  # the root's own pin never moves

    with pytest.raises(AssertionError, match="below zero"):
        cache.unlock(c)


def test_nested_locks_need_matching_unlocks() -> None:
    cache = RadixCache()
    a, _ = cache.insert(cache.root, segs(("a", 4)), now_s=0.0)
    cache.lock(a)
    cache.lock(a)
    cache.unlock(a)
    assert (a.lock, cache.evictable_tokens) == (1, 0)
    cache.unlock(a)
    assert (a.lock, cache.evictable_tokens) == (0, 4)


def test_lock_touch_and_match_do_not_bump_version() -> None:
    cache = RadixCache()
    a, _ = cache.insert(cache.root, segs(("a", 4)), now_s=0.0)
    v = cache.version
    cache.lock(a)
    cache.touch(a, 5.0)
    cache.unlock(a)
    assert cache.version == v
    assert a.last_access_s == 5.0


# -- eviction ------------------------------------------------------------------------------
def three_leaves(times: tuple[float, float, float] = (1.0, 2.0, 3.0)) -> RadixCache:
    cache = RadixCache()
    for key, tokens, t in zip("xyz", (4, 6, 8), times, strict=True):
        cache.insert(cache.root, segs((key, tokens)), now_s=t)
    return cache


def on_gpu(cache: RadixCache) -> set[str]:
    return {n.key for n in cache.nodes() if n.on_gpu}


def test_evict_takes_least_recently_used_leaf_first() -> None:
    cache = three_leaves()
    assert cache.evict(1) == 4  # frees at least 1: the whole oldest leaf x
    assert on_gpu(cache) == {"y", "z"}
    assert cache.child("x") is None  # without a host tier it leaves the tree
    assert (cache.gpu_tokens, cache.evictable_tokens) == (14, 14)

    assert cache.evict(7) == 14  # y (6) is not enough, so z goes too
    assert on_gpu(cache) == set()
    assert cache.gpu_tokens == 0


def test_lru_order_follows_touch() -> None:
    cache = three_leaves()
    cache.touch(path(cache, "x"), 10.0)
    assert cache.evict(6) == 6
    assert on_gpu(cache) == {"x", "z"}


def test_lru_ties_break_by_creation_order() -> None:
    cache = three_leaves(times=(5.0, 5.0, 5.0))
    assert cache.evict(4) == 4
    assert on_gpu(cache) == {"y", "z"}
    assert cache.evict(1) == 6
    assert on_gpu(cache) == {"z"}


def test_evict_more_than_evictable_frees_what_it_can() -> None:
    cache = three_leaves()
    assert cache.evict(1000) == 18
    assert (cache.gpu_tokens, cache.evictable_tokens, list(cache.nodes())) == (0, 0, [])


def test_locked_nodes_are_never_evicted() -> None:
    cache = three_leaves()
    x = path(cache, "x")
    cache.lock(x)
    assert cache.evict(1000) == 14
    assert on_gpu(cache) == {"x"}
    assert x.on_gpu and cache.protected_tokens == 4


def test_locked_descendant_protects_its_ancestors() -> None:
    cache = RadixCache()
    leaf, _ = cache.insert(cache.root, segs(("a", 3), ("b", 4)), now_s=1.0)
    cache.insert(path(cache, "a"), segs(("c", 5)), now_s=1.0)
    cache.lock(leaf)
    assert cache.evict(1000) == 5
    assert on_gpu(cache) == {"a", "b"}


def test_kept_prefixes_are_never_evicted_until_released() -> None:
    cache = RadixCache()
    cache.insert(cache.root, segs(("agent:a", 10)), now_s=1.0)
    cache.insert(cache.root, segs(("agent:b", 20)), now_s=2.0)
    a = path(cache, "agent:a")
    cache.set_kept(frozenset({"agent:a", "agent:missing"}))
    assert set(cache.kept) == {"agent:a"}  # a key not in the tree is not kept
    assert (a.lock, cache.evictable_tokens) == (1, 20)

    cache.set_kept(frozenset({"agent:a"}))  # idempotent: no second lock
    assert a.lock == 1

    assert cache.evict(1000) == 20
    assert on_gpu(cache) == {"agent:a"}

    cache.set_kept(frozenset())
    assert cache.kept == {}
    assert (a.lock, cache.evictable_tokens) == (0, 10)
    assert cache.evict(1) == 10
    assert on_gpu(cache) == set()


def test_only_gpu_root_children_can_be_kept() -> None:
    cache = RadixCache(host_capacity_tokens=100)
    cache.insert(cache.root, segs(("agent:a", 10), ("deep", 5)), now_s=1.0)
    cache.evict(1000)  # both now host-only
    cache.set_kept(frozenset({"agent:a", "deep"}))
    assert cache.kept == {}
    check_accounting(cache)


def test_parent_becomes_evictable_once_its_children_are_gone() -> None:
    cache = RadixCache()
    cache.insert(cache.root, segs(("a", 3), ("b", 4)), now_s=1.0)
    cache.insert(cache.root, segs(("c", 5)), now_s=2.0)
    # Leaves: b (t=1) and c (t=2). Once b is gone, a (t=1) is a leaf older than c.
    assert cache.evict(5) == 7
    assert on_gpu(cache) == {"c"}


def test_recently_touched_parent_outlives_an_older_leaf() -> None:
    cache = RadixCache()
    cache.insert(cache.root, segs(("a", 3), ("b", 4)), now_s=1.0)
    cache.insert(cache.root, segs(("c", 5)), now_s=2.0)
    cache.touch(path(cache, "a"), 3.0)  # touches a only (touch walks up, not down)
    assert path(cache, "a", "b").last_access_s == 1.0
    assert cache.evict(5) == 9  # b, then c (t=2) before a (t=3)
    assert on_gpu(cache) == {"a"}


def test_a_parent_with_a_locked_child_stays() -> None:
    cache = RadixCache()
    cache.insert(cache.root, segs(("a", 3), ("b", 4)), now_s=1.0)
    c, _ = cache.insert(path(cache, "a"), segs(("c", 5)), now_s=2.0)
    cache.lock(c)
    assert cache.evict(1000) == 4
    assert on_gpu(cache) == {"a", "c"}


# -- the dry run -----------------------------------------------------------------------------
def build_tree() -> RadixCache:
    """a(2)-{b(3)-{d(1)}, c(4)}, e(5)-f(6), g(7); distinct access times."""
    cache = RadixCache()
    cache.insert(cache.root, segs(("a", 2), ("b", 3), ("d", 1)), now_s=1.0)
    cache.insert(path(cache, "a"), segs(("c", 4)), now_s=4.0)
    cache.insert(cache.root, segs(("e", 5), ("f", 6)), now_s=2.0)
    cache.insert(cache.root, segs(("g", 7)), now_s=3.0)
    return cache


@pytest.mark.parametrize("want", [0, 1, 4, 5, 9, 10, 15, 20, 28, 100])
def test_evictable_before_equals_evict_and_mutates_nothing(want: int) -> None:
    cache = build_tree()
    before = snapshot(cache)
    dry = cache.evictable_before(set(), want)
    assert snapshot(cache) == before
    assert cache.evict(want) == dry


def test_evictable_before_stops_at_a_protected_node() -> None:
    cache = build_tree()
    # LRU order: d (t1) then b (t1, now a leaf), then e-f chain: f (t2) ...
    assert cache.evictable_before({id(path(cache, "a", "b"))}, 100) == 1
    assert cache.evictable_before({id(path(cache, "e", "f"))}, 100) == 4
    assert cache.evictable_before({id(path(cache, "e", "f"))}, 2) == 4  # stops at want first
    assert cache.evictable_before({id(path(cache, "g"))}, 100) == 1 + 3 + 6 + 5
    before = snapshot(cache)
    cache.evictable_before({id(path(cache, "g"))}, 100)
    assert snapshot(cache) == before


def test_evict_order_on_the_tree() -> None:
    cache = build_tree()
    order: list[str] = []
    while cache.gpu_tokens:
        gone = on_gpu(cache)
        cache.evict(1)
        order.extend(sorted(gone - on_gpu(cache)))
    # d(1) b(1) | f(2) e(2) | g(3) | c(4) a(1->c's parent, t1 but only a leaf after c)
    assert order == ["d", "b", "f", "e", "g", "c", "a"]


# Random trees: the dry run must predict evict exactly.
_KEYS = st.sampled_from("abcdef")
_INSERT = st.tuples(
    st.lists(st.tuples(_KEYS, st.integers(1, 9)), min_size=1, max_size=4),
    st.integers(0, 5),
)


@settings(max_examples=150, deadline=None)
@given(
    inserts=st.lists(_INSERT, min_size=1, max_size=8),
    locks=st.lists(st.integers(0, 30), max_size=3),
    want=st.integers(0, 60),
    host=st.sampled_from([0, 5, 40]),
)
def test_dry_run_matches_evict_on_random_trees(
    inserts: list[tuple[list[tuple[str, int]], int]], locks: list[int], want: int, host: int
) -> None:
    cache = RadixCache(host_capacity_tokens=host)
    for pairs, t in inserts:
        # Equal keys mean equal tokens: fix each key's length by the key.
        cache.insert(cache.root, segs(*((k, "abcdef".index(k) + 1) for k, _ in pairs)), float(t))
    nodes = sorted(cache.nodes(), key=lambda n: n.seq)
    for i in locks:
        cache.lock(nodes[i % len(nodes)])
    evictable = cache.evictable_tokens
    before = snapshot(cache)
    dry = cache.evictable_before(set(), want)
    assert snapshot(cache) == before
    freed = cache.evict(want)
    assert freed == dry
    assert freed >= min(want, evictable)
    assert cache.evictable_tokens == evictable - freed
    assert all(n.on_gpu for n in nodes if n.lock)
    check_accounting(cache)


# -- host tier -------------------------------------------------------------------------------
def test_evicted_nodes_move_to_host_up_to_capacity() -> None:
    cache = RadixCache(host_capacity_tokens=20)
    cache.insert(cache.root, segs(("a", 10)), now_s=1.0)
    cache.insert(cache.root, segs(("b", 8)), now_s=2.0)
    cache.insert(cache.root, segs(("c", 25)), now_s=3.0)
    a = path(cache, "a")
    assert cache.evict(1) == 10
    assert (a.on_gpu, a.on_host) == (False, True)
    assert cache.child("a") is a  # still in the tree, on the host
    assert (cache.gpu_tokens, cache.evictable_tokens, cache.host_tokens) == (33, 33, 10)

    m = cache.match(segs(("a", 10)))
    assert (m.gpu_tokens, m.host_tokens, m.host_nodes, m.node) == (0, 10, (a,), cache.root)

    cache.evict(1)  # b: 10 + 8 fits
    assert cache.host_tokens == 18
    cache.evict(1)  # c: larger than the whole host tier, dropped
    assert cache.child("c") is None
    assert cache.host_tokens == 18
    check_accounting(cache)


def test_host_lru_evicts_host_only_leaves() -> None:
    cache = RadixCache(host_capacity_tokens=20)
    for key, tokens, t in (("a", 10, 1.0), ("b", 8, 2.0), ("c", 6, 3.0)):
        cache.insert(cache.root, segs((key, tokens)), now_s=t)
    cache.evict(18)  # a and b to host (18 of 20)
    assert cache.host_tokens == 18
    cache.evict(1)  # c needs 4 more: the oldest host leaf a is dropped
    assert cache.child("a") is None
    assert (path(cache, "b").on_host, path(cache, "c").on_host) == (True, True)
    assert cache.host_tokens == 14
    check_accounting(cache)


def test_host_lru_skips_nodes_that_are_also_on_the_gpu() -> None:
    cache = RadixCache(host_capacity_tokens=15)
    for key, tokens, t in (("a", 10, 1.0), ("b", 5, 2.0), ("c", 5, 3.0)):
        cache.insert(cache.root, segs((key, tokens)), now_s=t)
    cache.evict(15)  # a, b to host: 15 of 15
    a = path(cache, "a")
    assert cache.load_back([a], now_s=0.5) == 10  # back on the GPU, host copy kept, old time
    assert (a.on_gpu, a.on_host, cache.host_tokens) == (True, True, 15)
    cache.evict(5)  # LRU on the GPU is a (t=0.5): already on host, nothing to copy
    assert (a.on_gpu, a.on_host, cache.host_tokens) == (False, True, 15)
    cache.load_back([a], now_s=9.0)
    cache.evict(5)  # c (t=3): needs 5 host tokens; a is on the GPU too, so b goes
    assert cache.child("b") is None
    assert (path(cache, "c").on_host, a.on_host, cache.host_tokens) == (True, True, 15)
    check_accounting(cache)


def test_host_lru_frees_a_chain_leaf_first_then_its_parent() -> None:
    """SGLang's `HiRadixCache.evict_host` pushes a parent once its last child is gone."""
    cache = RadixCache(host_capacity_tokens=10)
    cache.insert(cache.root, segs(("p", 4), ("q", 4)), now_s=1.0)
    cache.insert(cache.root, segs(("r", 10)), now_s=2.0)
    cache.evict(8)  # q, then p: both to the host (8 of 10)
    assert cache.host_tokens == 8
    cache.evict(1)  # r needs all 10: q (leaf), then p (now a leaf) must go
    assert cache.child("p") is None
    r = path(cache, "r")
    assert (r.on_gpu, r.on_host, cache.host_tokens) == (False, True, 10)
    check_accounting(cache)


def test_dropping_a_node_drops_its_host_descendants() -> None:
    cache = RadixCache(host_capacity_tokens=6)
    cache.insert(cache.root, segs(("p", 8), ("q", 5)), now_s=1.0)
    cache.evict(5)  # q to host (5 of 6)
    assert cache.host_tokens == 5
    cache.evict(1)  # p (8 > 6) cannot go to the host: it and its host child q are dropped
    assert cache.child("p") is None
    assert cache.host_tokens == 0
    check_accounting(cache)


def test_load_back_restores_gpu_residency() -> None:
    cache = RadixCache(host_capacity_tokens=100)
    cache.insert(cache.root, segs(("a", 10), ("b", 5)), now_s=1.0)
    cache.evict(100)
    a, b = path(cache, "a"), path(cache, "a", "b")
    v = cache.version
    assert cache.load_back([a, b], now_s=7.0) == 15
    assert cache.version == v + 2
    assert (a.on_gpu, b.on_gpu, a.last_access_s, b.last_access_s) == (True, True, 7.0, 7.0)
    assert (cache.gpu_tokens, cache.evictable_tokens, cache.host_tokens) == (15, 15, 15)
    m = cache.match(segs(("a", 10), ("b", 5)))
    assert (m.gpu_tokens, m.host_tokens, m.node) == (15, 0, b)
    check_accounting(cache)


# -- insert ---------------------------------------------------------------------------------
def test_insert_shares_existing_segments() -> None:
    cache = RadixCache()
    b, _ = cache.insert(cache.root, segs(("a", 10), ("b", 5)), now_s=1.0)
    v = cache.version
    c, added = cache.insert(cache.root, segs(("a", 10), ("b", 5), ("c", 2)), now_s=4.0)
    assert added == 2
    assert c.parent is b
    assert cache.version == v + 1  # only the new node
    assert (b.last_access_s, c.last_access_s) == (4.0, 4.0)
    assert cache.gpu_tokens == 17

    _, again = cache.insert(cache.root, segs(("a", 10)), now_s=5.0)
    assert again == 0
    assert cache.version == v + 1
    assert len(list(cache.nodes())) == 3


def test_insert_below_a_node() -> None:
    cache = RadixCache()
    a, _ = cache.insert(cache.root, segs(("a", 10)), now_s=1.0)
    last, added = cache.insert(a, segs(("x", 3)), now_s=2.0)
    assert (added, last.parent, cache.match(segs(("a", 10), ("x", 3))).gpu_tokens) == (3, a, 13)


def test_insert_rematerialises_host_only_segments() -> None:
    cache = RadixCache(host_capacity_tokens=100)
    cache.insert(cache.root, segs(("a", 10), ("b", 5)), now_s=1.0)
    cache.evict(100)
    a = path(cache, "a")
    v = cache.version
    last, added = cache.insert(cache.root, segs(("a", 10), ("c", 3)), now_s=2.0)
    assert added == 13
    assert cache.version == v + 2
    assert a.on_gpu and a.on_host  # the host copy stays
    assert last.parent is a
    assert not path(cache, "a", "b").on_gpu
    assert (cache.gpu_tokens, cache.evictable_tokens, cache.host_tokens) == (13, 13, 15)
    check_accounting(cache)


def test_version_bumps_once_per_node_joining_or_leaving_the_gpu() -> None:
    cache = RadixCache(host_capacity_tokens=100)
    assert cache.version == 0
    cache.insert(cache.root, segs(("a", 1), ("b", 1), ("c", 1)), now_s=0.0)
    assert cache.version == 3
    cache.evict(2)  # c, b
    assert cache.version == 5
    cache.load_back([path(cache, "a", "b")], now_s=1.0)
    assert cache.version == 6
    cache.evict(100)  # b, a
    assert cache.version == 8
