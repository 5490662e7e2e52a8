"""A radix prefix cache over prompt segments, mirroring SGLang's `RadixCache`.

SGLang 0.5.23 (`sglang/srt/mem_cache/radix_cache.py`) keeps a radix tree of token ids with a
lock count per node: `inc_lock_ref` walks from a node to the root, moving tokens from the
evictable to the protected size when a count leaves zero; `evict(n)` pops least-recently-used
unlocked leaves until `n` tokens are free. Here an edge is one segment (a content key and a
token count, page size 1): equal keys mean equal tokens, so matching by key is token-exact at
segment granularity.

Extensions:
- *kept* nodes (an agent prefix the policy wants resident) hold one extra lock, so they are
  protected exactly like prefixes in use and can never be evicted.
- an optional host tier (HiCache-like): an evicted GPU node moves to host memory, from where a
  later match can load it back for `tokens * kv_bytes_per_token / host_link_bandwidth` instead of
  recomputing it. Host copies are evicted LRU when host memory is full.

Invariant: every ancestor of a GPU node is on the GPU (eviction takes GPU leaves first).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from topas_bench.workloads.model import Segment


class Node:
    __slots__ = (
        "children",
        "key",
        "last_access_s",
        "lock",
        "on_gpu",
        "on_host",
        "parent",
        "seq",
        "tokens",
    )

    def __init__(self, key: str, tokens: int, parent: Node | None, seq: int) -> None:
        self.key = key
        self.tokens = tokens
        self.parent = parent
        self.children: dict[str, Node] = {}
        self.lock = 0
        self.last_access_s = 0.0
        self.on_gpu = True
        self.on_host = False
        self.seq = seq  # creation order: the LRU tie-break, so eviction is deterministic

    def gpu_child_count(self) -> int:
        return sum(1 for c in self.children.values() if c.on_gpu)


@dataclass(frozen=True, slots=True)
class Match:
    """Result of matching a prompt: the GPU-resident prefix, then host-resident segments."""

    gpu_tokens: int
    node: Node  # last GPU node (the root if nothing matched)
    host_tokens: int
    host_nodes: tuple[Node, ...]


class RadixCache:
    """Segment radix tree with lock counts, LRU eviction and an optional host tier."""

    def __init__(self, host_capacity_tokens: int = 0) -> None:
        self._seq = 0
        self.root = Node("", 0, None, 0)
        self.root.lock = 1  # the root is never evicted
        self.gpu_tokens = 0
        self.evictable_tokens = 0
        self.host_capacity_tokens = host_capacity_tokens
        self.host_tokens = 0
        self.kept: dict[str, Node] = {}
        #: Bumped whenever a node joins or leaves the GPU, so callers can memoise matches.
        self.version = 0

    # -- queries ---------------------------------------------------------------------------
    @property
    def protected_tokens(self) -> int:
        return self.gpu_tokens - self.evictable_tokens

    def match(self, prompt: Sequence[Segment], limit: int | None = None) -> Match:
        """Longest cached prefix of `prompt` (at most `limit` segments). Does not touch LRU."""
        node = self.root
        gpu = 0
        host = 0
        host_nodes: list[Node] = []
        gpu_node = self.root
        segs = prompt if limit is None else prompt[:limit]
        for seg in segs:
            child = node.children.get(seg.key)
            if child is None:
                break
            if child.on_gpu and not host_nodes:
                gpu += child.tokens
                gpu_node = child
            elif child.on_host:
                host += child.tokens
                host_nodes.append(child)
            else:
                break
            node = child
        return Match(gpu, gpu_node, host, tuple(host_nodes))

    def unlocked_path_tokens(self, node: Node) -> int:
        """Evictable tokens on the path root..node (what locking `node` would protect)."""
        total = 0
        n: Node | None = node
        while n is not None and n is not self.root:
            if n.lock == 0:
                total += n.tokens
            n = n.parent
        return total

    def child(self, key: str) -> Node | None:
        return self.root.children.get(key)

    def nodes(self) -> Iterator[Node]:
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    # -- locking ---------------------------------------------------------------------------
    def lock(self, node: Node) -> None:
        """`inc_lock_ref`: protect the path root..node."""
        n: Node | None = node
        while n is not None and n is not self.root:
            if n.lock == 0:
                self.evictable_tokens -= n.tokens
            n.lock += 1
            n = n.parent

    def unlock(self, node: Node) -> None:
        """`dec_lock_ref`: release the path root..node."""
        n: Node | None = node
        while n is not None and n is not self.root:
            n.lock -= 1
            assert n.lock >= 0, "lock count below zero"
            if n.lock == 0:
                self.evictable_tokens += n.tokens
            n = n.parent

    def touch(self, node: Node, now_s: float) -> None:
        n: Node | None = node
        while n is not None and n is not self.root:
            n.last_access_s = now_s
            n = n.parent

    def set_kept(self, keys: frozenset[str]) -> None:
        """Pin exactly the root children named in `keys` that are on the GPU."""
        for key in list(self.kept):
            if key not in keys:
                self.unlock(self.kept.pop(key))
        for key in keys:
            node = self.root.children.get(key)
            if key not in self.kept and node is not None and node.on_gpu:
                self.lock(node)
                self.kept[key] = node

    # -- insertion and loading -------------------------------------------------------------
    def insert(self, parent: Node, segments: Sequence[Segment], now_s: float) -> tuple[Node, int]:
        """Insert `segments` below `parent` (a GPU node). Returns (last node, tokens newly
        placed on the GPU). Segments already on the GPU are shared (their duplicate KV is the
        caller's to free); host-only segments are re-materialised from the new KV."""
        node = parent
        added = 0
        for seg in segments:
            child = node.children.get(seg.key)
            if child is None:
                self._seq += 1
                child = Node(seg.key, seg.tokens, node, self._seq)
                node.children[seg.key] = child
                self._to_gpu(child)
                added += seg.tokens
            elif not child.on_gpu:
                self._to_gpu(child)
                added += seg.tokens
            child.last_access_s = now_s
            node = child
        return node, added

    def load_back(self, nodes: Sequence[Node], now_s: float) -> int:
        """Bring host-resident `nodes` (a chain below a GPU node) back to the GPU."""
        loaded = 0
        for n in nodes:
            self._to_gpu(n)
            n.last_access_s = now_s
            loaded += n.tokens
        return loaded

    def _to_gpu(self, node: Node) -> None:
        self.version += 1
        node.on_gpu = True
        self.gpu_tokens += node.tokens
        if node.lock == 0:
            self.evictable_tokens += node.tokens

    # -- eviction --------------------------------------------------------------------------
    def _evictable_leaves(self) -> list[tuple[float, int, Node]]:
        heap = [
            (n.last_access_s, n.seq, n)
            for n in self.nodes()
            if n.on_gpu and n.lock == 0 and n.gpu_child_count() == 0
        ]
        heapq.heapify(heap)
        return heap

    def _push_if_leaf(self, heap: list[tuple[float, int, Node]], parent: Node | None) -> None:
        if (
            parent is not None
            and parent is not self.root
            and parent.lock == 0
            and parent.on_gpu
            and parent.gpu_child_count() == 0
        ):
            heapq.heappush(heap, (parent.last_access_s, parent.seq, parent))

    def evict(self, tokens: int) -> int:
        """Free at least `tokens` GPU tokens by evicting LRU unlocked leaves; returns freed."""
        heap = self._evictable_leaves()
        freed = 0
        while freed < tokens and heap:
            _, _, n = heapq.heappop(heap)
            freed += n.tokens
            parent = n.parent
            self._evict_node(n)
            self._push_if_leaf(heap, parent)
        return freed

    def evictable_before(self, protect: set[int], want: int) -> int:
        """Dry run of `evict(want)`: tokens it frees before it would evict a node whose `id()`
        is in `protect`. Mutates nothing."""
        heap = self._evictable_leaves()
        gone: set[int] = set()
        freed = 0
        while freed < want and heap:
            _, _, n = heapq.heappop(heap)
            if id(n) in protect:
                break
            freed += n.tokens
            gone.add(id(n))
            parent = n.parent
            if (
                parent is not None
                and parent is not self.root
                and parent.lock == 0
                and all(not c.on_gpu or id(c) in gone for c in parent.children.values())
            ):
                heapq.heappush(heap, (parent.last_access_s, parent.seq, parent))
        return freed

    def _evict_node(self, n: Node) -> None:
        self.version += 1
        n.on_gpu = False
        self.gpu_tokens -= n.tokens
        self.evictable_tokens -= n.tokens
        if self.host_capacity_tokens and not n.on_host and self._make_host_room(n.tokens):
            n.on_host = True
            self.host_tokens += n.tokens
        if not n.on_host:
            self._delete_subtree(n)

    def _make_host_room(self, tokens: int) -> bool:
        if tokens > self.host_capacity_tokens:
            return False
        need = self.host_tokens + tokens - self.host_capacity_tokens
        if need <= 0:
            return True
        # SGLang `HiRadixCache.evict_host`: a heap of host-only leaves; a parent whose last
        # child went becomes a leaf and joins it (else a host chain could never be freed).
        victims = [
            (n.last_access_s, n.seq, n)
            for n in self.nodes()
            if n.on_host and not n.on_gpu and not n.children
        ]
        heapq.heapify(victims)
        while need > 0 and victims:
            _, _, v = heapq.heappop(victims)
            need -= v.tokens
            parent = v.parent
            self._delete_subtree(v)
            if parent is not None and parent.on_host and not parent.on_gpu and not parent.children:
                heapq.heappush(victims, (parent.last_access_s, parent.seq, parent))
        return need <= 0

    def _delete_subtree(self, n: Node) -> None:
        """Drop a node that is no longer on the GPU, with its (host-only) descendants."""
        assert not n.on_gpu
        if n.parent is not None:
            n.parent.children.pop(n.key, None)
        stack = [n]
        while stack:
            m = stack.pop()
            if m.on_host:
                self.host_tokens -= m.tokens
                m.on_host = False
            stack.extend(m.children.values())
            m.children = {}
