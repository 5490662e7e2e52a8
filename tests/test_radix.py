"""The token-exact radix cache: SGLang's matching, node splits, LRU stamps, locks, eviction,
plus the simulator's kept prefixes and host tier. (The same behaviour is checked against
SGLang's own tree cores in `test_sglang_lockstep.py`.)"""

from __future__ import annotations

import pytest

from topas_bench.runners.sim.radix import Node, RadixCache
from topas_bench.workloads.model import Segment
from topas_bench.workloads.pieces import FILL, Piece, common, pieces, take


def p(*segs: tuple[str, int]) -> list[Piece]:
    return pieces([Segment(k, n) for k, n in segs])


def check_accounting(cache: RadixCache) -> None:
    gpu = sum(n.tokens for n in cache.nodes() if n.on_gpu)
    evictable = sum(n.tokens for n in cache.nodes() if n.on_gpu and n.lock == 0)
    host = sum(n.tokens for n in cache.nodes() if n.on_host)
    assert (cache.gpu_tokens, cache.evictable_tokens, cache.host_tokens) == (gpu, evictable, host)
    for n in cache.nodes():
        assert n.tokens == sum(b - a for _, a, b in n.edge) > 0
        if n.on_gpu:
            assert n.parent is not None and (n.parent is cache.root or n.parent.on_gpu)


def edges(cache: RadixCache) -> list[list[Piece]]:
    return sorted((n.edge for n in cache.nodes()), key=str)


# -- token identity ------------------------------------------------------------------------------
def test_common_compares_tokens_not_segments() -> None:
    # equal keys: a prefix of a segment is a prefix of its tokens
    assert common(p(("a", 10)), p(("a", 7), ("b", 3)), 100) == 7
    # a different key differs at its first (lead) token
    assert common(p(("a", 10)), p(("b", 10)), 100) == 0
    # fillers match fillers: a split-off continuation matches the rest of the same segment
    assert common([("a", 4, 10)], [("a", 4, 12)], 100) == 6
    # a segment ending where the other continues: the next lead token differs from a filler
    assert common(p(("a", 5), ("b", 3)), p(("a", 8)), 100) == 5
    assert common(p(("a", 10)), p(("a", 10)), 4) == 4  # limit
    assert take(p(("a", 5), ("b", 3)), 6) == ([("a", 0, 5), ("b", 0, 1)], [("b", 1, 3)])


# -- matching ------------------------------------------------------------------------------------
def test_match_splits_the_node_where_it_ends() -> None:
    """`_match_prefix_helper`: a match ending inside a node splits it."""
    cache = RadixCache()
    cache.insert(p(("a", 10), ("b", 5)))
    assert edges(cache) == [[("a", 0, 10), ("b", 0, 5)]]
    m = cache.match(p(("a", 10), ("x", 5)))
    assert (m.gpu_tokens, m.node.edge) == (10, [("a", 0, 10)])
    assert edges(cache) == [[("a", 0, 10)], [("b", 0, 5)]]
    # mid-segment: the cap at len - 1 (`_compute_max_prefix_len`) splits inside "b"
    m = cache.match(p(("a", 10), ("b", 5)), limit=14)
    assert (m.gpu_tokens, m.node.edge) == (14, [("b", 0, 4)])
    assert m.node.children[FILL].edge == [("b", 4, 5)]
    check_accounting(cache)


def test_probe_neither_splits_nor_stamps() -> None:
    cache = RadixCache()
    cache.insert(p(("a", 10), ("b", 5)))
    node = next(cache.nodes())
    t = node.last_access
    assert cache.probe(p(("a", 10), ("b", 2))) == (12, 0)
    assert cache.probe(p(("a", 3))) == (3, 0)
    assert (len(list(cache.nodes())), node.last_access) == (1, t)


def test_match_stamps_the_path_deepest_newest() -> None:
    """`_match_post_processor`: the matched path gets one fresh time, ancestors just older."""
    cache = RadixCache()
    cache.insert(p(("a", 10), ("b", 5)))
    cache.insert(p(("c", 4)))
    c = cache.root.children["c"]
    m = cache.match(p(("a", 10), ("b", 5)))
    a = m.node.parent
    assert isinstance(a, Node)
    assert c.last_access < a.last_access < m.node.last_access
    assert m.node.last_access - a.last_access == pytest.approx(1e-5)


def test_split_restamps_the_suffix_after_the_new_parent() -> None:
    """`_split_node`: the new parent is stamped at creation, then the child (suffix)."""
    cache = RadixCache()
    cache.insert(p(("a", 10), ("b", 5)))
    leaf = next(cache.nodes())
    cache.insert(p(("a", 10), ("c", 5)))  # walks a/b, splits it after "a"
    head = leaf.parent
    assert isinstance(head, Node) and head.edge == [("a", 0, 10)]
    assert head.last_access < leaf.last_access


def test_eviction_order_follows_match_refreshes() -> None:
    """Matching a waiting request's prefix keeps it from being the LRU victim."""
    cache = RadixCache()
    cache.insert(p(("a", 100)))
    cache.insert(p(("b", 100)))
    cache.match(p(("a", 100)))  # a is now more recent than b
    assert cache.evict(1) == 100
    assert cache.probe(p(("a", 100))) == (100, 0)
    assert cache.probe(p(("b", 100))) == (0, 0)


# -- insertion -----------------------------------------------------------------------------------
def test_insert_shares_and_reports_new_tokens() -> None:
    cache = RadixCache()
    last, added = cache.insert(p(("a", 10), ("b", 5)))
    assert (added, last.tokens) == (15, 15)
    last2, added2 = cache.insert(p(("a", 10), ("b", 5), ("c", 7)))
    assert added2 == 7 and last2.edge == [("c", 0, 7)]
    _, added3 = cache.insert(p(("a", 10), ("b", 3)))  # wholly present: splits, adds nothing
    assert added3 == 0
    assert (cache.gpu_tokens, cache.evictable_tokens) == (22, 22)
    check_accounting(cache)


# -- locks and eviction --------------------------------------------------------------------------
def test_locked_paths_are_protected_and_splits_keep_lock_counts() -> None:
    cache = RadixCache()
    last, _ = cache.insert(p(("a", 10), ("b", 5)))
    cache.lock(last)
    assert (cache.evictable_tokens, cache.protected_tokens) == (0, 15)
    m = cache.match(p(("a", 10)))  # splits the locked node
    assert m.node.lock == 1 and last.lock == 1
    assert cache.evict(100) == 0
    cache.unlock(last)
    assert (cache.evictable_tokens, cache.protected_tokens) == (15, 0)
    assert cache.evict(1) == 5  # the leaf first, then its parent becomes a leaf
    assert cache.evict(1) == 10
    check_accounting(cache)


def test_evict_frees_at_least_what_was_asked_in_lru_order() -> None:
    cache = RadixCache()
    for key in "abcd":
        cache.insert(p((key, 10)))
    assert cache.evict(15) == 20
    assert [k for k in "abcd" if cache.probe(p((k, 10)))[0]] == ["c", "d"]


# -- host tier -----------------------------------------------------------------------------------
def test_host_tier_keeps_evicted_prefixes_and_loads_them_back() -> None:
    cache = RadixCache(host_capacity_tokens=100)
    cache.insert(p(("a", 40), ("b", 10)))
    assert cache.evict(50) == 50
    assert (cache.gpu_tokens, cache.host_tokens) == (0, 50)
    m = cache.match(p(("a", 40), ("b", 10), ("c", 3)))
    assert (m.gpu_tokens, m.host_tokens, len(m.host_nodes)) == (0, 50, 1)
    assert cache.load_back(m.host_nodes) == 50
    assert (cache.gpu_tokens, cache.host_tokens) == (50, 50)
    check_accounting(cache)


def test_host_tier_evicts_lru_host_copies_when_full() -> None:
    cache = RadixCache(host_capacity_tokens=60)
    cache.insert(p(("a", 40)))
    cache.insert(p(("b", 40)))
    cache.evict(80)
    # a went to the host first; b needed the room, so a's copy was dropped
    assert cache.probe(p(("a", 40))) == (0, 0)
    assert cache.probe(p(("b", 40))) == (0, 40)
    check_accounting(cache)
